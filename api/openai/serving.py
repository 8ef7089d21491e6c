"""The OpenAI dialect's serving layer: requests into the job service, store records into video
objects (status, progress, phase, ETA), and the cancel/delete semantics of the video job API."""

from __future__ import annotations

import json
import logging
import secrets
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from api.admin.health import missing_encoders
from api.context import ApiContext
from api.core.errors import EncoderMissing, InvalidField, NotFound, ServiceError, Unavailable
from api.core.limits import MAX_SEED
from api.core.records import CharacterRecord, JobLive, JobRecord, JobResult
from api.core.sampling import dit_calls, job_sampling
from api.core.specs import InputRef, ShotSpec, SourceRef
from api.core.steps import extension_before_frames
from api.core.timing import eta_s, stage_durations, working_seconds
from api.core.views import JobViews
from api.openai.errors import OpenAIError, validation_error
from api.openai.protocol import (
    CharacterCreateRequest,
    CharacterExtension,
    CharacterObject,
    ModelCard,
    ServedModel,
    Video,
    VideoCreateRequest,
    VideoDeleted,
    VideoError,
    VideoExtension,
    version_of,
    video_id,
)
from shotloom import stages
from shotloom.capabilities import Capabilities
from shotloom.config import Adapter

log = logging.getLogger("shotloom.api.openai")

STATUS = {
    "queued": "queued",
    "running": "in_progress",
    "succeeded": "completed",
    "failed": "failed",
    "cancelled": "cancelled",
}
# Progress: 0 while queued and encoding, 5 once the prompt is encoded, to 90 across the denoise
# steps, to 99 across the decoded pieces, 100 when the MP4 is written.
ENCODED, DENOISED, DECODED = 5, 90, 99
_ENCODING = {
    stages.CLAIMED,
    stages.WAITING_FOR_MEMORY,
    stages.RECOVERED,
    stages.VALIDATING,
    stages.CACHE_LOOKUP,
    stages.KEEPING_ON_GPU,
    stages.STAGING_ON_CPU,
    stages.UNLOADING,
    stages.CONDITIONING,
}
POLL_QUEUED_MS, POLL_MIN_MS, POLL_MAX_MS = 2000, 250, 2000
TIMING_CACHE_S = 5.0  # the stage times behind ETAs are re-read at most this often
RUNNING_VIEW_S = 1.0  # a running job's cached answer is this fresh at most (its ETA moves)


@dataclass(frozen=True)
class VideoView:
    """One rendered GET /v1/videos/{id} answer."""

    video: Video
    body: bytes
    status: int


def not_found(video: str) -> OpenAIError:
    return OpenAIError(404, f"no video {video!r}", param="video_id", code="not_found")


@contextmanager
def openai_errors() -> Iterator[None]:
    try:
        yield
    except ServiceError as exc:
        raise OpenAIError.from_service(exc) from None
    except ValidationError as exc:
        raise validation_error(exc) from None


def character_object(rec: CharacterRecord) -> CharacterObject:
    return CharacterObject(
        id=rec.character_id,
        name=rec.name,
        created_at=int(rec.created_at),
        shotloom=CharacterExtension(
            frame_sha256=rec.image.sha256, has_audio=rec.audio is not None, source=rec.source
        ),
    )


def like_source(
    raw: dict[str, Any], source: JobRecord, max_seconds: float, length: bool = True
) -> dict[str, Any]:
    """``raw`` with the source job's size, length (unless not ``length``), rate, seed and work
    where it gives none. A stitched source (an extension) is off the frame grid: its length goes
    as seconds (snapped up, at most ``max_seconds``)."""
    shot = source.request.shot  # None: a film (a merge) is the source

    def asked(name: str) -> Any:
        return getattr(shot, name) if shot is not None else None

    frames, fps, written = asked("num_frames"), asked("fps"), source.result.frames if source.result else None
    seconds = None
    if length and written and frames and int(written) != frames and fps:
        frames, seconds = None, min(int(written) / fps, max_seconds)
    return with_defaults(
        raw,
        size=f"{asked('width')}x{asked('height')}" if asked("width") else None,
        num_frames=frames if length else None,
        seconds=seconds,
        fps=fps,
        seed=asked("seed"),
        extra_params={"work_id": source.work_id},
    )


def with_defaults(raw: dict[str, Any], **given: Any) -> dict[str, Any]:
    """Fill a request's size / length / rate / seed / extra_params groups it left unset, as if the
    client had set them (so they win over operator defaults): a group the client touched in any
    spelling (``size``, ``width``, ``video_params.width``...) is left alone."""
    nested = raw.get("video_params") if isinstance(raw.get("video_params"), dict) else {}
    groups = {
        "size": ("size", "width", "height"),
        "num_frames": ("seconds", "num_frames"),
        "seconds": ("seconds", "num_frames"),
        "fps": ("fps",),
        "seed": ("seed",),
        "extra_params": ("extra_params",),
    }
    out = dict(raw)
    for key, value in given.items():
        names = groups[key]
        if value is None or any(n in raw for n in names) or any(n in nested for n in names):
            continue
        out[key] = value
    return out


def parse_request(raw: dict[str, Any], unknown_fields: str = "reject") -> VideoCreateRequest:
    """The typed request; unknown top-level fields are a 400, or (``warn``) logged and dropped."""
    if unknown_fields == "warn":
        known = set(VideoCreateRequest.model_fields)
        unknown = sorted(k for k in raw if k not in known)
        if unknown:
            log.warning("ignoring unknown /v1/videos fields: %s", ", ".join(unknown))
            raw = {k: v for k, v in raw.items() if k in known}
    with openai_errors():
        return VideoCreateRequest.model_validate(raw)


def _progress(job: JobRecord, steps: int | None) -> tuple[int, int | None]:
    """(progress percent, denoise steps done) from the job's stage and live progress."""
    if job.status == "succeeded":
        return 100, steps
    prog = job.live.progress if job.live and isinstance(job.live.progress, dict) else {}
    total = max(1, prog.get("total", 1))
    done = min(max(0, prog.get("done", 0)), total)
    stage = job.stage
    if stage in (stages.QUEUED, *_ENCODING) or job.status == "queued":
        return 0, 0
    if stage in (stages.LOADING_GENERATOR, stages.INFERRING):
        if prog.get("stage") == stages.INFERRING:
            return ENCODED + (DENOISED - ENCODED) * done // total, done
        return ENCODED, 0
    if stage == stages.DECODING:
        if prog.get("stage") == stages.DECODING:
            return DENOISED + (DECODED - DENOISED) * done // total, steps
        return DENOISED, steps
    if stage in (stages.WRITING, stages.MERGING):  # merging: an extension stitched after its source
        return DECODED, steps
    return 0, None


def _stage_durations(job: JobRecord) -> dict[str, float]:
    return stage_durations(job.live.stage_times if job.live else {}, job.finished_at)


def sync_headers(video: Video) -> dict[str, str]:
    """The headers of a ``/v1/videos/sync`` answer. ``X-Inference-Time-S`` is the time the job
    was worked on: its stage timings less the waits (the queue, a wait for device memory)."""
    ext = video.shotloom
    return {
        "X-Request-Id": video.id,
        "X-Model": video.model,
        "X-Inference-Time-S": f"{working_seconds(ext.stage_timings):.3f}",
        "X-Stage-Durations": json.dumps(ext.stage_timings, separators=(",", ":")),
        "X-Peak-Memory-MB": f"{ext.peak_memory_mb:.1f}" if ext.peak_memory_mb is not None else "",
    }


class VideoServing:
    def __init__(self, ctx: ApiContext):
        self.ctx = ctx
        self.jobs = ctx.jobs
        self.config = ctx.api.openai
        self._operator: VideoCreateRequest | None = None
        if self.config.default_request:
            # Checked at start: a bad operator default is a configuration error, not a client's.
            self._operator = VideoCreateRequest.model_validate({"prompt": "-", **self.config.default_request})
            self._operator.geometry()
        # (when read, per-stage medians, median inferring seconds per DiT call, median whole-job
        # time) of recent finished jobs
        self._timing: tuple[float, dict[str, float], float | None, float | None] = (
            -TIMING_CACHE_S - 1,
            {},
            None,
            None,
        )

    # -- the model --------------------------------------------------------------------------------
    def model_id(self) -> str:
        return self.config.served_model_name or self.ctx.inference.paths.checkpoint.name

    def served(self) -> ServedModel:
        caps = self.jobs.capabilities()
        if caps is None:
            raise Unavailable("the model is not loaded on any worker yet; retry shortly")
        inf = self.ctx.inference
        return ServedModel(
            id=self.model_id(),
            family=inf.family,
            caps=caps,
            width=inf.defaults.width,
            height=inf.defaults.height,
            num_frames=inf.defaults.num_frames,
            fps=inf.defaults.fps,
            sampling=self.jobs.sampling(None, caps),
            adapter_sampling={
                a.name: self.jobs.sampling(a.name, caps) for a in inf.adapters if a.sampler is not None
            },
            max_seconds=self.config.max_seconds,
            max_width=self.config.max_width,
            max_height=self.config.max_height,
            adapters={a.name: a.scale for a in self.ctx.inference.adapters},
            default_work=self.config.default_work,
            created=int(self.ctx.inference.paths.checkpoint.stat().st_mtime)
            if self.ctx.inference.paths.checkpoint.exists()
            else 0,
        )

    def served_or_none(self) -> ServedModel | None:
        try:
            return self.served()
        except Unavailable:
            return None

    def model_card(self) -> ModelCard:
        inf = self.ctx.inference
        published = self.ctx.background.capabilities()
        created = inf.paths.checkpoint.stat().st_mtime if inf.paths.checkpoint.exists() else 0
        caps = self.jobs.capabilities()
        sampling = self.jobs.sampling(None, caps)
        return ModelCard(
            id=self.model_id(),
            created=int(created),
            family=inf.family,
            capabilities=published,
            adapters=[self._adapter_entry(a, caps) for a in inf.adapters],
            defaults={
                "size": f"{inf.defaults.width}x{inf.defaults.height}",
                "num_frames": inf.defaults.num_frames,
                "fps": inf.defaults.fps,
                "seconds": f"{inf.defaults.num_frames / inf.defaults.fps:g}",
                "num_inference_steps": sampling.steps,
                "guidance_scale": sampling.guidance_scale,
                "step_cache": sampling.step_cache,
            },
            sampling=sampling.describe(),
        )

    def _adapter_entry(self, adapter: Adapter, caps: Capabilities | None) -> dict[str, Any]:
        """An adapter as a model card lists it, with its own sampler where it has one."""
        entry: dict[str, Any] = {"name": adapter.name, "scale": adapter.scale}
        if adapter.sampler is not None:
            entry["sampling"] = self.jobs.sampling(adapter.name, caps).describe()
        return entry

    def model_cards(self) -> list[ModelCard]:
        """The served model, then one card per LoRA adapter (its nickname selects base + adapter,
        sampled by the adapter's own sampler where it has one)."""
        base = self.model_card()
        cards, caps = [base], self.jobs.capabilities()
        for a in self.ctx.inference.adapters:
            entry = self._adapter_entry(a, caps)
            update: dict[str, Any] = {"id": a.name, "parent": base.id, "adapters": [entry]}
            if "sampling" in entry:
                sampling = entry["sampling"]
                update["sampling"] = sampling
                update["defaults"] = {
                    **base.defaults,
                    "num_inference_steps": sampling["num_inference_steps"],
                    "guidance_scale": sampling["guidance_scale"],
                }
            cards.append(base.model_copy(update=update))
        return cards

    def model(self, name: str) -> ModelCard:
        found = next((card for card in self.model_cards() if card.id == name), None)
        if found is None:
            raise OpenAIError(
                404, f"the model {name!r} is not served here", param="model", code="model_not_found"
            )
        return found

    # -- create ---------------------------------------------------------------------------------
    def parse(self, raw: dict[str, Any]) -> VideoCreateRequest:
        return parse_request(raw, self.config.unknown_fields)

    def create(
        self,
        req: VideoCreateRequest,
        uploads: dict[str, Path],
        upload_digests: dict[str, str],
        idempotency_key: str | None,
        submitter: str | None = None,
        source: SourceRef | None = None,
        recorded: dict[str, Any] | None = None,
        extends: SourceRef | None = None,
    ) -> tuple[JobRecord, bool]:
        """Queue a video; ``source``: the video it starts from (remix, edit), ``recorded``: more
        of the request to keep and show back (and to tell idempotent replays apart)."""
        spec = self.spec(req, uploads, upload_digests, idempotency_key, submitter, source, recorded, extends)
        with openai_errors():
            accepted = self.jobs.accept_shot(spec)
            return accepted.job, accepted.created

    def spec(
        self,
        req: VideoCreateRequest,
        uploads: dict[str, Path],
        upload_digests: dict[str, str],
        idempotency_key: str | None,
        submitter: str | None = None,
        source: SourceRef | None = None,
        recorded: dict[str, Any] | None = None,
        extends: SourceRef | None = None,
    ) -> ShotSpec:
        """The shot a request asks for, checked against the served model (nothing queued yet)."""
        with openai_errors():
            if not self.ctx.background.started:
                raise Unavailable("the service is starting")
            missing = missing_encoders()
            if missing:
                raise EncoderMissing(
                    f"the FFmpeg bundled with PyAV lacks the {' and '.join(missing)} encoder(s) the MP4 "
                    "writer needs (H.264 video, AAC audio): install a PyAV wheel that bundles them"
                )
            spec = req.to_spec(
                self.served(),
                operator=self._operator,
                uploads=uploads,
                version_id=uuid.uuid4().hex,
                seed=req.seed if req.seed is not None else self._operator_seed(),
                job_id=f"openai:{idempotency_key}" if idempotency_key else None,
                submitter=submitter,
                upload_digests=upload_digests,
                source=source,
                extends=extends,
            )
            if recorded:
                spec = replace(
                    spec,
                    client={**spec.client, **recorded},
                    idempotency_payload={**spec.idempotency_payload, **recorded},
                )
            return spec

    # -- video from video -------------------------------------------------------------------------
    def remix(
        self,
        video: str,
        raw: dict[str, Any],
        uploads: dict[str, Path],
        digests: dict[str, str],
        idempotency_key: str | None,
        submitter: str | None,
    ) -> tuple[JobRecord, bool]:
        """A completed video again with a new prompt: its size, length and seed unless given,
        starting from its frames."""
        source = self.completed(video, "video_id")
        req = self.parse(like_source(raw, source, self.config.max_seconds))
        return self.create(
            req,
            uploads,
            digests,
            idempotency_key,
            submitter,
            source=SourceRef("video_id", version_id=source.version_id),
            recorded={"remixed_from_video_id": video},
        )

    def edit(
        self,
        raw: dict[str, Any],
        uploads: dict[str, Path],
        digests: dict[str, str],
        idempotency_key: str | None,
        submitter: str | None,
    ) -> tuple[JobRecord, bool]:
        """A video (an uploaded MP4, or ``{"id"}`` of a completed one) changed by a prompt."""
        raw, uploads, digests, ref, recorded = self._video_field(raw, uploads, digests)
        if ref.version_id is not None:
            raw = like_source(raw, self.ctx.store.get(ref.version_id), self.config.max_seconds)
        else:
            raw = self._like_upload(raw, ref.video.upload)
        return self.create(
            self.parse(raw), uploads, digests, idempotency_key, submitter, source=ref, recorded=recorded
        )

    def extend(
        self,
        raw: dict[str, Any],
        uploads: dict[str, Path],
        digests: dict[str, str],
        idempotency_key: str | None,
        submitter: str | None,
    ) -> tuple[JobRecord, bool]:
        """A continuation of a video (an uploaded MP4, or ``{"id"}`` of a completed one), ``seconds``
        long, starting at its last frame with the video in memory, stitched after it: the new
        video is the whole, and its ``seconds`` the total."""
        raw, uploads, digests, ref, recorded = self._video_field(raw, uploads, digests)
        if ref.version_id is not None:
            # The extension's length is its own (seconds), never its source's.
            raw = like_source(raw, self.ctx.store.get(ref.version_id), self.config.max_seconds, length=False)
        else:
            raw = self._like_upload(raw, ref.video.upload, length=False)
        return self.create(
            self.parse(raw), uploads, digests, idempotency_key, submitter, extends=ref, recorded=recorded
        )

    def _video_field(
        self, raw: dict[str, Any], uploads: dict[str, Path], digests: dict[str, str]
    ) -> tuple[dict[str, Any], dict[str, Path], dict[str, str], SourceRef, dict[str, Any]]:
        """The ``video`` of an edit or extension: a file part, or ``{"id"}`` of a completed video
        (404 unknown, 409 unfinished); answers the rest of the request, the source and what to
        record of it."""
        raw, uploads, digests = dict(raw), dict(uploads), dict(digests)
        given, upload = raw.pop("video", None), uploads.pop("video", None)
        if upload is not None and given is not None:
            raise OpenAIError(
                400, "video: give a file or an id, not both", param="video", code="invalid_value"
            )
        if upload is not None:
            digest = digests.pop("video")
            ref = SourceRef("video", video=InputRef("video", upload=upload))
            return raw, uploads, digests, ref, {"video": {"upload_sha256": digest}}
        if not isinstance(given, dict) or set(given) != {"id"} or not isinstance(given["id"], str):
            raise OpenAIError(
                400,
                'video: required, as an MP4 file part or {"id": "video_..."} of a completed video',
                param="video",
                code="invalid_value",
            )
        source = self.completed(given["id"], "video.id")
        ref = SourceRef("video.id", version_id=source.version_id)
        return raw, uploads, digests, ref, {"video": {"id": given["id"]}}

    # -- characters -------------------------------------------------------------------------------
    def create_character(
        self, raw: dict[str, Any], uploads: dict[str, Path], digests: dict[str, str], submitter: str | None
    ) -> CharacterObject:
        raw, uploads, digests, ref, _recorded = self._video_field(raw, uploads, digests)
        with openai_errors():
            req = CharacterCreateRequest.model_validate(raw)
            if uploads:
                raise InvalidField(f"unexpected file part {sorted(uploads)[0]!r}", sorted(uploads)[0])
            return character_object(self.jobs.create_character(req.name, ref, submitter))

    def character(self, character_id: str) -> CharacterObject:
        found = self.ctx.store.get_character(character_id)
        if found is None:
            raise OpenAIError(404, f"no character {character_id!r}", param="character_id", code="not_found")
        return character_object(found)

    def completed(self, video: str, param: str) -> JobRecord:
        """A source video: 404 when unknown, 409 ``not_ready`` until it has completed."""
        version = version_of(video)
        job = self.ctx.store.get(version) if version else None
        if job is None or not self.visible(job):
            raise OpenAIError(404, f"no video {video!r}", param=param, code="not_found")
        if job.status != "succeeded":
            raise OpenAIError(
                409, f"video {video} is {STATUS[job.status]}, not completed", param=param, code="not_ready"
            )
        return job

    def _like_upload(self, raw: dict[str, Any], upload: Path, length: bool = True) -> dict[str, Any]:
        """An uploaded source's size (on the model's grid, within the server's limits) and length
        (at most max_seconds), unless the request gives them. Undecodable: 400 naming ``video``."""
        from shotloom.media import probe  # PyAV, no torch

        try:
            info = probe(upload)
        except Exception as exc:  # any demux/decode error: the upload is what is wrong
            raise OpenAIError(
                400, f"video: not a decodable video ({exc})", param="video", code="invalid_value"
            ) from None
        with openai_errors():
            caps = self.served()
        m = caps.caps.size_multiple
        width = max(m, min(info.width, caps.max_width) // m * m)
        height = max(m, min(info.height, caps.max_height) // m * m)
        seconds = min(float(info.duration_s), caps.max_seconds)
        return with_defaults(raw, size=f"{width}x{height}", seconds=seconds if length else None)

    def _operator_seed(self) -> int:
        if self._operator is not None and self._operator.seed is not None:
            return self._operator.seed
        return secrets.randbelow(MAX_SEED)

    # -- read -----------------------------------------------------------------------------------
    def job(self, video: str) -> JobRecord:
        version = version_of(video)
        job = self.ctx.store.get(version) if version else None
        if job is None or not self.visible(job):
            raise not_found(video)
        return job

    def visible(self, job: JobRecord) -> bool:
        """A /v1 video that has not expired."""
        return job.dialect == "openai" and not self.ctx.retention.expired(job)

    def views(self, max_entries: int) -> JobViews[VideoView]:
        """GET /v1/videos/{id} answers, cached until the job changes or its ETA or expiry moves."""

        def render(job: JobRecord, _artifacts: list, position: int | None) -> VideoView | None:
            if not self.visible(job):
                return None
            video = self.video(job, position)
            return VideoView(video, video.model_dump_json().encode(), self.failed_status(video))

        def max_age(job: JobRecord) -> float | None:
            if job.status == "running":
                return RUNNING_VIEW_S
            if job.status == "queued":
                return TIMING_CACHE_S
            expires = self.ctx.retention.expires_at(job)
            return max(0.0, expires - time.time()) if expires else None

        return JobViews(self.ctx.store, render, max_entries, max_age)

    def timing(self) -> tuple[dict[str, float], float | None, float | None]:
        """(median seconds of each stage, median inferring seconds per DiT call, median whole-job
        seconds) of recent finished jobs."""
        at, medians, per_call, whole = self._timing
        if time.monotonic() - at > TIMING_CACHE_S:
            (medians, per_call), whole = self.jobs.stage_timing(), self.jobs.job_seconds()
            self._timing = (time.monotonic(), medians, per_call, whole)
        return medians, per_call, whole

    def video(self, job: JobRecord, position: int | None = None) -> Video:
        shot = job.request.shot
        client = job.request.client
        sampling = job_sampling(job, self.jobs.sampling, shot) or {}
        steps = sampling.get("num_inference_steps")
        progress, step = _progress(job, steps)
        live = job.live or JobLive()
        frames, fps = (shot.num_frames, shot.fps) if shot else (None, None)
        width, height = (shot.width, shot.height) if shot else (None, None)
        result = job.result or JobResult()
        before_frames = extension_before_frames(job)
        if job.status == "succeeded" and result.frames and result.fps:
            frames, fps = int(result.frames), int(round(float(result.fps)))  # what was written
        elif before_frames and frames:
            frames += before_frames  # an extension: the stitched whole
        phase = "completed" if job.status == "succeeded" else job.stage
        eta = self._eta(job, position, sampling)
        worker = (live.worker or {}).get("name")
        peak = result.peak_memory_mb  # measured by the worker when it wrote the MP4
        file_name = Path(result.media_path).name if result.media_path else None
        error = None
        if job.status == "failed":
            error = VideoError(
                code="generation_failed", message=job.error or "the generation failed", status=500
            )
        return Video(
            id=video_id(job.version_id),
            model=client.get("model") or self.model_id(),
            status=STATUS[job.status],
            progress=progress,
            created_at=int(job.created_at),
            completed_at=int(job.finished_at) if job.finished_at and job.status == "succeeded" else None,
            expires_at=int(expires) if (expires := self.ctx.retention.expires_at(job)) else None,
            seconds=f"{frames / fps:g}" if frames and fps else "0",
            size=f"{width}x{height}" if width and height else "",
            prompt=shot.prompt if shot else None,
            error=error,
            remixed_from_video_id=client.get("remixed_from_video_id"),
            shotloom=VideoExtension(
                frames=frames,
                fps=fps,
                seed=shot.seed if shot else None,
                steps=steps,
                guidance_scale=sampling.get("guidance_scale"),
                sampler_mode=sampling.get("mode"),
                step_cache=sampling.get("step_cache"),
                strength=shot.strength if shot and shot.source_video else None,
                step=step,
                phase=phase,
                eta_s=eta,
                file_name=file_name,
                stage_timings=_stage_durations(job),
                peak_memory_mb=peak,
                queue_position=position,
                worker=worker,
                work_id=job.work_id,
                shot_id=job.shot_id,
                version_id=job.version_id,
            ),
        )

    def _eta(self, job: JobRecord, position: int | None, sampling: dict[str, Any]) -> float | None:
        """From the measured stage times of earlier jobs (see :func:`api.core.timing.eta_s`) and
        the job's own ``sampling`` (:func:`api.core.sampling.job_sampling`)."""
        if job.status not in ("queued", "running"):
            return 0.0 if job.status == "succeeded" else None
        medians, per_call, whole = self.timing()
        steps, guidance = sampling.get("num_inference_steps"), sampling.get("guidance_scale")
        if per_call is not None and stages.INFERRING in medians and steps and guidance is not None:
            # Denoising costs this job's own DiT calls (its steps, each its sampler's evaluations).
            shot = job.request.shot
            sampler = self.jobs.sampling(shot.lora).sampler if shot is not None else None
            medians = {**medians, stages.INFERRING: round(per_call * dit_calls(steps, guidance, sampler), 3)}
        return eta_s(
            job.status,
            job.stage,
            job.live.as_json() if job.live else None,
            medians,
            position=position,
            devices=len(self.ctx.worker_names),
            whole_s=whole,
        )

    @staticmethod
    def poll_after_ms(video: Video) -> int:
        """How long a poller should wait: shorter as the job nears its end."""
        if video.status == "queued":
            return POLL_QUEUED_MS
        if video.status != "in_progress":
            return POLL_MAX_MS
        eta = video.shotloom.eta_s
        if eta is None:
            return 1000
        return int(min(POLL_MAX_MS, max(POLL_MIN_MS, eta * 1000 / 4)))

    def failed_status(self, video: Video) -> int:
        """GET of a failed job answers with the status its request would have had."""
        return video.error.status if video.error is not None else 200

    # -- cancel and delete ------------------------------------------------------------------------
    def delete(self, video: str) -> VideoDeleted:
        """Queued: cancelled at once. Running: answered at once, stops at its next step or piece.
        Finished (or a cancelled one, the second time): removed with its files."""
        job = self.job(video)
        with openai_errors():
            if job.status in ("queued", "running"):
                job = self.jobs.cancel(job.version_id)
                return VideoDeleted(id=video, deleted=False, status=STATUS[job.status])
            # A cancelled job kept its record after the DELETE that cancelled it: this one removes it.
            self.jobs.delete(job.version_id)
        return VideoDeleted(id=video, deleted=True, status=STATUS[job.status])

    def content_path(self, video: str, variant: str) -> Path:
        job = self.job(video)
        if job.status != "succeeded":
            raise OpenAIError(
                409,
                f"video {video} is {STATUS[job.status]}, not completed",
                param="video_id",
                code="not_ready",
            )
        kind, role = ("video", None) if variant == "video" else ("image", variant)
        path = self.jobs.artifact_path(job.version_id, kind, role)
        if path is None:
            raise OpenAIError(
                404, f"video {video} has no {variant} (anymore)", param="variant", code="not_found"
            )
        return path

    def remove(self, job: JobRecord) -> None:
        """Drop a finished job and its files (the sync route's temporary output)."""
        try:
            self.jobs.delete(job.version_id)
        except (NotFound, ServiceError) as exc:
            log.warning("could not remove %s: %s", job.version_id, exc)
