"""What the job service's intake and lifecycle share: the store and the server's config, the rule
book, idempotent replays, queue limits, the input boundary, and how long jobs take."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from api.core.disk import Volume, volumes
from api.core.errors import Conflict, InvalidField, NoRoom, QueueFull, Unavailable
from api.core.inputs import InputAsset, InputError, Role, copy_into_assets, resolve_resource
from api.core.outcome import callback_payload
from api.core.references import InProcessReferences, ReferenceTaker
from api.core.rules import RuleBook
from api.core.sampling import SamplerFor, SamplingRule, dit_calls
from api.core.specs import InputRef
from api.core.timing import stage_durations, stage_medians
from api.store import (
    IdempotencyConflict,
    JobKind,
    JobRecord,
    NewJob,
    Store,
)
from orchestration.queue_control import QueueControl
from settings.api import ApiConfig
from shotloom import stages
from shotloom.capabilities import Capabilities
from shotloom.config import Defaults, Performance
from shotloom.media_store import LocalMediaStore

# Every submitted run carries it: reconcile finds runs by it (defined beside the other run tags).
VIDEO_KIND = "video"  # artifacts are indexed by media kind; role says shot or film
DURATION_SAMPLES = 50  # finished jobs whose durations give Retry-After and ETAs
RETRY_AFTER_UNKNOWN_S = 60  # before the first job has finished
RETRY_AFTER_MIN_S = 2


@dataclass(frozen=True)
class Accepted:
    job: JobRecord
    created: bool  # False: an idempotent replay


def capabilities_from(published: dict[str, Any] | None) -> Capabilities | None:
    """The workers publish capabilities as JSON (lists): back to the engine's type."""
    if not published:
        return None
    return Capabilities(**{k: tuple(v) if isinstance(v, list) else v for k, v in published.items()})


class SharedSteps:
    """The job service's state and the steps both of its halves take (see :class:`JobService`)."""

    def __init__(
        self,
        store: Store,
        api: ApiConfig,
        state_dir: Path,
        media_root: Path,
        on_accept: Callable[[], None] | None = None,
        capabilities: Callable[[], dict[str, Any] | None] = lambda: None,
        defaults: Defaults | None = None,
        terminate: Callable[[str], bool] | None = None,
        assets_dir: Path | None = None,
        references: ReferenceTaker | None = None,
        sampler_for: SamplerFor | None = None,
        performance: Performance | None = None,
    ):
        self.store = store
        self.api = api
        self.media = LocalMediaStore(media_root)  # every read and delete of media goes through it
        self.media_root = self.media.root
        self.state_dir = Path(state_dir)
        self.assets_dir = assets_dir or api.assets_dir(state_dir)  # accepted inputs the workers read
        self.on_accept = on_accept or (lambda: None)
        self.published_capabilities = capabilities
        self.rules = RuleBook(api.sampling, defaults, sampler_for, performance)
        self.terminate = terminate
        # Frames and sound taken from videos: on a media worker (through Dagster) in the service.
        self.references = references or InProcessReferences(self.media)
        self.queue = QueueControl(state_dir)  # pause / priorities, applied by the daemon's coordinator

    def callback_payload(self, job: JobRecord) -> dict[str, Any]:
        """The callback ``job`` gets for its outcome (:func:`api.core.outcome.callback_payload`)."""
        return callback_payload(job, self.store, self.api)

    def capabilities(self) -> Capabilities | None:
        return capabilities_from(self.published_capabilities())

    def sampling(self, adapter: str | None, caps: Capabilities | None = None) -> SamplingRule:
        """The sampling rule of a request with ``adapter`` (or none): see :class:`RuleBook`."""
        return self.rules.sampling(adapter, caps if caps is not None else self.capabilities())

    def replay(self, job_id: str | None, kind: JobKind, digest: str) -> JobRecord | None:
        """The original job for a repeated ``job_id`` with the same payload; Conflict otherwise."""
        if job_id is None:
            return None
        found = self.store.idempotent_version(job_id)
        if found is None:
            return None
        version_id, stored_hash, stored_kind = found
        if stored_hash != digest or stored_kind != kind:
            raise Conflict(
                f"job_id {job_id!r} was already used for a different request (version {version_id})"
            )
        return self.store.get(version_id)

    def volumes(self) -> list[Volume]:
        """Free space on the media root's and the state directory's disks."""
        places = {"media_root": self.media_root, "state_dir": self.state_dir}
        return volumes(places, self.api.min_free_mb)

    def check_queue(self, kind: JobKind, need: int = 1) -> None:
        """Room for ``need`` more jobs of ``kind``: on the disks, then in the queue."""
        full = next((v for v in self.volumes() if not v.ok), None)
        if full is not None:
            raise NoRoom(full.refusal())
        queued = self.store.counts_by_status(kind)["queued"]
        if queued + need > self.api.max_queue:
            raise QueueFull(
                f"the {kind} queue is full ({queued} queued, limit {self.api.max_queue})",
                self.retry_after_s(),
            )

    def resolve(self, ref: InputRef, role: Role) -> InputAsset:
        """A client resource fetched, decoded and stored content-addressed (InvalidField otherwise)."""
        try:
            if ref.upload is not None:
                return copy_into_assets(
                    ref.upload, role, self.api.inputs, self.assets_dir, self.store, field=ref.field
                )
            return resolve_resource(
                ref.value or "", role, self.api.inputs, self.assets_dir, self.store, field=ref.field
            )
        except InputError as exc:
            raise InvalidField(exc.message, exc.field, code=exc.code) from None

    def _accept(self, new: NewJob) -> Accepted:
        try:
            result = self.store.accept(new)
        except IdempotencyConflict as exc:  # a concurrent request with the same key won the insert
            raise Conflict(
                f"job_id {exc.job_id!r} was already used for a different request (version {exc.version_id})"
            ) from None
        if result.created:
            self.on_accept()
        return Accepted(result.job, result.created)

    def video_path(self, version_id: str) -> Path | None:
        """The MP4 a succeeded job produced (absolute), if it is still on disk."""
        return self.artifact_path(version_id, VIDEO_KIND)

    def artifact_path(self, version_id: str, kind: str, role: str | None = None) -> Path | None:
        """An artifact's file; for a video with no role asked, the film (an extension's stitched
        result) before the shot."""
        arts = self.store.artifacts_for(version_id)
        if role is None and kind == VIDEO_KIND:
            arts = sorted(arts, key=lambda a: a.role != "film")
        for art in arts:
            if art.kind == kind and (role is None or art.role == role):
                path = self.media.find(art.path)
                if path is not None:
                    return path
        return None

    def job_seconds(self) -> float | None:
        """Median wall time of recent finished jobs, from claim to end (None before the first)."""
        durations = self.store.recent_durations(DURATION_SAMPLES)
        return statistics.median(durations) if durations else None

    def stage_seconds(self) -> dict[str, float]:
        """The median duration of each stage over recent finished jobs ({} before the first)."""
        return self.stage_timing()[0]

    def stage_timing(self) -> tuple[dict[str, float], float | None]:
        """(the median duration of each stage, the median seconds of the inferring stage per DiT
        call) over recent finished shots: denoising costs each step's DiT evaluations (the run's
        record of them; else two with guidance above 1, one without), so a job's inferring time is
        its own calls at that rate. ({}, None) before the
        first; None also while none has recorded its steps and guidance.)"""
        recent = self.store.recent_stage_times(DURATION_SAMPLES)
        durations = [stage_durations(times, end) for times, end, _ in recent]
        per_call = []
        for took, (_, _, result) in zip(durations, recent, strict=True):
            steps, guidance = result.get("num_inference_steps"), result.get("guidance_scale")
            if steps and guidance is not None and stages.INFERRING in took:
                recorded = (result.get("sampler") or {}).get("dit_calls_per_step")  # what it ran
                calls = int(steps) * int(recorded) if recorded else dit_calls(int(steps), float(guidance))
                per_call.append(took[stages.INFERRING] / calls)
        return stage_medians(durations), statistics.median(per_call) if per_call else None

    def retry_after_s(self) -> int:
        """The median job time less the running job's elapsed time, at least 2 s (60 before the
        first job has finished)."""
        median = self.job_seconds()
        if median is None:
            return RETRY_AFTER_UNKNOWN_S
        started = self.store.oldest_running_start()
        elapsed = time.time() - started if started else 0.0
        return max(RETRY_AFTER_MIN_S, int(round(median - elapsed)))

    def require_capabilities(self) -> Capabilities:
        caps = self.capabilities()
        if caps is None:
            raise Unavailable("the model is not loaded on any worker yet")
        return caps


def run_kind(job: JobRecord) -> str:
    """The job kind an operator filters runs by (their ``shotloom/kind`` tag)."""
    return {"openai": "v1", "images": "image"}.get(job.dialect, job.kind)
