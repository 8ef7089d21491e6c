"""Accepting jobs: validate, resolve inputs, store durably, then hand the job to the submitter.

Order matters for the r2v spec's promises: the idempotency key is checked before any input is
fetched (a replay costs nothing); every input is decoded and stored before the job is accepted
(invalid media is a 422 and nothing is queued); the job row is committed before the answer is
sent, and the Dagster run is submitted afterwards by :class:`api.follower.Follower`, which also
reconciles accepted-but-unsubmitted jobs at start. No torch here.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from api.inputs import InputAsset, InputError, copy_into_assets, resolve_resource
from api.schemas import CALLBACK_HEADER, MergeRequest, R2VRequest
from api.settings import ApiConfig
from api.store import IdempotencyConflict, JobKind, JobRecord, NewJob, Store, payload_hash
from shotloom.capabilities import Capabilities, CapabilityError
from shotloom.config import Defaults
from shotloom.request import GenerationRequest, MemorySlot

R2V_JOB = "r2v"
MERGE_JOB = "merge"
VERSION_TAG = "shotloom/version_id"  # every submitted run carries it: reconcile finds runs by it
VIDEO_KIND = "video"  # artifacts are indexed by media kind; role says shot or film


class ApiError(Exception):
    """An answer other than 2xx, with the status code the r2v spec's error table gives."""

    def __init__(self, status: int, message: str, field: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field

    def body(self) -> dict[str, Any]:
        error = f"{self.field}: {self.message}" if self.field else self.message
        detail = [{"field": self.field, "msg": self.message}] if self.field else self.message
        return {"error": error, "detail": detail}


def _input_error(exc: InputError) -> ApiError:
    return ApiError(422, exc.message, exc.field)


@dataclass(frozen=True)
class Accepted:
    job: JobRecord
    created: bool  # False: an idempotent replay


# Request fields as the engine names them -> as the r2v request names them (for 422 messages).
_FIELD_NAMES = {"first_frame": "condition_img", "memory": "memory_slots"}


class Intake:
    """The write side of the API: POST /r2v and POST /merge.

    ``capabilities`` returns what the loaded model can do, as the device workers publish it (None
    until one has loaded it): requests it cannot serve are refused with 422 before queueing.
    ``defaults`` are the inference YAML's, which fill what a request leaves out.
    """

    def __init__(
        self,
        store: Store,
        api: ApiConfig,
        state_dir: Path,
        media_root: Path,
        on_accept: Callable[[], None] | None = None,
        capabilities: Callable[[], dict[str, Any] | None] = lambda: None,
        defaults: Defaults | None = None,
    ):
        self.store = store
        self.api = api
        self.media_root = Path(media_root).resolve()
        self.assets_dir = api.assets_dir(state_dir)
        self.on_accept = on_accept or (lambda: None)
        self.capabilities = capabilities
        self.defaults = defaults or Defaults()

    # -- shared steps ---------------------------------------------------------------------------
    def _replay(self, job_id: str | None, kind: JobKind, digest: str) -> JobRecord | None:
        """The original job for a repeated ``job_id`` with the same payload; 409 for another payload."""
        if job_id is None:
            return None
        found = self.store.idempotent_version(job_id)
        if found is None:
            return None
        version_id, stored_hash, stored_kind = found
        if stored_hash != digest or stored_kind != kind:
            raise ApiError(
                409, f"job_id {job_id!r} was already used for a different request (version {version_id})"
            )
        return self.store.get(version_id)

    def _check_queue(self, kind: JobKind) -> None:
        queued = self.store.counts_by_status(kind)["queued"]
        if queued >= self.api.max_queue:
            raise ApiError(503, f"the {kind} queue is full ({queued} queued, limit {self.api.max_queue})")

    def _resource(self, value: str, role: str, field: str) -> InputAsset:
        try:
            return resolve_resource(value, role, self.api.inputs, self.assets_dir, self.store, field=field)
        except InputError as exc:
            raise _input_error(exc) from None

    def _accept(self, new: NewJob) -> Accepted:
        try:
            result = self.store.accept(new)
        except IdempotencyConflict as exc:  # a concurrent request with the same key won the insert
            raise ApiError(
                409,
                f"job_id {exc.job_id!r} was already used for a different request (version {exc.version_id})",
            ) from None
        if result.created:
            self.on_accept()
        return Accepted(result.job, result.created)

    def _shot_video(self, work_id: str, shot_id: str) -> JobRecord | None:
        return self.store.newest_succeeded_shot(work_id, shot_id)

    def video_path(self, version_id: str) -> Path | None:
        """The MP4 a succeeded job produced (absolute), if it is still on disk."""
        for art in self.store.artifacts_for(version_id):
            if art.kind == VIDEO_KIND:
                path = (self.media_root / art.path).resolve()
                if path.is_relative_to(self.media_root) and path.is_file():
                    return path
        return None

    # -- POST /r2v ------------------------------------------------------------------------------
    def accept_r2v(self, req: R2VRequest, callback_header: str | None) -> Accepted:
        callback_url = _callback(req, callback_header)
        digest = payload_hash(req.idempotency_payload())
        replay = self._replay(req.job_id, "r2v", digest)
        if replay is not None:
            return Accepted(replay, False)
        self._check_queue("r2v")
        caps = self._capabilities()
        if caps is not None:
            self._check_capabilities(req, caps)

        inputs: dict[str, Any] = {}
        config: dict[str, Any] = {"work_id": req.work_id, "shot_id": req.shot_id, "prompt": req.prompt}
        for key in ("seed", "width", "height", "num_frames"):
            if getattr(req, key) is not None:
                config[key] = getattr(req, key)
        if req.condition_img is not None:
            asset = self._resource(req.condition_img, "image", "condition_img")
            config["first_frame"] = str(asset.path)
            inputs["condition_img"] = _describe(asset)
        memory = []
        for i, slot in enumerate(req.memory_slots):
            field = f"memory_slots[{i}]"
            if slot.shot_id is not None:
                with_audio = caps is None or caps.audio_in
                image, audio = self._shot_memory(req.work_id, slot.shot_id, f"{field}.shot_id", with_audio)
            else:
                image = self._resource(slot.image_url, "image", f"{field}.image_url")
                audio = (
                    self._resource(slot.audio_url, "audio", f"{field}.audio_url") if slot.audio_url else None
                )
            memory.append({"image": str(image.path), "audio": str(audio.path) if audio else None})
            inputs[field] = {"image": _describe(image), "audio": _describe(audio) if audio else None}
        config["memory"] = memory

        client = _without_inline_data(req.normalized())
        new = NewJob(
            kind="r2v",
            work_id=req.work_id,
            shot_id=req.shot_id,
            job_id=req.job_id,
            payload_hash=digest,
            callback_url=callback_url,
            callback_context=req.callback_context,
            request={
                "client": client,
                "inputs": inputs,
                "job_name": R2V_JOB,
                "run_config": {"ops": {"condition_op": {"config": config}}},
            },
        )
        return self._accept(new)

    def _capabilities(self) -> Capabilities | None:
        caps = self.capabilities()
        if not caps:
            return None
        return Capabilities(**{k: tuple(v) if isinstance(v, list) else v for k, v in caps.items()})

    def _check_capabilities(self, req: R2VRequest, caps: Capabilities) -> None:
        """What the model cannot do is a 422 now, not a failed run later (paths are placeholders:
        only their presence matters here)."""
        d, here = self.defaults, Path(".")
        gen = GenerationRequest(
            prompt=req.prompt,
            width=req.width or d.width,
            height=req.height or d.height,
            num_frames=req.num_frames or d.num_frames,
            fps=d.fps,
            seed=0,
            guidance_scale=min(max(1.0, caps.guidance_range[0]), caps.guidance_range[1]),
            first_frame=here if req.condition_img else None,
            memory=tuple(MemorySlot(here, here if s.audio_url else None) for s in req.memory_slots),
        )
        try:
            caps.check(gen)
        except CapabilityError as exc:
            head, dot, rest = exc.field.partition("[")
            field = _FIELD_NAMES.get(head, head) + (dot + rest if dot else "")
            field = field.replace("].audio", "].audio_url")
            raise ApiError(422, str(exc).split(": ", 1)[-1], field) from None

    def _shot_memory(
        self, work_id: str, shot_id: str, field: str, with_audio: bool = True
    ) -> tuple[InputAsset, InputAsset | None]:
        """A bare memory ``shot_id``: a representative frame and the complete audio track of the
        newest successful shot of the same work, stored like client inputs (the audio only where
        the model takes audio)."""
        from shotloom import media  # PyAV + numpy, no torch

        job = self._shot_video(work_id, shot_id)
        video = self.video_path(job.version_id) if job is not None else None
        if video is None:
            raise ApiError(
                409, f"no successful shot {shot_id!r} in work {work_id!r} to take memory from", field
            )
        self.assets_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=self.assets_dir) as tmp:
            frame = Path(tmp) / "frame.png"
            media.extract_frame(video).save(frame)
            image = copy_into_assets(
                frame, "image", self.api.inputs, self.assets_dir, self.store, field=field
            )
            audio = None
            if with_audio and media.probe(video).has_audio:
                wav = media.extract_audio_wav(video, Path(tmp) / "audio.wav")
                audio = copy_into_assets(
                    wav, "audio", self.api.inputs, self.assets_dir, self.store, field=field
                )
        return image, audio

    # -- POST /merge ----------------------------------------------------------------------------
    def accept_merge(self, req: MergeRequest, callback_header: str | None) -> Accepted:
        flat = req.normalized()
        callback_url = _callback(req, callback_header)
        digest = payload_hash(req.idempotency_payload())
        replay = self._replay(flat.get("job_id"), "merge", digest)
        if replay is not None:
            return Accepted(replay, False)
        self._check_queue("merge")

        paths, shot_ids, sources = [], [], []
        for i, shot in enumerate(flat["shots"]):
            if "version_id" in shot:
                field = f"shots[{i}].version_id"
                job = self.store.get(shot["version_id"])
                if job is None or job.kind != "r2v":
                    raise ApiError(409, f"unknown r2v version {shot['version_id']!r}", field)
                if job.status != "succeeded":
                    raise ApiError(
                        409, f"version {job.version_id} has not succeeded (status {job.status})", field
                    )
                video = self.video_path(job.version_id)
                if video is None:
                    raise ApiError(
                        409, f"the video of version {job.version_id} is no longer available", field
                    )
                paths.append(video.relative_to(self.media_root).as_posix())
                shot_ids.append(job.shot_id or job.version_id)
                sources.append({"version_id": job.version_id})
            else:
                asset = self._resource(shot["video_url"], "video", f"shots[{i}].video_url")
                paths.append(str(asset.path))
                shot_ids.append(f"url:{asset.sha256[:12]}")
                sources.append({"video_url": shot["video_url"], "sha256": asset.sha256})
        config = {"work_id": flat["work_id"], "inputs": paths, "shot_ids": shot_ids}
        new = NewJob(
            kind="merge",
            work_id=flat["work_id"],
            job_id=flat.get("job_id"),
            payload_hash=digest,
            callback_url=callback_url,
            callback_context=flat.get("callback_context"),
            request={
                "client": {k: v for k, v in flat.items() if k != "callback_url"},
                "inputs": {"shots": sources},
                "job_name": MERGE_JOB,
                "run_config": {"ops": {"merge_op": {"config": config}}},
            },
        )
        return self._accept(new)


def _callback(req: R2VRequest | MergeRequest, header: str | None) -> str | None:
    """The callback URL to use (the header wins); a bad header URL is a 422 naming the header."""
    try:
        return req.effective_callback_url(header)
    except ValueError as exc:
        raise ApiError(422, str(exc), "header." + CALLBACK_HEADER) from None


def _describe(asset: InputAsset) -> dict[str, Any]:
    """What a client may see of a stored input: never its local path."""
    out = {
        "sha256": asset.sha256,
        "media_type": asset.media_type,
        "bytes": asset.bytes,
        "source": asset.source,
    }
    if asset.width:
        out.update(width=asset.width, height=asset.height)
    return out


def _without_inline_data(value: Any) -> Any:
    """The request as stored and shown by GET /version: data: URLs shortened (they can be MBs)."""
    if isinstance(value, str) and value.startswith("data:"):
        return value.split(",", 1)[0] + ",..."
    if isinstance(value, dict):
        return {k: _without_inline_data(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_without_inline_data(v) for v in value]
    return value
