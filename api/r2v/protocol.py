"""Request and response models of the R2V scheduler contract (r2v spec "HTTP API"), and 422 bodies.

Requests are strict: unknown top-level fields are refused, counts must be positive JSON integers
(``"5"``, ``5.0`` and ``true`` are refused), and every error names its field path the way a client
wrote it, e.g. ``memory_slots[1].audio_url``. No torch, no Dagster.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema

from api.core.errors import InvalidField, error_field
from api.core.limits import MAX_SEED
from api.core.outcome import CONTEXT_FIELDS
from api.core.specs import InputRef, MemoryRef, MergeSource, MergeSpec, ShotSpec, SourceRef

CALLBACK_HEADER = "X-Nanobot-Director-Callback-Url"
MAX_MEMORY_SLOTS = 7
DIRECTOR_PROTOCOL = "director-http-v1"  # the Echo Director's envelope version (its merge requests)

__all__ = [
    "CALLBACK_HEADER",
    "DIRECTOR_PROTOCOL",
    "MAX_MEMORY_SLOTS",
    "MAX_SEED",
    "AcceptedResponse",
    "ArtifactResponse",
    "CallbackRef",
    "JobRef",
    "MemorySlot",
    "MergePayload",
    "MergeRequest",
    "MergeShot",
    "R2VRequest",
    "VersionResponse",
    "error_field",
    "iso_time",
    "validation_error_body",
]

PositiveInt = Annotated[int, Field(gt=0, strict=True)]
PositiveFloat = Annotated[float, Field(gt=0, strict=True)]
NonEmptyStr = Annotated[str, Field(min_length=1, max_length=255)]
Resource = Annotated[
    str, Field(min_length=1, description="data: URL, http(s) URL, file:// URL or absolute path")
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _http_url(value: str) -> str:
    parts = urllib.parse.urlsplit(value)
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an absolute http(s) URL")
    return value


def _non_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be blank")
    return value


# -- POST /r2v ----------------------------------------------------------------------------------


class MemorySlot(_Strict):
    """One memory reference: exactly one of ``shot_id`` or ``image_url`` (the latter optionally with
    ``audio_url`` or ``audio_mode: "empty"``); or a source video for video-to-video (``video_url``
    or a local ``version_id``, optionally with ``strength``), at most one per shot."""

    shot_id: NonEmptyStr | None = Field(
        default=None, description="Newest successful local R2V shot with this id in the same work_id."
    )
    image_url: Resource | None = None
    character_id: str | None = Field(
        default=None,
        pattern=r"^char_[0-9a-f]{32}$",
        description="A character (POST /v1/videos/characters): its frame, and its audio where the model "
        "takes audio.",
    )
    video_url: Resource | None = Field(default=None, description="A source video (video-to-video).")
    version_id: NonEmptyStr | None = Field(
        default=None, description="A succeeded local version whose MP4 is the source video (video-to-video)."
    )
    strength: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="Beside video_url/version_id: how far from the source to go (1: ignore it).",
    )
    audio_url: Resource | None = Field(default=None, description="Only beside image_url.")
    audio_mode: Literal["empty"] | None = Field(default=None, description="Only beside image_url.")
    image_mode: SkipJsonSchema[Any] = None  # present at all -> "image_mode is unsupported"

    @field_validator("shot_id")
    @classmethod
    def _shot_not_blank(cls, v: str | None) -> str | None:
        return None if v is None else _non_blank(v)

    @field_validator("audio_url")
    @classmethod
    def _audio_url_beside_image(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is not None and info.data.get("image_url") is None:
            raise ValueError("audio_url is only allowed beside image_url (not with shot_id)")
        return v

    @field_validator("audio_mode")
    @classmethod
    def _audio_mode_beside_image(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is not None:
            if info.data.get("audio_url") is not None:
                raise ValueError("give audio_url or audio_mode, not both")
            if info.data.get("image_url") is None:
                raise ValueError("audio_mode is only allowed beside image_url (not with shot_id)")
        return v

    @field_validator("image_mode")
    @classmethod
    def _no_image_mode(cls, v: Any) -> Any:
        raise ValueError("image_mode is unsupported")

    @model_validator(mode="after")
    def _exactly_one(self) -> MemorySlot:
        names = ("shot_id", "image_url", "character_id", "video_url", "version_id")
        given = [n for n in names if getattr(self, n) is not None]
        if len(given) != 1:
            raise ValueError(
                "each memory slot needs exactly one of shot_id, image_url, character_id, or (a source "
                "video) video_url or version_id"
            )
        if self.strength is not None and not self.is_source:
            raise ValueError("strength is only allowed beside video_url or version_id")
        return self

    @property
    def is_source(self) -> bool:
        return self.video_url is not None or self.version_id is not None

    def normalized(self) -> dict[str, Any]:
        if self.is_source:
            out = {"video_url": self.video_url} if self.video_url else {"version_id": self.version_id}
            return out if self.strength is None else {**out, "strength": self.strength}
        if self.shot_id is not None:
            return {"shot_id": self.shot_id}
        if self.character_id is not None:
            return {"character_id": self.character_id}
        out: dict[str, Any] = {"image_url": self.image_url}
        if self.audio_url is not None:
            out["audio_url"] = self.audio_url
        if self.audio_mode is not None:
            out["audio_mode"] = self.audio_mode
        return out


class LoraChoice(_Strict):
    """A LoRA adapter configured on the server (``GET /v1/models`` lists them)."""

    name: NonEmptyStr
    scale: float | None = Field(default=None, ge=0, le=4, description="Default: the configured scale.")


class R2VRequest(_Strict):
    work_id: NonEmptyStr = Field(description="Logical project or sequence identifier.")
    shot_id: NonEmptyStr = Field(description="Identifier of the shot being generated.")
    prompt: str = Field(min_length=1, description="Non-empty generation prompt.")
    memory_slots: list[MemorySlot] = Field(
        max_length=MAX_MEMORY_SLOTS, description="Ordered memory references (up to seven; may be empty)."
    )
    job_id: NonEmptyStr | None = Field(default=None, description="Durable idempotency key.")
    condition_img: Resource | None = Field(default=None, description="First-frame image.")
    callback_url: str | None = Field(
        default=None, description="http(s) endpoint notified on success/failure."
    )
    callback_context: dict[str, Any] | None = None
    num_frames: PositiveInt | None = None
    duration_sec: PositiveFloat | None = None
    width: PositiveInt | None = None
    height: PositiveInt | None = None
    seed: Annotated[int, Field(strict=True, ge=0, lt=MAX_SEED)] | None = Field(
        default=None, description="Generation seed, 0 <= seed < 2**32 (as /v1). Default: drawn."
    )
    num_inference_steps: PositiveInt | None = Field(
        default=None,
        description="Denoising steps: a native model takes 1 to the server's api.sampling.max_steps; "
        "a distilled (dmd) one, or a distill adapter, its own count only. Default: the sampler's.",
    )
    guidance_scale: Annotated[float, Field(ge=0, le=100, strict=True)] | None = Field(
        default=None,
        description="Classifier-free guidance (above 1: two DiT calls a step), within the server's "
        "api.sampling.guidance_scale range and the model's. Default: the sampler's.",
    )
    step_cache: Annotated[str, Field(min_length=1, max_length=64, strict=True)] | None = Field(
        default=None,
        description="A step cache preset of the model (its performance.step_caches) that the server's "
        'api.sampling.step_caches allows, or "none". Default: the model\'s performance.step_cache.',
    )
    lora: LoraChoice | None = Field(default=None, description="A configured LoRA adapter for this shot.")

    @field_validator("work_id", "shot_id", "prompt", "job_id")
    @classmethod
    def _strings_not_blank(cls, v: str | None) -> str | None:
        return None if v is None else _non_blank(v)

    @field_validator("callback_url")
    @classmethod
    def _callback_http(cls, v: str | None) -> str | None:
        return None if v is None else _http_url(v)

    def effective_callback_url(self, header_value: str | None = None) -> str | None:
        """The ``X-Nanobot-Director-Callback-Url`` header wins over ``callback_url``."""
        if header_value:
            return _http_url(header_value.strip())
        return self.callback_url

    def normalized(self) -> dict[str, Any]:
        """Canonical dict (unset fields dropped, slots in canonical form), incl. callback fields."""
        out = self.model_dump(exclude_none=True, exclude={"memory_slots"})
        out["memory_slots"] = [slot.normalized() for slot in self.memory_slots]
        return out

    def idempotency_payload(self) -> dict[str, Any]:
        """What ``payload_hash`` should cover: the generation request without job_id and callback
        delivery details (a retry that only changes where to call back is the same job)."""
        out = self.normalized()
        for key in ("job_id", "callback_url", "callback_context"):
            out.pop(key, None)
        return {"kind": "r2v", **out}

    def to_spec(self, callback_header: str | None = None, submitter: str | None = None) -> ShotSpec:
        """The dialect-neutral shot (the header's callback URL wins over the body's)."""
        memory, source, strength = [], None, None
        for i, slot in enumerate(self.memory_slots):
            field = f"memory_slots[{i}]"
            if slot.is_source:
                name = f"{field}.video_url" if slot.video_url else f"{field}.version_id"
                if source is not None:
                    raise InvalidField("one source video per shot", name)
                video = InputRef(name, slot.video_url) if slot.video_url else None
                source, strength = SourceRef(name, version_id=slot.version_id, video=video), slot.strength
            elif slot.character_id is not None:
                memory.append(MemoryRef(f"{field}.character_id", character_id=slot.character_id))
            elif slot.shot_id is not None:
                memory.append(MemoryRef(field, shot_id=slot.shot_id))
            else:
                audio = InputRef(f"{field}.audio_url", slot.audio_url) if slot.audio_url else None
                memory.append(
                    MemoryRef(field, image=InputRef(f"{field}.image_url", slot.image_url), audio=audio)
                )
        return ShotSpec(
            work_id=self.work_id,
            shot_id=self.shot_id,
            prompt=self.prompt,
            client=self.normalized(),
            idempotency_payload=self.idempotency_payload(),
            seed=self.seed,
            width=self.width,
            height=self.height,
            num_frames=self.num_frames,
            guidance_scale=self.guidance_scale,
            num_inference_steps=self.num_inference_steps,
            step_cache=self.step_cache,
            first_frame=InputRef("condition_img", self.condition_img) if self.condition_img else None,
            memory=tuple(memory),
            memory_field="memory_slots",
            source=source,
            strength=strength,
            lora=self.lora.name if self.lora else None,
            lora_scale=self.lora.scale if self.lora else None,
            job_id=self.job_id,
            callback_url=_callback(self, callback_header),
            callback_context=self.callback_context,
            submitter=submitter,
        )


# -- POST /merge --------------------------------------------------------------------------------


ShotNumber = Annotated[int, Field(strict=True, ge=0)] | NonEmptyStr


class MergeShot(_Strict):
    """A local R2V ``version_id`` or an absolute http(s) ``video_url`` (``version_id`` wins if both).

    ``shot_id``: the Echo Director numbers each shot of its envelope's ``payload.shots``; accepted
    (a number or a string) and not used: the list's order is the film's."""

    version_id: NonEmptyStr | None = None
    video_url: str | None = None
    shot_id: ShotNumber | None = Field(
        default=None, description="The Echo Director's shot number; accepted, not used (order is the list's)."
    )

    @field_validator("video_url")
    @classmethod
    def _video_http(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is None or info.data.get("version_id") is not None:  # beside a version_id: not used
            return v
        return _http_url(v)

    @model_validator(mode="after")
    def _one_source(self) -> MergeShot:
        if self.version_id is None and self.video_url is None:
            raise ValueError("each shot needs a version_id or a video_url")
        return self

    def normalized(self) -> dict[str, Any]:
        return (
            {"version_id": self.version_id} if self.version_id is not None else {"video_url": self.video_url}
        )


class JobRef(BaseModel):
    model_config = ConfigDict(extra="allow")  # the Echo Director's envelope; unknown keys are ignored
    job_id: NonEmptyStr | None = None


class CallbackRef(BaseModel):
    """The envelope's ``callback``: ``url``, and the routing ``session_key``/``channel``/``chat_id``,
    which become the job's ``callback_context`` (with ``context``, if given: they must agree); the
    callback body carries them back at its top level (:data:`api.core.outcome.CONTEXT_FIELDS`)."""

    model_config = ConfigDict(extra="allow")  # its other keys (event_type, target, ...) are ignored
    url: str | None = None
    context: dict[str, Any] | None = None
    session_key: str | None = None
    channel: str | None = None
    chat_id: str | None = None

    def routing(self) -> dict[str, str] | None:
        given = {k: v for k in CONTEXT_FIELDS if (v := getattr(self, k)) is not None}
        return given or None

    @field_validator("url")
    @classmethod
    def _http(cls, v: str | None) -> str | None:
        return None if v is None else _http_url(v)


class MergePayload(BaseModel):
    """The envelope's ``payload`` object; it may carry the merge fields itself."""

    model_config = ConfigDict(extra="allow")
    work_id: NonEmptyStr | None = None
    job_id: NonEmptyStr | None = None
    shots: list[MergeShot] | None = None
    shot_ids: list[ShotNumber] | None = Field(
        default=None, description="The Echo Director's list of the shots' numbers; accepted, not used."
    )
    callback_url: str | None = None
    callback_context: dict[str, Any] | None = None

    @field_validator("callback_url")
    @classmethod
    def _http(cls, v: str | None) -> str | None:
        return None if v is None else _http_url(v)


class MergeRequest(_Strict):
    """Flat fields, or the Echo Director envelope (``protocol_version``, ``operation``, ``payload``,
    ``job.job_id``, ``callback.url`` and its routing), or a mix; a value given in two places must
    agree. Use :meth:`normalized` for the flat form."""

    protocol_version: NonEmptyStr | None = Field(
        default=None, description=f"The Echo Director envelope's version ({DIRECTOR_PROTOCOL!r})."
    )
    operation: Literal["merge_shot"] | None = Field(
        default=None, description="The Echo Director envelope's operation: merge_shot on /merge."
    )
    work_id: NonEmptyStr | None = None
    job_id: NonEmptyStr | None = None
    shots: list[MergeShot] | None = Field(default=None, description="Ordered shots (at least one).")
    callback_url: str | None = None
    callback_context: dict[str, Any] | None = None
    payload: MergePayload | None = None
    job: JobRef | None = None
    callback: CallbackRef | None = None

    @field_validator("callback_url")
    @classmethod
    def _http(cls, v: str | None) -> str | None:
        return None if v is None else _http_url(v)

    @model_validator(mode="after")
    def _complete(self) -> MergeRequest:
        flat = self._flatten()
        if not flat.get("work_id"):
            raise ValueError("work_id is required (top level or payload.work_id)")
        if not flat.get("shots"):
            raise ValueError("shots must list at least one shot (top level or payload.shots)")
        return self

    def _flatten(self) -> dict[str, Any]:
        p = self.payload or MergePayload()
        sources: dict[str, list[tuple[str, Any]]] = {
            "work_id": [("work_id", self.work_id), ("payload.work_id", p.work_id)],
            "job_id": [
                ("job_id", self.job_id),
                ("job.job_id", self.job.job_id if self.job else None),
                ("payload.job_id", p.job_id),
            ],
            "shots": [
                ("shots", [s.normalized() for s in self.shots] if self.shots is not None else None),
                ("payload.shots", [s.normalized() for s in p.shots] if p.shots is not None else None),
            ],
            "callback_url": [
                ("callback_url", self.callback_url),
                ("callback.url", self.callback.url if self.callback else None),
                ("payload.callback_url", p.callback_url),
            ],
            "callback_context": [
                ("callback_context", self.callback_context),
                ("callback.context", self.callback.context if self.callback else None),
                ("payload.callback_context", p.callback_context),
            ],
        }
        flat: dict[str, Any] = {}
        for key, candidates in sources.items():
            given = [(name, v) for name, v in candidates if v is not None]
            if not given:
                continue
            first_name, first = given[0]
            for name, v in given[1:]:
                if v != first:
                    raise ValueError(f"{first_name} and {name} disagree")
            flat[key] = first
        routing = self.callback.routing() if self.callback else None
        if routing:  # the envelope's callback routing joins the context (the same key must agree)
            context = dict(flat.get("callback_context") or {})
            for key, v in routing.items():
                if key in context and context[key] != v:
                    raise ValueError(f"callback.{key} and the callback context's {key} disagree")
                context[key] = v
            flat["callback_context"] = context
        return flat

    def normalized(self) -> dict[str, Any]:
        """Flat request: work_id, shots [{version_id} | {video_url}], and job_id/callback_url/
        callback_context when given."""
        return self._flatten()

    def effective_callback_url(self, header_value: str | None = None) -> str | None:
        if header_value:
            return _http_url(header_value.strip())
        return self._flatten().get("callback_url")

    def idempotency_payload(self) -> dict[str, Any]:
        flat = self._flatten()
        return {"kind": "merge", "work_id": flat["work_id"], "shots": flat["shots"]}

    def to_spec(self, callback_header: str | None = None, submitter: str | None = None) -> MergeSpec:
        flat = self.normalized()
        shots = []
        for i, shot in enumerate(flat["shots"]):
            if "version_id" in shot:
                shots.append(MergeSource(f"shots[{i}].version_id", version_id=shot["version_id"]))
            else:
                shots.append(
                    MergeSource(
                        f"shots[{i}].video_url", video=InputRef(f"shots[{i}].video_url", shot["video_url"])
                    )
                )
        return MergeSpec(
            work_id=flat["work_id"],
            shots=tuple(shots),
            client={k: v for k, v in flat.items() if k != "callback_url"},
            idempotency_payload=self.idempotency_payload(),
            job_id=flat.get("job_id"),
            callback_url=_callback(self, callback_header),
            callback_context=flat.get("callback_context"),
            submitter=submitter,
        )


def _callback(req: R2VRequest | MergeRequest, header: str | None) -> str | None:
    """The callback URL to use (the header wins); a bad header URL names the header."""
    try:
        return req.effective_callback_url(header)
    except ValueError as exc:
        raise InvalidField(str(exc), "header." + CALLBACK_HEADER) from None


# -- responses ----------------------------------------------------------------------------------

Status = Literal["queued", "running", "succeeded", "failed"]


def iso_time(t: float | None) -> str | None:
    """Unix seconds (as the store keeps them) -> ISO 8601 UTC."""
    return None if t is None else datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


class ArtifactResponse(BaseModel):
    """``GET /artifact/{id}`` and the ``artifacts`` list items; never a local filesystem path."""

    artifact_id: str
    version_id: str
    work_id: str
    shot_id: str | None = None
    kind: str
    role: str
    url: str
    bytes: int | None = None
    sha256: str | None = None
    created_at: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class _TaskFields(BaseModel):
    kind: Literal["r2v", "merge"]
    task_id: str
    version_id: str
    remote_task_id: str
    work_id: str
    job_id: str | None = None
    shot_id: str | None = None
    status: Status
    stage: str
    queue_position: int | None = None
    status_url: str
    artifacts: list[ArtifactResponse] = Field(default_factory=list)


class AcceptedResponse(_TaskFields):
    """The answer to ``POST /r2v`` and ``POST /merge`` (task_id = version_id = remote_task_id)."""

    accepted: bool = True


class VersionResponse(_TaskFields):
    """``GET /version/{id}``."""

    error: str | None = None
    video_url: str | None = None
    created_at: str | None = None
    updated_at: str | None = None
    finished_at: str | None = None
    run_id: str | None = None
    stage_times: dict[str, float] = Field(default_factory=dict)
    progress: dict[str, Any] | None = None
    worker: dict[str, Any] | None = Field(default=None, description="Device worker and resource snapshot.")
    result: dict[str, Any] | None = None
    request: dict[str, Any] | None = Field(
        default=None, description="The normalized request (no local paths)."
    )
    inputs: dict[str, Any] = Field(
        default_factory=dict,
        description="Lineage: each input's content hash and the version or character it came from.",
    )
    derived_from: list[str] = Field(
        default_factory=list, description="Lineage: the versions this one was made from (shots of a film)."
    )
    num_inference_steps: int | None = Field(
        default=None,
        description="A shot's denoising steps: what its run recorded once it succeeded, else what it "
        "asked for or its sampler's default.",
    )
    guidance_scale: float | None = Field(default=None, description="A shot's guidance, the same way.")
    sampler_mode: str | None = Field(default=None, description="native | dmd: how the shot is sampled.")
    step_cache: str | None = Field(
        default=None, description='A shot\'s step cache (a preset name, or "none"), the same way.'
    )


# -- 422 bodies ---------------------------------------------------------------------------------


def _clean_message(msg: str) -> str:
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            return msg[len(prefix) :]
    return msg


def validation_error_body(errors: ValidationError | Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A 422 body: ``{"detail": [{"field", "loc", "msg", "type"}], "error": "<field>: <message>"}``.

    Accepts a pydantic ``ValidationError`` or FastAPI's ``RequestValidationError.errors()`` (whose
    locations start with ``body``). ``error`` describes the first problem.
    """
    raw = errors.errors(include_url=False) if isinstance(errors, ValidationError) else list(errors)
    detail = []
    for err in raw:
        loc = [p for p in err.get("loc", ()) if isinstance(p, str | int)]
        detail.append(
            {
                "field": error_field(loc),
                "loc": loc,
                "msg": _clean_message(str(err.get("msg", "invalid value"))),
                "type": str(err.get("type", "value_error")),
            }
        )
    first = detail[0] if detail else {"field": "body", "msg": "invalid request"}
    return {"detail": detail, "error": f"{first['field']}: {first['msg']}"}
