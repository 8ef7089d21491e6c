"""``GET /metrics``: the service in Prometheus' text format (``prometheus_client``), behind the API
key when keys are set.

Two kinds of series, so that several API processes (or hosts) on one store never count a job
twice:

- events, counted by the process whose store write made them so (:mod:`api.store.events`: the
  insert that accepted a job, the update that finished it, a callback attempt) and this process's
  HTTP requests: counters and histograms that Prometheus sums over the processes it scrapes
  (``sum without (instance)``); they start from zero when a process starts, as counters do;
- state, read at each scrape from the store and the workers' registry (jobs queued and running,
  the callback backlog, each worker's state, memory and weights): the same from every process, a
  fact rather than a count, so dashboards take ``max without (instance)``.

Stage names are the ones ``GET /version/{id}`` reports (``conditioning``, ``inferring`` (the
denoise), ``decoding``, ``writing``, ``merging``...).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Depends
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from api.background.workers import READY_STATES, expected_workers
from api.core.timing import stage_durations
from api.store.jobs import started_at
from shotloom import stages

if TYPE_CHECKING:
    from api.core.records import JobRecord
    from api.store import CallbackDelivery, Store

# Which pool runs each kind of job's first run.
POOL_OF_KIND = {"r2v": "device", "merge": "media"}
STAGE_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
STEP_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
HTTP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10, 30)


class ServiceMetrics:
    """This process's registry: the event series, fed by the store's events and the HTTP
    edge (api.polls), and a collector that reads the state series at each scrape."""

    def __init__(
        self,
        store: Store,
        workers: Callable[[], Mapping[str, Mapping[str, Any]]],
        configured_workers: Callable[[], Mapping[str, list[str]]],
    ):
        """``workers``: each registered worker's latest status; ``configured_workers``: this host's
        configured workers by pool (``device``, ``media``)."""
        self.registry = CollectorRegistry()
        self.accepted = Counter(
            "shotloom_jobs_accepted", "Jobs accepted.", ["kind", "dialect"], registry=self.registry
        )
        self.finished = Counter(
            "shotloom_jobs_finished",
            "Jobs finished, by final status.",
            ["kind", "dialect", "status"],
            registry=self.registry,
        )
        self.job_seconds = Histogram(
            "shotloom_job_duration_seconds",
            "A finished job's time from its first stage past the queue to its end.",
            ["kind", "status"],
            buckets=STAGE_BUCKETS,
            registry=self.registry,
        )
        self.stage_seconds = Histogram(
            "shotloom_stage_duration_seconds",
            "Time finished jobs spent in each stage (queued and waiting_for_memory are waits).",
            ["kind", "stage"],
            buckets=STAGE_BUCKETS,
            registry=self.registry,
        )
        self.step_seconds = Histogram(
            "shotloom_denoise_step_seconds",
            "Seconds per denoise step of succeeded shots (the inferring stage over its steps).",
            buckets=STEP_BUCKETS,
            registry=self.registry,
        )
        self.deliveries = Counter(
            "shotloom_callback_deliveries",
            "Callback delivery attempts, by outcome (delivered, retrying, gave_up).",
            ["outcome"],
            registry=self.registry,
        )
        self.http_seconds = Histogram(
            "shotloom_http_request_duration_seconds",
            "HTTP requests served by this process, by route template.",
            ["method", "route", "status"],
            buckets=HTTP_BUCKETS,
            registry=self.registry,
        )
        self._http_children: dict[tuple[str, str, int], Any] = {}
        self.registry.register(StateCollector(store, workers, configured_workers))
        self.store = store
        store.events.add(self)

    def close(self) -> None:
        self.store.events.remove(self)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    # -- the store's events (api.store.events.StoreObserver) -----------------------------------------
    def job_accepted(self, job: JobRecord) -> None:
        self.accepted.labels(job.kind, job.dialect).inc()

    def job_finished(self, job: JobRecord) -> None:
        self.finished.labels(job.kind, job.dialect, job.status).inc()
        live = job.live
        if live is None or not live.stage_times:
            return  # finished before any run reported (cancelled in the queue, refused)
        durations = stage_durations(live.stage_times, job.finished_at)
        for stage, seconds in durations.items():
            self.stage_seconds.labels(job.kind, stage).observe(seconds)
        started = started_at(live)
        if started is not None and job.finished_at is not None:
            self.job_seconds.labels(job.kind, job.status).observe(max(0.0, job.finished_at - started))
        steps = job.result.num_inference_steps if job.result is not None else None
        if job.status == "succeeded" and steps and stages.INFERRING in durations:
            self.step_seconds.observe(durations[stages.INFERRING] / steps)

    def delivery_attempted(self, delivery: CallbackDelivery) -> None:
        outcome = {"delivered": "delivered", "pending": "retrying"}.get(delivery.status, "gave_up")
        self.deliveries.labels(outcome).inc()

    # -- HTTP (api.polls.PollFastPath times every request) ------------------------------------------
    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        key = (method, route, status)
        child = self._http_children.get(key)
        if child is None:  # once a label set: labels() validates and locks, on the pollers' path
            child = self._http_children[key] = self.http_seconds.labels(method, route, str(status))
        child.observe(seconds)


class StateCollector(Collector):
    """The state series, read at each scrape (the same from every API process)."""

    def __init__(
        self,
        store: Store,
        workers: Callable[[], Mapping[str, Mapping[str, Any]]],
        configured_workers: Callable[[], Mapping[str, list[str]]],
    ):
        self.store, self.workers, self.configured_workers = store, workers, configured_workers

    def collect(self) -> Iterable[GaugeMetricFamily]:
        jobs = GaugeMetricFamily(
            "shotloom_jobs", "Jobs queued and running now, by kind and the pool that runs them.",
            labels=["kind", "pool", "status"],
        )  # fmt: skip
        for kind, pool in POOL_OF_KIND.items():
            counts = self.store.counts_by_status(kind)  # type: ignore[arg-type]
            for status in ("queued", "running"):
                jobs.add_metric([kind, pool, status], counts[status])
        yield jobs
        yield GaugeMetricFamily(
            "shotloom_callback_backlog", "Callbacks waiting to be delivered (the outbox).",
            value=self.store.callback_backlog(),
        )  # fmt: skip
        yield from self._workers()

    def _workers(self) -> Iterable[GaugeMetricFamily]:
        up = GaugeMetricFamily("shotloom_worker_up", "1 when the worker is ready (idle or busy).",
                               labels=["worker", "pool"])  # fmt: skip
        busy = GaugeMetricFamily(
            "shotloom_worker_busy", "1 while the worker runs a job.", labels=["worker", "pool"]
        )
        memory = GaugeMetricFamily(
            "shotloom_worker_memory_bytes",
            "The worker's memory: its device's free and used bytes (CUDA), its own resident set (rss).",
            labels=["worker", "memory"],
        )
        weights = GaugeMetricFamily(
            "shotloom_worker_weights", "Where the worker's weights are (1 on the current location).",
            labels=["worker", "location"],
        )  # fmt: skip
        snaps = self.workers()
        # The workers /health lists: configured here or registered on any host.
        listed = [
            (name, pool)
            for pool, configured in self.configured_workers().items()
            for name in expected_workers(snaps, pool, configured)
        ]
        for name, pool in listed:
            snap = snaps.get(name, {})
            state = snap.get("state")
            up.add_metric([name, pool], 1 if state in READY_STATES else 0)
            busy.add_metric([name, pool], 1 if state == "busy" else 0)
            resources = snap.get("resources") or {}
            if "gpu_free_bytes" in resources and "gpu_total_bytes" in resources:
                free = resources["gpu_free_bytes"]
                memory.add_metric([name, "device_free"], free)
                memory.add_metric([name, "device_used"], resources["gpu_total_bytes"] - free)
            if "rss_bytes" in resources:
                memory.add_metric([name, "rss"], resources["rss_bytes"])
            if pool == "device" and snap.get("weight_location"):
                weights.add_metric([name, snap["weight_location"]], 1)
        yield from (up, busy, memory, weights)


def metrics_router(metrics: ServiceMetrics, submitter: Callable[..., Any]) -> APIRouter:
    router = APIRouter(tags=["operator"])

    @router.get(
        "/metrics",
        dependencies=[Depends(submitter)],
        response_class=Response,
        responses={200: {"content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}},
                         "description": "Prometheus text exposition format."}},
    )  # fmt: skip
    def get_metrics() -> Response:
        """The service's metrics in Prometheus' text format (see the README's scrape config)."""
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    return router
