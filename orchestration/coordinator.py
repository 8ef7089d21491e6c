"""The run queue: Dagster's QueuedRunCoordinator with a sub-second dequeue interval, and the
operator's queue control (pause intake to the devices, change a queued run's priority).

A job's step is submitted once, whatever happens to the launch: a launch whose answer was lost (the
webserver waiting for its storage past the client's timeout) is looked up and sent again, and the
first one may land after that. As a run is submitted (in the webserver),
:func:`cancel_if_duplicate` cancels, unrun, a run that starts a step an earlier run of the same job
already started, tagged with that run's id, which the API then follows instead.

The stock coordinator takes whole seconds, and a run submitted to idle workers waits on
average half an interval plus one daemon iteration before it is launched: with 1 s that
was the largest piece of the per-run orchestration overhead (bench/scheduler.py). The
stock daemon's interval loop sleeps in 0.5 s slices; ``orchestration.daemon`` (what server.py
runs) waits in shorter ones, so intervals below 0.5 s take effect.

The daemon asks for the queue's config at every dequeue: that is where queue control applies.
The limits of the two pools are the workers alive in the shared registry right now (on every host:
one run per free device, whatever host it is on); paused, device runs get a limit of 0 (they stay
queued; merges still go); a priority change sets ``dagster/priority`` on the queued run. Each is
recorded as an event on the runs it affects.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any

from dagster import DagsterInstance, DagsterRunStatus, Field, Float, RunsFilter, StringSource
from dagster._config.config_schema import UserConfigSchema
from dagster._core.run_coordinator.base import SubmitRunContext
from dagster._core.run_coordinator.queued_run_coordinator import QueuedRunCoordinator, RunQueueConfig
from dagster._core.storage.dagster_run import DagsterRun
from dagster._core.storage.runs.schema import RunsTable, RunTagsTable
from dagster._core.storage.runs.sql_run_storage import SqlRunStorage
from sqlalchemy import func, select

from contracts.tags import (
    DUPLICATE_OF_TAG,
    GPU_TAG,
    POOL_TAGS,
    PRIORITY_TAG,
    VERSION_TAG,
    run_step,
    starts_step,
)
from orchestration.queue_control import QueueControl
from orchestration.registry import WorkerRegistry
from orchestration.storage import DEFAULT_PATIENCE_S, patiently

# A run entering or leaving these is what can change a dequeue's outcome.
_WATCHED = (
    DagsterRunStatus.QUEUED,
    DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
    DagsterRunStatus.CANCELING,
)


@dataclass(frozen=True)
class QueueLook:
    key: Hashable  # differs whenever the queue moved
    startable: bool  # a dequeue now could start a run or apply an operator's request


class DeviceRunCoordinator(QueuedRunCoordinator):
    def __init__(
        self,
        dequeue_interval_seconds: float | None = None,
        state_dir: str | None = None,
        heartbeat_timeout_seconds: float | None = None,
        storage_outage_seconds: float = DEFAULT_PATIENCE_S,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self._control = QueueControl(state_dir) if state_dir else None
        self._heartbeat_timeout = heartbeat_timeout_seconds  # None: the YAML's limits as they are
        self._storage_patience = storage_outage_seconds
        self._was_paused: bool | None = None
        self._limits: dict[str, int] = {}  # pool tag -> limit, as of the last dequeue
        self._told_paused: set[str] = set()  # queued runs told about the current pause
        if dequeue_interval_seconds is not None:
            if dequeue_interval_seconds <= 0:
                raise ValueError(f"dequeue_interval_seconds must be > 0, got {dequeue_interval_seconds}")
            self._dequeue_interval_seconds = float(dequeue_interval_seconds)  # type: ignore[assignment]

    def submit_run(self, context: SubmitRunContext) -> DagsterRun:
        """Queue the run (or cancel a duplicate). Dagster fails a run whose submission raised, so
        the storage going away meanwhile is waited out (each part is safe to do again: a run already
        queued is not queued twice)."""
        run = context.dagster_run

        def submit() -> DagsterRun:
            if cancel_if_duplicate(self._instance, run) is None:
                return super(DeviceRunCoordinator, self).submit_run(context)
            return self._instance.get_run_by_id(run.run_id) or run

        what = f"Dagster's storage unavailable queueing run {run.run_id}"
        return patiently(submit, self._storage_patience, what)

    @property
    def dequeue_interval_seconds(self) -> float:  # type: ignore[override]
        return self._dequeue_interval_seconds

    def get_run_queue_config(self) -> RunQueueConfig:
        config = self._queue_config()
        self._limits = {limit["key"]: limit["limit"] for limit in config.tag_concurrency_limits}
        return config

    def _queue_config(self) -> RunQueueConfig:
        config = super().get_run_queue_config()
        if self.has_instance and self._heartbeat_timeout is not None:
            config = config._replace(tag_concurrency_limits=self._live_limits(config.tag_concurrency_limits))
        if self._control is None or not self.has_instance:
            return config
        self._apply_priorities()
        self._record_notes()
        paused = self._control.paused()
        if (paused is not None) != bool(self._was_paused):
            self._record_pause(paused)
            self._was_paused = paused is not None
        if paused is None:
            return config
        self._record_pause(paused)  # runs queued since the pause began are told too
        limits = [dict(limit) for limit in config.tag_concurrency_limits if limit.get("key") != GPU_TAG]
        return config._replace(tag_concurrency_limits=[*limits, {"key": GPU_TAG, "limit": 0}])

    def queue_look(self) -> QueueLook | None:
        """What could make a dequeue launch a run, looked at cheaply (one indexed query, one
        directory listing): per pool, its queued runs (how many, the newest) and its runs in
        progress; and the operator's queue requests. The daemon dequeues again when this changed
        and a run could start (a pool with runs queued below its limit as of the last dequeue,
        or a request to apply), rather than at its next interval. None where the run storage is
        not SQL (then only the interval counts)."""
        storage = self._instance.run_storage
        if not isinstance(storage, SqlRunStorage):
            return None
        query = (
            select(RunsTable.c.status, RunTagsTable.c.key, func.count(), func.max(RunsTable.c.id))
            .select_from(RunsTable.join(RunTagsTable, RunsTable.c.run_id == RunTagsTable.c.run_id))
            .where(
                RunsTable.c.status.in_([s.value for s in _WATCHED]),
                RunTagsTable.c.key.in_(list(POOL_TAGS.values())),
            )
            .group_by(RunsTable.c.status, RunTagsTable.c.key)
        )
        with storage.connect() as conn:
            rows = conn.execute(query).all()
        pools: dict[str, list[int]] = {}  # tag -> [queued, newest queued, in progress]
        for status, tag, count, newest in rows:
            pool = pools.setdefault(tag, [0, 0, 0])
            if status == DagsterRunStatus.QUEUED.value:
                pool[0], pool[1] = count, newest
            else:
                pool[2] += count
        startable = any(
            queued and busy < self._limits.get(tag, busy + 1) for tag, (queued, _, busy) in pools.items()
        )
        control = self._control.fingerprint() if self._control else (False, ())
        pending = bool(control[1]) or control[0] != bool(self._was_paused)
        key = (tuple(sorted((tag, *pool) for tag, pool in pools.items())), control)
        return QueueLook(key, startable or pending)

    def _live_limits(self, limits) -> list[dict[str, Any]]:
        """One slot per worker alive in the registry, per pool (a pool's tag not in the YAML's
        limits is left alone: no such pool here)."""
        registry = WorkerRegistry(self._instance.run_storage, self._heartbeat_timeout)
        alive = [r for r in registry.records() if registry.alive(r)]
        counts = {tag: sum(r.pool == pool for r in alive) for pool, tag in POOL_TAGS.items()}
        return [
            {**limit, "limit": counts[limit["key"]]} if limit.get("key") in counts else dict(limit)
            for limit in limits
        ]

    def _queued_device_runs(self):
        runs = self._instance.get_runs(RunsFilter(statuses=[DagsterRunStatus.QUEUED]))
        return [r for r in runs if GPU_TAG in r.tags]

    def _apply_priorities(self) -> None:
        for run_id, request, path in self._control.priority_requests():
            run = self._instance.get_run_by_id(run_id)
            if run is not None and run.status == DagsterRunStatus.QUEUED:
                priority = int(request["priority"])
                self._instance.add_run_tags(run_id, {PRIORITY_TAG: str(priority)})
                self._instance.report_engine_event(
                    f"Queue priority set to {priority} by {request.get('by', 'an operator')}", run
                )
            path.unlink(missing_ok=True)

    def _record_notes(self) -> None:
        for run_id, message, path in self._control.notes():
            run = self._instance.get_run_by_id(run_id)
            if run is not None:
                self._instance.report_engine_event(message, run)
            path.unlink(missing_ok=True)

    def _record_pause(self, paused: dict[str, Any] | None) -> None:
        """Tell each queued device run once that intake is paused, and, on resume, that it resumed."""
        if self._was_paused is None and paused is None:
            return  # the daemon started with intake running: nothing changed
        if paused is None:
            for run in self._queued_device_runs():
                self._instance.report_engine_event("Intake to the devices resumed", run)
            self._told_paused.clear()
            return
        by = paused.get("by", "an operator")
        message = f"Intake to the devices paused by {by}: this run waits in the queue"
        for run in self._queued_device_runs():
            if run.run_id not in self._told_paused:
                self._instance.report_engine_event(message, run)
                self._told_paused.add(run.run_id)

    @classmethod
    def from_config_value(cls, inst_data: Any, config_value: Mapping[str, Any]) -> DeviceRunCoordinator:
        coordinator = super().from_config_value(inst_data, config_value)
        if config_value.get("state_dir"):
            coordinator._control = QueueControl(config_value["state_dir"])
        coordinator._heartbeat_timeout = config_value.get("heartbeat_timeout_seconds")
        coordinator._storage_patience = config_value.get("storage_outage_seconds", DEFAULT_PATIENCE_S)
        return coordinator

    @classmethod
    def config_type(cls) -> UserConfigSchema:
        schema: Mapping[str, Any] = super().config_type()  # type: ignore[assignment]
        return {
            **schema,
            "dequeue_interval_seconds": Field(
                Float,
                is_required=False,
                description="How often the daemon checks the queue (seconds; may be fractional).",
            ),
            "state_dir": Field(
                StringSource,
                is_required=False,
                description="The server's state dir: queue control requests live under <state_dir>/queue.",
            ),
            "heartbeat_timeout_seconds": Field(
                Float,
                is_required=False,
                description="Pool limits follow the workers alive in the registry (silent this long: dead).",
            ),
            "storage_outage_seconds": Field(
                Float,
                is_required=False,
                description="How long a submission waits for Dagster's storage while it cannot take "
                "writes (a submission that raised would fail its run).",
            ),
        }


def cancel_if_duplicate(instance: DagsterInstance, run: DagsterRun) -> str | None:
    """Cancel ``run``, unrun, when an earlier run (by storage order) starts the same step of the
    same job and was not canceled; answers that run's id (tagged on ``run``), else None. Two
    launches landing at once agree on which one stays."""
    version = run.tags.get(VERSION_TAG)
    step = run_step(run.tags)
    if version is None or not starts_step(run.tags, run.root_run_id, run.run_id, step):
        return None
    records = instance.get_run_records(RunsFilter(tags={VERSION_TAG: version}))
    mine = next((r.storage_id for r in records if r.dagster_run.run_id == run.run_id), None)
    if mine is None:
        return None
    earlier = [
        r
        for r in records
        if r.storage_id < mine
        and r.dagster_run.status != DagsterRunStatus.CANCELED
        and starts_step(r.dagster_run.tags, r.dagster_run.root_run_id, r.dagster_run.run_id, step)
    ]
    if not earlier:
        return None
    original = min(earlier, key=lambda r: r.storage_id).dagster_run.run_id
    instance.add_run_tags(run.run_id, {DUPLICATE_OF_TAG: original})
    instance.report_run_canceled(
        run,
        message=f"Not run: a second submission of step {step} of version {version}; run {original} has it.",
    )
    return original
