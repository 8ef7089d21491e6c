"""Following runs: every unfinished job reads its run's status (one query for all of them) and the
stage and progress events the run reported since the last look (one incremental read per running
run), follows Dagster's retries (``dagster/root_run_id``) and a job's follow-up runs, and on
success indexes the run's asset materializations as artifacts and records the job's result."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from api.background.callbacks import Callbacks
from api.background.submitter import LaunchInFlight, Submitter
from api.background.workers import WorkerStatuses
from api.core.jobs import VIDEO_KIND
from api.core.records import ArtifactRecord, FollowUp, JobRecord, media_url_path
from api.core.steps import follow_up_run, follow_ups
from api.dagster import Gateway, RunInfo
from api.store import Store
from contracts import events, tags
from contracts.outputs import RESULT_KEYS, VideoOutput, read_stills
from settings.api import ApiConfig
from shotloom import stages

log = logging.getLogger("shotloom.api")
FILM_ASSET = ("film",)  # the asset key of films (merges, stitched extensions), as GraphQL reads it
IMAGE_KIND = "image"
CANCEL_RETRY_S = 5.0
RETRY_GRACE_S = 120.0  # a failed run marked will_retry whose retry never appears is failed after this

_RUNNING = {"STARTING", "STARTED", "CANCELING"}
_MOVING = ("STARTING", "STARTED", "CANCELING", "SUCCESS", "FAILURE", "CANCELED")  # not waiting
_FAILED = {"FAILURE", "CANCELED"}
_ENDING_STAGE = {"SUCCESS": stages.SUCCEEDED, "FAILURE": stages.FAILED, "CANCELED": stages.CANCELED}


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
    progress: events.Progress | None = None


class Tracker:
    def __init__(
        self,
        store: Store,
        gateway: Gateway,
        api: ApiConfig,
        submitter: Submitter,
        callbacks: Callbacks,
        workers: WorkerStatuses,
        boot: float,
    ):
        self.store = store
        self.gateway = gateway
        self.api = api
        self.submitter = submitter
        self.callbacks = callbacks
        self.workers = workers
        self.boot = boot
        self.wake = threading.Event()  # a worker said a run ended: read the runs now
        self.counters = {"followed_retries": 0}
        self._failed_seen: dict[str, float] = {}
        self._states: dict[str, RunState] = {}  # run id -> what it reported (unfinished runs)
        self._cancel_asked: dict[str, float] = {}  # version -> when its run was last asked to stop

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
        if tags.run_step(run.tags):  # a follow-up (media work after the shot): the job is running throughout
            stage, status = job.stage, "running"
        else:
            stage = self._states[run.run_id].stage or stages.QUEUED
            status = api_status(run.status, stage)
        if status != job.status or stage != job.stage or live != (job.live.as_json() if job.live else {}):
            self.store.update_status(job.version_id, status=status, stage=stage, live=live)

    def _run_state(self, run: RunInfo) -> RunState:
        """The run's stage times and progress, read on from the run events seen last time."""
        state = self._states.setdefault(run.run_id, RunState())
        read, state.cursor = self.gateway.engine_events(run.run_id, state.cursor)
        for event in map(events.read_event, (e.metadata for e in read)):
            if event.stage is not None:
                state.stage = event.stage
                if event.at is not None:
                    state.stage_times[event.stage] = event.at
            if event.progress is not None:
                state.progress = event.progress
        return state

    def _live(self, run: RunInfo, job: JobRecord) -> dict[str, Any]:
        if tags.run_step(run.tags):
            # Media work after the shot: its events are not read; the stage times, progress and
            # device worker of the run that made the shot stay as they were.
            return {**(job.live.as_json() if job.live else {}), "run_status": run.status}
        state = self._run_state(run)
        ending = _ENDING_STAGE.get(run.status)
        if ending is not None and ending not in state.stage_times and run.end_time:
            # The worker stamps a run's last stage after Dagster records its end: one read between
            # the two would leave the job without it for good (its follow-ups' events are not read).
            state.stage_times[ending] = run.end_time
        times = {s: state.stage_times[s] for s in stages.ORDER if s in state.stage_times}
        live: dict[str, Any] = {"run_status": run.status, "stage_times": times}
        if state.progress is not None:
            live["progress"] = state.progress.as_dict()
        worker = run.tags.get(tags.WORKER_TAG)
        if worker:
            snap = self.workers.get(worker)
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
        steps, step = follow_ups(job), tags.run_step(run.tags)
        if step < len(steps):
            self._follow_up(job, run, step + 1, steps[step], made)
            return
        artifacts = [a for a in self.store.artifacts_for(job.version_id) if a.kind == VIDEO_KIND]
        result: dict[str, Any] = {"run_id": run.run_id}
        if artifacts:
            # An extension writes its shot, then the film it stitched: the film is the answer.
            main = next((a for a in artifacts if a.role == "film"), artifacts[0])
            result["video_path"] = main.path  # its URL is built when a view is rendered
            result["artifact_id"] = main.artifact_id
            for key in RESULT_KEYS:
                if key in main.metadata:
                    result[key] = main.metadata[key]
        live = {**self._live(run, job), "run_status": run.status}
        self.store.update_status(
            job.version_id,
            status="succeeded",
            stage=stages.SUCCEEDED,
            error=None,
            result=result,
            live=live,
            callback=self.callbacks.payload,
        )
        log.info("version %s succeeded (run %s)", job.version_id, run.run_id)
        self._states.pop(run.run_id, None)

    def _follow_up(
        self, job: JobRecord, run: RunInfo, step: int, spec: FollowUp, made: list[ArtifactRecord]
    ) -> None:
        """Submit the job's next run (or adopt it: submitted before a restart); the job stays
        running, its stage and stage times carried on."""
        live = self._live(run, job)
        live.update(run_status="STARTING", runs=[*live.get("runs", []), run.run_id])  # the runs before
        try:
            run_id = self.submitter.submitted_follow_up(job, step, run.end_time or 0)
        except LaunchInFlight as exc:
            log.info("%s: looked again next tick", exc)
            return
        if run_id is None and job.cancel_requested_at is not None:  # cancelled between two runs
            self.store.update_status(
                job.version_id,
                status="cancelled",
                stage=stages.CANCELED,
                error=None,
                live=live,
                callback=self.callbacks.payload,
            )
            self._states.pop(run.run_id, None)
            return
        if run_id is None:
            shot = next((a for a in made if a.kind == VIDEO_KIND), None)
            if shot is None:
                raise RuntimeError(f"run {run.run_id} of version {job.version_id} wrote no video")
            facts = {**shot.metadata, "path": shot.path, "shot_id": job.shot_id, "version_id": job.version_id}
            job_name, run_config = follow_up_run(spec, facts)
            run_id = self.submitter.submit_follow_up(job, step, job_name, run_config)
            if run_id is None:
                return  # refused: asked again next tick
        self.store.start_step(job.version_id, run_id)
        self.submitter.recorded(job.version_id)
        self.store.update_status(job.version_id, status="running", live=live)
        self._states.pop(run.run_id, None)
        log.info("version %s: step %d, run %s (%s)", job.version_id, step, run_id, spec.job_name)

    def _index_artifacts(self, job: JobRecord, run: RunInfo) -> list[ArtifactRecord]:
        """Index the files a succeeded run materialized: videos and the thumbnail and spritesheet
        made from one (beside it, by the media work after the shot)."""
        artifacts = []
        for mat in self.gateway.materializations(run.run_id):
            video = VideoOutput.read(mat.metadata)
            if video is not None:
                art = self.store.add_artifact(
                    job.version_id,
                    kind=VIDEO_KIND,
                    role="film" if mat.asset_key == FILM_ASSET else "shot",
                    path=video.path,
                    url_path=media_url_path(video.path),
                    bytes=video.bytes,
                    sha256=video.sha256,
                    metadata=video.facts(),
                    shot_id=job.shot_id,
                )
                artifacts.append(art)
            for still in read_stills(mat.metadata):
                self.store.add_artifact(
                    job.version_id,
                    kind=IMAGE_KIND,
                    role=still.role,
                    path=still.path,
                    url_path=media_url_path(still.path),
                    bytes=still.bytes,
                    sha256=still.sha256,
                    metadata={"grid": still.grid} if still.grid is not None else {},
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
        if run.tags.get(tags.WILL_RETRY_TAG) == "true":
            first = self._failed_seen.setdefault(run.run_id, time.monotonic())
            if time.monotonic() - first < RETRY_GRACE_S:
                return  # the daemon is about to create the retry run
        self._failed_seen.pop(run.run_id, None)
        canceled = run.status == "CANCELED"
        error = run.error_summary() or ("canceled" if canceled else "the run failed")
        live = self._live(run, job)
        cancelled = canceled and job.cancel_requested_at is not None  # a client asked for it
        self.store.update_status(
            job.version_id,
            status="cancelled" if cancelled else "failed",
            stage=stages.CANCELED if canceled else stages.FAILED,
            error=None if cancelled else error,
            result={"run_id": run.run_id},
            live=live,
            callback=self.callbacks.payload,
        )
        log.info("version %s failed: %s", job.version_id, error)
        self._states.pop(run.run_id, None)

    def _newest_retry(self, job: JobRecord, run: RunInfo) -> RunInfo | None:
        root = job.root_run_id or run.root_run_id or run.run_id
        retries = [r for r in self.gateway.retries_of(root) if r.run_id != run.run_id]
        newer = [r for r in retries if (r.create_time or 0) > (run.create_time or 0)]
        return max(newer, key=lambda r: r.create_time or 0) if newer else None
