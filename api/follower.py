"""The API's background work: submit accepted jobs to Dagster, follow their runs, deliver callbacks.

Three duties, each idempotent so a restart simply runs them again:

- submit: every accepted job without a run is submitted over GraphQL, unless a run tagged with
  its version id already exists (the process died between submitting and recording it);
- follow: unfinished jobs read their run's status (one query for all of them) and the stage and
  progress events the run reported since the last look (one incremental read per running run),
  follow Dagster's retries (``dagster/root_run_id``), and on success index the run's asset
  materializations as artifacts;
- deliver: due callbacks from the durable outbox are POSTed, with exponential backoff.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from api.core.jobs import VERSION_TAG, VIDEO_KIND, run_kind
from api.core.steps import STEP_TAG, follow_up_run, follow_ups
from api.dagster_client import (
    WILL_RETRY_TAG,
    DagsterGateway,
    DagsterGatewayError,
    DagsterUnavailable,
    RunInfo,
    RunSubmission,
)
from api.store import ArtifactRecord, JobRecord, Store, backoff_delay
from orchestration.launcher import WORKER_TAG, WorkerError, call_worker
from orchestration.registry import WorkerRegistry
from settings.api import ApiConfig
from shotloom import stages

log = logging.getLogger("shotloom.api")
PRIORITY_TAG = "dagster/priority"
RERENDER_TAG = "shotloom/rerender"
KIND_TAG = "shotloom/kind"  # r2v | merge (the R2V API), v1 | image (the OpenAI dialect)
FILM_ASSET = ("film",)  # the asset key of films (merges, stitched extensions), as GraphQL reads it
STILLS = ("thumbnail", "spritesheet")  # image artifacts recorded beside each video
# Materialization metadata copied into a succeeded job's result (read by both dialects' views).
RESULT_KEYS = (
    "width", "height", "frames", "fps", "duration_s", "has_audio", "seed", "video_mode", "peak_memory_mb",
    # How a shot was sampled (not on a film).
    "num_inference_steps", "guidance_scale", "sampler", "step_cache",
)  # fmt: skip
IMAGE_KIND = "image"
CANCEL_RETRY_S = 5.0

DELIVERY_HEADER = "X-Shotloom-Delivery-Id"
RETRY_GRACE_S = 120.0  # a failed run marked will_retry whose retry never appears is failed after this
NEVER_ENQUEUED_AFTER_S = 10.0  # a NOT_STARTED run this old was created by a submit that was cut short
SUBMIT_REFUSALS = 3  # Dagster refusing a job's run this many times (while reachable) fails the job
SUBMIT_BATCH = 25  # runs per GraphQL document: a burst reaches the queue in few round trips

_RUNNING = {"STARTING", "STARTED", "CANCELING"}
_MOVING = ("STARTING", "STARTED", "CANCELING", "SUCCESS", "FAILURE", "CANCELED")  # not waiting
_FAILED = {"FAILURE", "CANCELED"}


def api_status(run_status: str, stage: str) -> str:
    """Dagster run status -> the r2v spec's status."""
    if run_status == "SUCCESS":
        return "succeeded"
    if run_status in _FAILED:
        return "failed"
    if run_status in _RUNNING or stage not in (stages.QUEUED, stages.RECOVERED):
        return "running"
    return "queued"


@dataclass
class RunState:
    """What a run reported so far (stage times, latest progress) and where its event log was read."""

    cursor: str | None = None
    stage: str | None = None  # the last stage the run entered (its events, in order)
    stage_times: dict[str, float] = field(default_factory=dict)
    progress: dict[str, Any] | None = None


class Follower:
    def __init__(
        self,
        store: Store,
        gateway: DagsterGateway,
        api: ApiConfig,
        registry: WorkerRegistry,
        poll_seconds: float = 0.5,
    ):
        self.store = store
        self.gateway = gateway
        self.api = api
        self.registry = registry  # the workers, as they registered in Dagster's storage
        self.poll_seconds = poll_seconds
        self.wake = threading.Event()  # an accepted job: submit now
        self.follow_wake = threading.Event()  # a worker said a run ended: read the runs now
        self.stopping = threading.Event()
        self.workers: dict[str, dict[str, Any]] = {}  # latest /status of each device worker
        self.counters = {"submitted": 0, "reconciled": 0, "followed_retries": 0, "callbacks_delivered": 0}
        self._threads: list[threading.Thread] = []
        self._failed_seen: dict[str, float] = {}
        self._boot = time.time()
        self._uncertain: set[str] = set()  # versions whose submit raised: a run may exist
        self._refused: dict[str, int] = {}  # version -> times Dagster refused its run
        self._states: dict[str, RunState] = {}  # run id -> what it reported (unfinished runs)
        self._cancel_asked: dict[str, float] = {}  # version -> when its run was last asked to stop
        self._periodic: list[tuple[str, Callable[[], object], float]] = []
        self.started = False

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        loops = (
            ("submit", lambda: self._loop((self.submit_pending,), self.wake)),
            ("follow", lambda: self._loop((self.follow_runs,), self.follow_wake)),
            ("workers", self._every(self.refresh_workers, self.api.workers_refresh_seconds, now=True)),
            ("callbacks", self._callback_loop),
        )
        loops += tuple((name, self._every(duty, seconds)) for name, duty, seconds in self._periodic)
        for name, target in loops:
            t = threading.Thread(target=target, name=f"api-{name}", daemon=True)
            t.start()
            self._threads.append(t)
        self.started = True

    def every(self, name: str, duty: Callable[[], object], seconds: float) -> None:
        """Run ``duty`` on its own thread every ``seconds`` once started (e.g. the job store sweep)."""
        self._periodic.append((name, duty, seconds))

    def _every(self, duty: Callable[[], object], seconds: float, now: bool = False) -> Callable[[], None]:
        """A loop running ``duty`` every ``seconds`` (first at once when ``now``) until stopped."""

        def loop() -> None:
            first = now
            while first or not self.stopping.wait(seconds):
                first = False
                try:
                    duty()
                except Exception as exc:
                    log.warning("%s: %s", getattr(duty, "__name__", duty), exc)

        return loop

    def stop(self) -> None:
        self.stopping.set()
        self.wake.set()
        self.follow_wake.set()
        for t in self._threads:
            t.join(timeout=10)

    def run_ended(self) -> None:
        """A worker finished a run: the runs are read now rather than at the next tick."""
        self.follow_wake.set()

    def poke(self) -> None:
        """A job was accepted: submit it now rather than at the next tick."""
        self.wake.set()

    def _loop(self, duties, pause: threading.Event) -> None:
        """Run ``duties`` every poll interval (or when ``pause`` is set), surviving any error."""
        down_since: float | None = None
        while not self.stopping.is_set():
            for duty in duties:
                try:
                    duty()
                except DagsterUnavailable as exc:  # starting or restarting: jobs wait in the store
                    if down_since is None:
                        down_since = time.monotonic()
                        log.warning("Dagster unavailable, will retry: %s", exc)
                except Exception as exc:  # a locked DB, a bad answer...: next tick
                    log.warning("%s: %s", duty.__name__, exc)
                else:
                    if down_since is not None:
                        log.info("Dagster reachable again after %.1fs", time.monotonic() - down_since)
                        down_since = None
            # A rest of a whole interval after each tick (a worker's nudge ends it: a run ended).
            pause.wait(self.poll_seconds)
            pause.clear()

    def _callback_loop(self) -> None:
        with httpx.Client(timeout=self.api.callback_timeout_seconds) as client:
            while not self.stopping.is_set():
                try:
                    self.deliver_callbacks(client)
                except Exception as exc:
                    log.warning("callbacks: %s", exc)
                self.stopping.wait(0.5)

    # -- submit ---------------------------------------------------------------------------------
    def submit_pending(self) -> None:
        """Submit every accepted job without a run, oldest first, in batches (one GraphQL document
        each: the runs enter Dagster's queue in accept order)."""
        batch: list[tuple[JobRecord, RunSubmission]] = []
        for job in self.store.unsubmitted():
            if self.stopping.is_set():
                return
            submission = self._submission(job)
            if submission is None:
                continue
            batch.append((job, submission))
            if len(batch) == SUBMIT_BATCH:
                self._submit_batch(batch)
                batch = []
        self._submit_batch(batch)

    def _submission(self, job: JobRecord) -> RunSubmission | None:
        """The run to submit for ``job``, or None when it needs none (now)."""
        # Accepted before this process started, or a submit that raised (it may have created
        # the run anyway): look for a run tagged with the version first, never submit twice.
        if job.created_at < self._boot or job.version_id in self._uncertain:
            existing = self.gateway.find_runs_by_tag(VERSION_TAG, job.version_id)
            if not self._drop_never_enqueued(existing):
                return None  # a run may still be on its way into the queue: look again next tick
            existing = [r for r in existing if r.status != "NOT_STARTED"]
            roots = [r for r in existing if _first_of_step(r, 0)]
            if roots:
                self.store.mark_submitted(job.version_id, roots[-1].run_id)
                self._uncertain.discard(job.version_id)
                self.counters["reconciled"] += 1
                log.info("version %s: adopted run %s", job.version_id, roots[-1].run_id)
                return None
        if job.cancel_requested_at is not None:  # cancelled before it reached Dagster
            self.store.update_status(job.version_id, status="cancelled", stage=stages.CANCELED, error=None)
            return None
        return RunSubmission(job.request["job_name"], job.request["run_config"], run_tags(job))

    def _submit_batch(self, batch: list[tuple[JobRecord, RunSubmission]]) -> None:
        if not batch:
            return
        self._uncertain.update(job.version_id for job, _ in batch)
        # DagsterUnavailable propagates: nothing submits now, the loop waits for the webserver.
        try:
            answers: list[str | DagsterGatewayError] = self.gateway.submit_many([s for _, s in batch])
        except DagsterUnavailable:
            raise
        except DagsterGatewayError as exc:
            if len(batch) > 1:  # the document as a whole was refused: find the culprit alone
                for one in batch:
                    self._submit_batch([one])
                return
            answers = [exc]
        for (job, _), answer in zip(batch, answers, strict=True):
            if isinstance(answer, DagsterGatewayError):
                self._refused_run(job, answer)
                continue
            self._refused.pop(job.version_id, None)
            self.store.mark_submitted(job.version_id, answer)
            self._uncertain.discard(job.version_id)
            self.counters["submitted"] += 1
            log.info("version %s: submitted run %s", job.version_id, answer)

    def _refused_run(self, job: JobRecord, exc: DagsterGatewayError) -> None:
        """Dagster answered and refused this run (its config, its job): the jobs behind it still
        go, and after a few refusals the job fails instead of waiting forever."""
        self._refused[job.version_id] = refusals = self._refused.get(job.version_id, 0) + 1
        log.warning("version %s: Dagster refused the run (%d): %s", job.version_id, refusals, exc)
        if refusals >= SUBMIT_REFUSALS:
            record = self.store.update_status(
                job.version_id, status="failed", stage=stages.FAILED, error=f"Dagster refused the run: {exc}"
            )
            self._refused.pop(job.version_id, None)
            self._enqueue_callback(record)

    def _drop_never_enqueued(self, runs: list[RunInfo]) -> bool:
        """A submit cut short (webserver or API killed mid-request) can leave a run created but never
        enqueued: NOT_STARTED forever (monitoring fails it only after its start timeout). Such a run
        is canceled and the job submitted anew. False while one is too young to tell."""
        now = time.time()
        stuck = [r for r in runs if r.status == "NOT_STARTED"]
        if any(now - (r.create_time or now) < NEVER_ENQUEUED_AFTER_S for r in stuck):
            return False
        for r in stuck:
            try:
                self.gateway.terminate(r.run_id, force=True, wait_starting_s=0)
            except Exception as exc:  # it times out on its own; the job goes on with a new run
                log.warning("could not cancel never-enqueued run %s: %s", r.run_id, exc)
            log.info("run %s was created but never enqueued; canceled", r.run_id)
        return True

    # -- follow ---------------------------------------------------------------------------------
    def follow_runs(self) -> None:
        self.cancel_requested()
        versions = self.store.unfinished_runs()
        if not versions:
            return
        # Queued runs have nothing new to say; leaving them out keeps a tick cheap with a long queue
        # (only the jobs whose runs moved are loaded).
        runs = self.gateway.runs(list(versions), statuses=_MOVING)
        # Finished runs first (how soon a job reads as done), then the running ones' events.
        order = sorted(runs.items(), key=lambda item: (not item[1].finished, item[1].create_time or 0))
        for run_id, info in order:
            job = self.store.get(versions[run_id])
            if job is not None and job.status in ("queued", "running") and job.run_id == run_id:
                self._apply(job, info)

    def cancel_requested(self) -> None:
        """Cancel requests are durable: a run whose terminate did not take (the webserver was
        down, the run was still being submitted) is asked again, every few seconds."""
        now, wall = time.monotonic(), time.time()
        for job in self.store.cancel_requested():
            if job.run_id is None or now - self._cancel_asked.get(job.version_id, 0.0) < CANCEL_RETRY_S:
                continue
            if wall - (job.cancel_requested_at or 0.0) < CANCEL_RETRY_S:
                continue  # the request itself asked Dagster just now: ask again only if it did not take
            self._cancel_asked[job.version_id] = now
            try:
                self.gateway.terminate(job.run_id, wait_starting_s=0)
            except Exception as exc:
                log.warning(
                    "version %s: cancel of run %s failed, will retry: %s", job.version_id, job.run_id, exc
                )

    def _apply(self, job: JobRecord, run: RunInfo) -> None:
        if run.status == "SUCCESS":
            self._succeeded(job, run)
            return
        if run.status in _FAILED:
            self._failed(job, run)
            return
        live = self._live(run, job)
        if _step(run):  # a follow-up (media work after the shot): the job is running throughout
            stage, status = job.stage, "running"
        else:
            stage = self._states[run.run_id].stage or stages.QUEUED
            status = api_status(run.status, stage)
        if status != job.status or stage != job.stage or live != (job.live or {}):
            self.store.update_status(job.version_id, status=status, stage=stage, live=live)

    def _run_state(self, run: RunInfo) -> RunState:
        """The run's stage times and progress, read on from the run events seen last time."""
        state = self._states.setdefault(run.run_id, RunState())
        events, state.cursor = self.gateway.engine_events(run.run_id, state.cursor)
        for event in events:
            meta = event.metadata
            stage, at = meta.get(stages.STAGE_EVENT), meta.get(stages.AT_EVENT)
            if isinstance(stage, str):
                state.stage = stage
                if isinstance(at, int | float):
                    state.stage_times[stage] = float(at)
            progress = meta.get(stages.PROGRESS_EVENT)
            if isinstance(progress, str):
                state.progress = json.loads(progress)
        return state

    def _live(self, run: RunInfo, job: JobRecord) -> dict[str, Any]:
        if _step(run):
            # Media work after the shot: its events are not read; the stage times, progress and
            # device worker of the run that made the shot stay as they were.
            return {**(job.live or {}), "run_status": run.status}
        state = self._run_state(run)
        times = {s: state.stage_times[s] for s in stages.ORDER if s in state.stage_times}
        live: dict[str, Any] = {"run_status": run.status, "stage_times": times}
        if state.progress is not None:
            live["progress"] = state.progress
        worker = run.tags.get(WORKER_TAG)
        if worker:
            snap = self.workers.get(worker, {})
            live["worker"] = {
                "name": worker,
                "device": snap.get("device"),
                "boot_id": snap.get("boot_id"),
                "weight_location": snap.get("weight_location"),
                "resources": snap.get("resources"),
            }
        return live

    def _succeeded(self, job: JobRecord, run: RunInfo) -> None:
        made = self._index_artifacts(job, run)
        steps, step = follow_ups(job), _step(run)
        if step < len(steps):
            self._follow_up(job, run, step + 1, steps[step], made)
            return
        base = self.api.base_url()
        artifacts = [a for a in self.store.artifacts_for(job.version_id) if a.kind == VIDEO_KIND]
        result: dict[str, Any] = {"run_id": run.run_id}
        if artifacts:
            # An extension writes its shot, then the film it stitched: the film is the answer.
            main = next((a for a in artifacts if a.role == "film"), artifacts[0])
            result["video_url"] = base + main.url_path
            result["artifact_id"] = main.artifact_id
            for key in RESULT_KEYS:
                if key in main.metadata:
                    result[key] = main.metadata[key]
        live = {**self._live(run, job), "run_status": run.status}
        record = self.store.update_status(
            job.version_id, status="succeeded", stage=stages.SUCCEEDED, error=None, result=result, live=live
        )
        log.info("version %s succeeded (run %s)", job.version_id, run.run_id)
        self._states.pop(run.run_id, None)
        self._enqueue_callback(record)

    def _follow_up(
        self, job: JobRecord, run: RunInfo, step: int, spec: dict[str, Any], made: list[ArtifactRecord]
    ) -> None:
        """Submit the job's next run (or adopt it: submitted before a restart); the job stays
        running, its stage and stage times carried on."""
        live = self._live(run, job)
        live.update(run_status="STARTING", runs=[*live.get("runs", []), run.run_id])  # the runs before
        adopted: list[RunInfo] = []
        if (run.end_time or 0) < self._boot or job.version_id in self._uncertain:
            # An earlier process (or a submit that raised) may have submitted it already.
            runs = self.gateway.find_runs_by_tag(VERSION_TAG, job.version_id)
            adopted = [r for r in runs if _first_of_step(r, step)]
        if adopted:
            run_id = adopted[-1].run_id
        elif job.cancel_requested_at is not None:  # cancelled between two runs: none is started
            record = self.store.update_status(
                job.version_id, status="cancelled", stage=stages.CANCELED, error=None, live=live
            )
            self._states.pop(run.run_id, None)
            self._enqueue_callback(record)
            return
        else:
            shot = next((a for a in made if a.kind == VIDEO_KIND), None)
            if shot is None:
                raise RuntimeError(f"run {run.run_id} of version {job.version_id} wrote no video")
            facts = {**shot.metadata, "path": shot.path, "shot_id": job.shot_id, "version_id": job.version_id}
            job_name, run_config = follow_up_run(spec, facts)
            self._uncertain.add(job.version_id)  # until its run is recorded: look before resubmitting
            try:
                run_id = self.gateway.submit(job_name, run_config, {**run_tags(job), STEP_TAG: str(step)})
            except DagsterUnavailable:
                raise
            except DagsterGatewayError as exc:
                self._refused_run(job, exc)
                return
        self.store.start_step(job.version_id, run_id)
        self._uncertain.discard(job.version_id)
        self.store.update_status(job.version_id, status="running", live=live)
        self._states.pop(run.run_id, None)
        log.info("version %s: step %d, run %s (%s)", job.version_id, step, run_id, spec["job_name"])

    def _index_artifacts(self, job: JobRecord, run: RunInfo) -> list[ArtifactRecord]:
        """Index the files a succeeded run materialized: videos (``path``) and the thumbnail and
        spritesheet made from one (beside it, by the media work after the shot)."""
        artifacts = []
        for mat in self.gateway.materializations(run.run_id):
            meta = mat.metadata
            path = meta.get("path")
            if isinstance(path, str):
                art = self.store.add_artifact(
                    job.version_id,
                    kind=VIDEO_KIND,
                    role="film" if mat.asset_key == FILM_ASSET else "shot",
                    path=path,
                    url_path="/media/" + path,
                    bytes=_int(meta.get("bytes")),
                    sha256=meta.get("sha256"),
                    metadata={
                        k: v
                        for k, v in meta.items()
                        if k not in ("path", "sha256", "bytes") and not k.startswith(STILLS)
                    },
                    shot_id=job.shot_id,
                )
                artifacts.append(art)
            for role in STILLS:
                still = meta.get(role)
                if isinstance(still, str):
                    self.store.add_artifact(
                        job.version_id,
                        kind=IMAGE_KIND,
                        role=role,
                        path=still,
                        url_path="/media/" + still,
                        bytes=_int(meta.get(f"{role}_bytes")),
                        sha256=meta.get(f"{role}_sha256"),
                        metadata={"grid": meta["spritesheet_grid"]} if role == "spritesheet" else {},
                        shot_id=job.shot_id,
                    )
        return artifacts

    def _failed(self, job: JobRecord, run: RunInfo) -> None:
        newer = self._newest_retry(job, run)
        if newer is not None:
            self.store.follow_run(job.version_id, newer.run_id)
            self._states.pop(run.run_id, None)
            self.counters["followed_retries"] += 1
            log.info("version %s: following retry run %s", job.version_id, newer.run_id)
            return
        if run.tags.get(WILL_RETRY_TAG) == "true":
            first = self._failed_seen.setdefault(run.run_id, time.monotonic())
            if time.monotonic() - first < RETRY_GRACE_S:
                return  # the daemon is about to create the retry run
        self._failed_seen.pop(run.run_id, None)
        canceled = run.status == "CANCELED"
        error = run.error_summary() or ("canceled" if canceled else "the run failed")
        live = self._live(run, job)
        cancelled = canceled and job.cancel_requested_at is not None  # a client asked for it
        record = self.store.update_status(
            job.version_id,
            status="cancelled" if cancelled else "failed",
            stage=stages.CANCELED if canceled else stages.FAILED,
            error=None if cancelled else error,
            result={"run_id": run.run_id},
            live=live,
        )
        log.info("version %s failed: %s", job.version_id, error)
        self._states.pop(run.run_id, None)
        self._enqueue_callback(record)

    def _newest_retry(self, job: JobRecord, run: RunInfo) -> RunInfo | None:
        root = job.root_run_id or run.root_run_id or run.run_id
        retries = [r for r in self.gateway.retries_of(root) if r.run_id != run.run_id]
        newer = [r for r in retries if (r.create_time or 0) > (run.create_time or 0)]
        return max(newer, key=lambda r: r.create_time or 0) if newer else None

    # -- workers --------------------------------------------------------------------------------
    def refresh_workers(self) -> None:
        snaps = {}
        for rec in self.registry.records():
            known = {"name": rec.name, "pool": rec.pool, "device": rec.device, "host": rec.host}
            if rec.heartbeat <= 0:  # withdrawn: it stopped cleanly
                snaps[rec.name] = {**known, "state": "stopped"}
                continue
            try:
                snaps[rec.name] = {**known, **call_worker(rec.url, "/status", timeout=2.0)}
            except WorkerError:
                snaps[rec.name] = {**known, "state": "unreachable"}
        self.workers = snaps

    def capabilities(self) -> dict[str, Any] | None:
        """What the loaded model can do, as the first worker that loaded it publishes it."""
        return next((w["capabilities"] for w in self.workers.values() if w.get("capabilities")), None)

    # -- callbacks ------------------------------------------------------------------------------
    def _enqueue_callback(self, job: JobRecord) -> None:
        if job.callback_url:
            self.store.enqueue_callback(
                job.version_id, job.callback_url, callback_payload(job, self.store, self.api)
            )

    def deliver_callbacks(self, client: httpx.Client) -> None:
        for d in self.store.due_callbacks():
            if self.stopping.is_set():
                return
            try:
                resp = client.post(d.url, json=d.payload, headers={DELIVERY_HEADER: d.delivery_id})
                ok, error = resp.is_success, f"HTTP {resp.status_code}"
            except httpx.HTTPError as exc:
                ok, error = False, f"{type(exc).__name__}: {exc}"
            attempts = d.attempts + 1
            limit = self.api.callback_max_attempts
            if ok:
                self.store.record_attempt(d.delivery_id, True)
                self.counters["callbacks_delivered"] += 1
            elif limit and attempts >= limit:
                self.store.record_attempt(d.delivery_id, False, error)
                log.warning(
                    "callback %s for %s gave up after %d attempts: %s",
                    d.delivery_id,
                    d.version_id,
                    attempts,
                    error,
                )
            else:
                delay = backoff_delay(attempts, self.api.callback_backoff_seconds)
                self.store.record_attempt(d.delivery_id, False, error, time.time() + delay)


def callback_payload(job: JobRecord, store: Store, api: ApiConfig) -> dict[str, Any]:
    """The one POST a job's callback gets (r2v spec "Callbacks and errors")."""
    base = api.base_url()
    result = job.result or {}
    artifacts = [
        {"artifact_id": a.artifact_id, "url": base + a.url_path, "role": a.role, "sha256": a.sha256}
        for a in store.artifacts_for(job.version_id)
    ]
    payload: dict[str, Any] = {
        "kind": job.kind,
        "work_id": job.work_id,
        "job_id": job.job_id,
        "remote_task_id": job.version_id,
        "task_id": job.version_id,
        "version_id": job.version_id,
        "status": "failed" if job.status == "cancelled" else job.status,  # the r2v spec's four
        "status_url": f"{base}/version/{job.version_id}",
    }
    if job.callback_context is not None:
        payload["callback_context"] = job.callback_context
    if job.status in ("failed", "cancelled"):
        payload["error"] = job.error or job.status
    elif job.kind == "merge":
        payload["result"] = {"video_url": result.get("video_url"), "artifacts": artifacts}
    else:
        payload.update(shot_id=job.shot_id, video_url=result.get("video_url"), artifacts=artifacts)
    if job.kind == "r2v" and "shot_id" not in payload:
        payload["shot_id"] = job.shot_id
    return payload


def run_tags(job: JobRecord) -> dict[str, str]:
    """The tags every run of ``job`` carries."""
    tags = {
        VERSION_TAG: job.version_id,
        "shotloom/work_id": job.work_id,
        KIND_TAG: run_kind(job),
        "user": job.submitter or "api",
    }
    if job.shot_id:
        tags["shotloom/shot_id"] = job.shot_id
    if job.priority:
        tags[PRIORITY_TAG] = str(job.priority)  # Dagster's queue order (higher first)
    if "rerender" in job.request:  # why this run exists: an operator filters re-renders by it
        tags[RERENDER_TAG] = job.request["rerender"].get("reason") or "rerender"
    return tags


def _step(run: RunInfo) -> int:
    """Which of its job's runs this is: 0 the first, n the n-th follow-up."""
    return int(run.tags.get(STEP_TAG) or 0)


def _first_of_step(run: RunInfo, step: int) -> bool:
    """The run a step started with (not a retry of it)."""
    return _step(run) == step and (not run.root_run_id or run.root_run_id == run.run_id)


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
