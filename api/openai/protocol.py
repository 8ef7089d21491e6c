"""Request and response models of the OpenAI-compatible video API (``/v1``).

The canonical request follows vLLM-Omni and takes SGLang's flat extensions and FastVideo's legacy
spellings (../shared/spec/openai-video-contract.md). One model parses both the JSON body and the
SDK's multipart form (see :mod:`api.openai.forms`): values are parsed laxly, so ``"16"`` in a form
means what ``16`` means in JSON. Unknown top-level fields are refused. Which fields the client
actually set comes from ``model_fields_set``; defaults never masquerade as intent.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from api.core.errors import InvalidField, NotFound
from api.core.limits import MAX_SEED
from api.core.sampling import SamplingRule
from api.core.specs import GuideRef, InputRef, MemoryRef, ShotSpec, SourceRef
from shotloom.capabilities import Capabilities, CapabilityError
from shotloom.guides import anchor

SIZE_PATTERN = r"^[1-9][0-9]{0,4}x[1-9][0-9]{0,4}$"
CHARACTER_ID_PATTERN = r"^char_[0-9a-f]{32}$"
MAX_GUIDES = 16  # entries of ``guides`` a request may list (the model may take fewer)
FILE_FIELDS = ("input_reference", "first_frame", "last_frame")  # file parts besides the guides'
URL_DESCRIPTION = "data: URL, http(s) URL, file:// URL or absolute path (under the server's allowed roots)"

Positive = Annotated[int, Field(gt=0, le=100_000)]
StepCacheName = Annotated[str, Field(min_length=1, max_length=64)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ReferenceObject(_Strict):
    """A reference to media: an ``image_url`` (in ``image_reference``, optionally with its
    ``audio_url``), or, in ``image_reference`` only, a ``video_url``: the source video, as an R2V
    memory slot's ``video_url`` is. Keyframes (``first_frame``, ``last_frame``,
    ``input_reference``) take an image alone. ``file_id`` is understood but refused (no Files
    store)."""

    image_url: str | None = Field(default=None, min_length=1, description=URL_DESCRIPTION)
    video_url: str | None = Field(default=None, min_length=1, description=URL_DESCRIPTION)
    audio_url: str | None = Field(default=None, min_length=1, description=URL_DESCRIPTION)
    file_id: str | None = Field(default=None, description="Refused: this server has no Files store.")

    @field_validator("image_url", "video_url", "audio_url", mode="before")
    @classmethod
    def _url_object(cls, v: Any) -> Any:
        # Chat-style {"url": "..."} objects are the same reference.
        if isinstance(v, dict) and set(v) == {"url"}:
            return v["url"]
        return v


class VideoParams(_Strict):
    width: Positive | None = None
    height: Positive | None = None
    fps: Positive | None = None
    num_frames: Positive | None = None


Name = Annotated[str, Field(min_length=1, max_length=255, pattern=r"\S")]


class ExtraParams(_Strict):
    """The allow-list of ``extra_params``: place the video in a work and shot of yours."""

    work_id: Name | None = None
    shot_id: Name | None = None


class LoraSelector(_Strict):
    """A LoRA adapter configured on the server, by name (``path`` is refused: adapters are loaded
    once at start, never from a request)."""

    name: str = Field(min_length=1, max_length=64)
    path: str | None = Field(default=None, description="Refused: adapters are configured on the server.")
    scale: float | None = Field(default=None, ge=0, le=4, description="Default: the configured scale.")


Reference = str | ReferenceObject


class GuideEntry(_Strict):
    """One entry of ``guides``: a file part of the multipart form, anchored at a frame."""

    file: str = Field(min_length=1, max_length=255, description="The name of the form's file part.")
    frame: int = Field(
        ge=-100_000,
        le=100_000,
        description="The clip frame it starts at; below 0 counted from the end (-1: the last frame).",
    )
    kind: Literal["video", "audio"] = Field(
        default="video",
        description="video: an image, or a video with its sound; audio: a sound alone.",
    )


class VideoCreateRequest(_Strict):
    """``POST /v1/videos`` (JSON or multipart form)."""

    prompt: str = Field(min_length=1, max_length=20_000, description="What the clip shows. Required.")
    model: str | None = Field(default=None, description="A served model id; optional with one model.")
    seconds: float | None = Field(
        default=None, gt=0, description='Length in seconds (number or string such as "4").'
    )
    size: str | None = Field(default=None, pattern=SIZE_PATTERN, description='WxH, e.g. "832x480".')
    width: Positive | None = None
    height: Positive | None = None
    fps: Positive | None = None
    num_frames: Positive | None = Field(
        default=None, description="Frames; must lie on the model's frame grid."
    )
    video_params: VideoParams | None = None
    seed: int | None = Field(
        default=None, ge=0, lt=MAX_SEED, description="Random (and reported) when absent."
    )
    num_inference_steps: Positive | None = Field(
        default=None,
        description="Denoising steps: a native model takes 1 to the server's max_steps; a distilled "
        "one (or a distill adapter) its own count only. Default: the sampler's (GET /v1/models/{id}).",
    )
    guidance_scale: float | None = Field(
        default=None,
        ge=0,
        le=100,
        description="Classifier-free guidance (above 1: two DiT calls a step), within the model's "
        "range on this server. Default: the sampler's.",
    )
    step_cache: StepCacheName | None = Field(
        default=None,
        description="A step cache preset of the model (its performance.step_caches) that this server "
        'offers, or "none": skip DiT work between steps. Default: the model\'s (GET /v1/models/{id}).',
    )
    negative_prompt: str | None = Field(default=None, max_length=20_000)
    first_frame: Reference | None = Field(default=None, description="An image the clip starts at.")
    last_frame: Reference | None = Field(default=None, description="An image the clip ends at.")
    input_reference: Reference | None = Field(
        default=None, description="The OpenAI name of first_frame (a file part in multipart)."
    )
    reference_url: str | None = Field(default=None, description="Legacy spelling of input_reference.")
    image_reference: list[ReferenceObject] | None = Field(
        default=None,
        description="Reference images (memory slots), each optionally with its audio_url; an entry "
        "with a video_url instead is the source video (video-to-video, one per request).",
    )
    characters: list[Annotated[str, Field(pattern=CHARACTER_ID_PATTERN)]] | None = Field(
        default=None,
        description="Characters (POST /v1/videos/characters) as memory: their frame, and their audio "
        "where the model takes audio; counted with image_reference against the model's limit.",
    )
    video_url: str | None = Field(
        default=None, description="A source video (video-to-video), as a URL string.", min_length=1
    )
    video_path: str | None = Field(default=None, description="Legacy spelling of video_url.", min_length=1)
    strength: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="Video-to-video: how far from the source to go (1: ignore it); default: the model's.",
    )
    guides: list[GuideEntry] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_GUIDES,
        description="Images, videos and sounds anchored at frames of the clip (multipart only): each "
        'a file part, listed here as {"file": its field name, "frame", "kind": "video" | "audio"}; '
        "in a form, the list as one JSON string.",
    )
    guide_no_audio: bool | None = Field(
        default=None, description="true: guide videos anchor their frames without their sound."
    )
    lora: LoraSelector | None = None
    extra_params: ExtraParams | None = Field(default=None, description="An allow-list of extensions.")

    @field_validator("seconds", mode="before")
    @classmethod
    def _seconds(cls, v: Any) -> Any:
        if isinstance(v, bool):
            raise ValueError("must be a number of seconds")
        if isinstance(v, str):
            try:
                return float(v.strip())
            except ValueError:
                raise ValueError('must be a number of seconds, e.g. "4"') from None
        return v

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be blank")
        return v

    @field_validator("image_reference", mode="before")
    @classmethod
    def _one_reference(cls, v: Any) -> Any:
        return [v] if isinstance(v, dict) else v

    @field_validator("guides", mode="before")
    @classmethod
    def _guides_json(cls, v: Any) -> Any:
        # A form carries the list as one JSON string (the contract's -F 'guides=[...]').
        if isinstance(v, str):
            try:
                v = json.loads(v)
            except json.JSONDecodeError:
                raise ValueError(
                    'must be a JSON list such as [{"file": "guide_0", "frame": 48, "kind": "audio"}]'
                ) from None
        return [v] if isinstance(v, dict) else v

    def explicit(self) -> dict[str, Any]:
        """Only the fields the client set (``model_fields_set``), as plain data."""
        return self.model_dump(include=self.model_fields_set, exclude_none=True, mode="json")

    def to_spec(
        self,
        model: ServedModel,
        *,
        operator: VideoCreateRequest | None,
        uploads: dict[str, Path],
        version_id: str,
        seed: int,
        job_id: str | None = None,
        submitter: str | None = None,
        upload_digests: dict[str, str] | None = None,
        source: SourceRef | None = None,
        extends: SourceRef | None = None,
    ) -> ShotSpec:
        """The dialect-neutral shot: fields the client set, then the operator's ``default_request``,
        then the model's preset, within this server's limits (size, seconds). What the model can
        honour is the rule book's to check (the job service), naming the client's fields."""
        lora, lora_scale = self._adapter(model)
        self._check_parts(uploads)
        layers = [self.geometry(), operator.geometry() if operator else {}]
        size = next((g for g in layers if "width" in g), {"width": model.width, "height": model.height})
        size_field = size.get("size_field", "size")
        for key, most in (("width", model.max_width), ("height", model.max_height)):
            if size[key] > most:
                raise InvalidField(f"{key} is at most {most} on this server, got {size[key]}", size_field)
        rate = next((g for g in layers if "fps" in g), {"fps": model.fps, "fps_field": "fps"})
        frames = _frames(self, layers[0], rate["fps"], model)
        if frames is None and operator is not None:
            frames = _frames(operator, layers[1], rate["fps"], model)
        num_frames, frames_field = frames or (model.num_frames, "num_frames")

        def pick(name: str) -> Any:
            value = getattr(self, name)
            return value if value is not None or operator is None else getattr(operator, name)

        # Steps, guidance and the step cache are checked against the request's sampler by the job
        # service.
        steps, guidance = pick("num_inference_steps"), pick("guidance_scale")
        negative = pick("negative_prompt")
        effective = guidance if guidance is not None else model.sampling_for(lora).guidance_scale
        if negative and effective <= 1.0:
            raise InvalidField(
                "has no effect without classifier-free guidance: set guidance_scale above 1",
                "negative_prompt",
            )
        source = self._source(source)
        extra = self.extra_params or ExtraParams()
        shot_id = extra.shot_id or video_id(version_id)
        client = {"model": model.id, **self.explicit()}
        for name, digest in (upload_digests or {}).items():
            client[name] = {"upload_sha256": digest}
        return ShotSpec(
            work_id=extra.work_id or model.default_work,
            shot_id=shot_id,
            prompt=self.prompt,
            client=client,
            idempotency_payload={"kind": "v1", **client},
            dialect="openai",
            negative_prompt=negative,
            seed=seed,
            width=size["width"],
            height=size["height"],
            num_frames=num_frames,
            fps=rate["fps"],
            guidance_scale=guidance,
            num_inference_steps=steps,
            step_cache=pick("step_cache"),
            first_frame=self._keyframe(("first_frame", "input_reference", "reference_url"), uploads),
            last_frame=self._keyframe(("last_frame",), uploads),
            memory=self._memory(),
            memory_field="image_reference",
            source=source,
            strength=self.strength,
            extends=extends,
            lora=lora,
            lora_scale=lora_scale,
            guides=self._guides(uploads, num_frames),
            guide_no_audio=bool(self.guide_no_audio),
            job_id=job_id,
            submitter=submitter,
            version_id=version_id,
            field_names={
                "work_id": "extra_params.work_id",
                "shot_id": "extra_params.shot_id",
                "width": size_field,
                "height": size_field,
                "num_frames": frames_field,
                "fps": rate["fps_field"],
            },
        )

    def _check_parts(self, uploads: dict[str, Path]) -> None:
        """Each guide names a file part of the form; every file part is a keyframe or a guide."""
        for i, entry in enumerate(self.guides or ()):
            field = f"guides[{i}].file"
            if entry.file in FILE_FIELDS:
                raise InvalidField(f"{entry.file!r} is a keyframe field, not a guide's file part", field)
            if entry.file not in uploads:
                raise InvalidField(
                    f"no file part {entry.file!r} in the request: guides need a multipart form, "
                    "each guide a file part named here",
                    field,
                )
        named = {g.file for g in self.guides or ()}
        for name in sorted(uploads):
            if name not in FILE_FIELDS and name not in named:
                raise InvalidField(
                    f"unexpected file part {name!r}: a file goes in {', '.join(FILE_FIELDS)}, "
                    "or is a guide named in guides",
                    name,
                )

    def _guides(self, uploads: dict[str, Path], num_frames: int) -> tuple[GuideRef, ...]:
        """Each guide's file part and its frame in this clip (from the end when below 0). Which
        guides the model can take is the capability check's (the job service), with the files."""
        out = []
        for i, entry in enumerate(self.guides or ()):
            field = f"guides[{i}]"
            try:
                frame = anchor(entry.frame, num_frames, f"{field}.frame")
            except CapabilityError as exc:
                raise InvalidField(exc.message, exc.field) from None
            out.append(GuideRef(field, InputRef(field, upload=uploads[entry.file]), frame, entry.kind))
        return tuple(out)

    def _adapter(self, model: ServedModel) -> tuple[str | None, float | None]:
        """The adapter this request selects, by ``model`` (an adapter's nickname) or ``lora``."""
        served = [model.id, *model.adapters]
        if self.model is not None and self.model not in served:
            raise NotFound(
                f"the model {self.model!r} is not served here (served: {', '.join(served)})",
                "model",
                "model_not_found",
            )
        by_model = self.model if self.model in model.adapters else None
        if self.lora is None:
            return by_model, None
        if self.lora.path is not None:
            raise InvalidField("adapters are configured on the server: select one by name", "lora.path")
        if self.lora.name not in model.adapters:
            configured = ", ".join(model.adapters) or "none"
            raise InvalidField(
                f"no adapter {self.lora.name!r} is configured (configured: {configured})", "lora"
            )
        if by_model is not None and by_model != self.lora.name:
            raise InvalidField(f"the model {self.model!r} is itself an adapter; lora names another", "lora")
        return self.lora.name, self.lora.scale

    def _source(self, given: SourceRef | None) -> SourceRef | None:
        """The source video: the route's (remix, edit, extension), or one of ``video_url``,
        ``video_path`` and an ``image_reference`` entry's ``video_url`` (as an R2V memory slot's
        ``video_url``); one per request, a second is refused naming its field."""
        named = [(n, getattr(self, n)) for n in ("video_url", "video_path") if getattr(self, n) is not None]
        for i, ref in enumerate(self.image_reference or ()):
            if ref.video_url is not None:
                named.append((_source_ref(ref, f"image_reference[{i}]"), ref.video_url))
        if given is not None and named:
            raise InvalidField("this request already has its source video", named[0][0])
        if len(named) > 1:
            raise InvalidField(f"one source video per request: {named[0][0]} is already one", named[1][0])
        if named:
            name, value = named[0]
            return SourceRef(name, video=InputRef(name, value))
        return given

    def _keyframe(self, names: tuple[str, ...], uploads: dict[str, Path]) -> InputRef | None:
        given = [n for n in names if getattr(self, n, None) is not None or n in uploads]
        if len(given) > 1:
            raise InvalidField(f"give one of {', '.join(given)}, not several", given[1])
        if not given:
            return None
        name = given[0]
        if name in uploads:
            return InputRef(name, upload=uploads[name])
        value = getattr(self, name)
        if isinstance(value, str):
            return InputRef(name, value)
        return _image_ref(value, name)

    def _memory(self) -> tuple[MemoryRef, ...]:
        out = []
        for i, ref in enumerate(self.image_reference or ()):
            if ref.video_url is not None:
                continue  # the source video (see _source), not a memory slot
            field = f"image_reference[{i}]"
            image = _memory_image(ref, field)
            audio = InputRef(f"{field}.audio_url", ref.audio_url) if ref.audio_url else None
            out.append(MemoryRef(field, image=image, audio=audio))
        for i, character in enumerate(self.characters or ()):
            out.append(MemoryRef(f"characters[{i}]", character_id=character))
        return tuple(out)

    def geometry(self) -> dict[str, Any]:
        """The size, rate and length this request asks for, by the contract's precedence: ``size``,
        then top-level ``width``/``height``, then ``video_params``; top-level ``fps`` and
        ``num_frames`` over ``video_params``. Only what was set; keys: width, height, fps,
        num_frames, seconds, and ``size_field`` (which field gave the size)."""
        out: dict[str, Any] = {}
        vp = self.video_params or VideoParams()
        for prefix, pair in (("", self), ("video_params.", vp)):
            if (pair.width is None) != (pair.height is None):
                missing = "height" if pair.height is None else "width"
                raise InvalidField(
                    f"width and height go together: give {prefix}{missing} too", prefix + missing
                )
        if self.size is not None:
            w, h = (int(x) for x in self.size.split("x"))
            out.update(width=w, height=h, size_field="size")
        elif self.width is not None:
            out.update(width=self.width, height=self.height, size_field="width")
        elif vp.width is not None:
            out.update(width=vp.width, height=vp.height, size_field="video_params.width")
        fps = self.fps if self.fps is not None else vp.fps
        if fps is not None:
            out["fps"] = fps
            out["fps_field"] = "fps" if self.fps is not None else "video_params.fps"
        frames = self.num_frames if self.num_frames is not None else vp.num_frames
        if frames is not None:
            out["num_frames"] = frames
            out["frames_field"] = "num_frames" if self.num_frames is not None else "video_params.num_frames"
        if self.seconds is not None:
            out["seconds"] = self.seconds
        return out


@dataclass(frozen=True)
class ServedModel:
    """What the loaded model is and can honour (from the inference YAML and the workers)."""

    id: str
    family: str
    caps: Capabilities
    width: int
    height: int
    num_frames: int
    fps: int
    sampling: SamplingRule  # the model's sampler under the server's limits
    max_seconds: float
    max_width: int
    max_height: int
    default_work: str
    created: int
    adapters: dict[str, float] = field(default_factory=dict)  # LoRA nickname -> its default scale
    adapter_sampling: dict[str, SamplingRule] = field(default_factory=dict)  # adapters with their own

    def sampling_for(self, adapter: str | None) -> SamplingRule:
        """The sampler a request with ``adapter`` (or none) runs with."""
        return self.adapter_sampling.get(adapter or "", self.sampling)


def snap_frames(seconds: float, fps: int, multiple: int) -> int:
    """Frames for ``seconds`` at ``fps`` on the grid ``multiple*k + 1``: the smallest grid count that
    covers ``seconds * fps`` (at least ``multiple + 1``), so a clip is never shorter than asked."""
    target = seconds * fps
    k = max(1, math.ceil(round(target - 1, 6) / multiple))
    return multiple * k + 1


def _frames(
    req: VideoCreateRequest, g: dict[str, Any], fps: int, model: ServedModel
) -> tuple[int, str] | None:
    """(num_frames, the field that decided it) from one layer of the request, or None."""
    caps = model.caps
    if "num_frames" in g:
        n, field = g["num_frames"], g["frames_field"]
        most = snap_frames(model.max_seconds, fps, caps.frame_multiple)  # what max_seconds gives
        if n > most:
            raise InvalidField(
                f"at most {most} at {fps} fps on this server ({model.max_seconds:g} s), got {n}", field
            )
        return n, field
    if "seconds" in g:
        seconds = g["seconds"]
        if seconds > model.max_seconds:
            raise InvalidField(f"at most {model.max_seconds:g} on this server, got {seconds:g}", "seconds")
        return snap_frames(seconds, fps, caps.frame_multiple), "seconds"
    return None


def _no_file_id(ref: ReferenceObject, field: str) -> None:
    if ref.file_id is not None:
        raise InvalidField(
            "file_id references are not served (no Files store): send image_url", f"{field}.file_id"
        )


def _image_ref(ref: ReferenceObject, field: str) -> InputRef:
    """A keyframe (``first_frame``, ``last_frame``, ``input_reference``): one image, nothing else."""
    _no_file_id(ref, field)
    if ref.video_url is not None:
        raise InvalidField(
            "a keyframe is an image; a source video goes in video_url or an image_reference entry",
            f"{field}.video_url",
        )
    if ref.audio_url is not None:
        raise InvalidField(
            "a keyframe is an image and cannot carry audio; audio goes beside an image_reference "
            "entry's image_url",
            f"{field}.audio_url",
        )
    if ref.image_url is None:
        raise InvalidField("needs an image_url", field)
    return InputRef(f"{field}.image_url", ref.image_url)


def _memory_image(ref: ReferenceObject, field: str) -> InputRef:
    """An ``image_reference`` entry's image (its ``audio_url`` becomes the slot's audio)."""
    _no_file_id(ref, field)
    if ref.image_url is None:
        raise InvalidField("needs an image_url (or a video_url: the source video)", field)
    return InputRef(f"{field}.image_url", ref.image_url)


def _source_ref(ref: ReferenceObject, field: str) -> str:
    """The field of an ``image_reference`` entry that is the source video (its ``video_url``)."""
    _no_file_id(ref, field)
    for other in ("image_url", "audio_url"):
        if getattr(ref, other) is not None:
            raise InvalidField(
                f"an entry with a video_url (the source video) takes no {other}; give it its own entry"
                if other == "image_url"
                else "audio_url goes beside an image_url, not beside a source video",
                f"{field}.{other}",
            )
    return f"{field}.video_url"


# -- responses ----------------------------------------------------------------------------------

VideoStatus = Literal["queued", "in_progress", "completed", "failed", "cancelled"]


class VideoError(BaseModel):
    code: str
    message: str
    param: str | None = None
    type: str = "server_error"
    status: int = Field(description="The HTTP status the request would have had.")


class VideoExtension(BaseModel):
    """shotloom's own block of the video object."""

    frames: int | None = None
    fps: int | None = None
    seed: int | None = None
    steps: int | None = Field(default=None, description="Denoising steps the job runs (ran) with.")
    guidance_scale: float | None = Field(default=None, description="The guidance it runs (ran) with.")
    sampler_mode: str | None = Field(default=None, description="native | dmd: how it is sampled.")
    step_cache: str | None = Field(
        default=None, description='The step cache it runs (ran) with: a preset name, or "none".'
    )
    strength: float | None = Field(default=None, description="Video-to-video: how far from the source.")
    step: int | None = Field(default=None, description="Denoise steps done.")
    phase: str | None = Field(default=None, description="The work now running (a stage name).")
    eta_s: float | None = Field(default=None, description="Seconds the job still expects to take.")
    file_name: str | None = None
    stage_timings: dict[str, float] = Field(default_factory=dict)
    peak_memory_mb: float | None = Field(
        default=None,
        description="Peak memory of the run, recorded when the MP4 was written: the CUDA allocator's "
        "peak on a GPU, the worker process's peak resident set on a CPU.",
    )
    queue_position: int | None = None
    worker: str | None = None
    work_id: str | None = None
    shot_id: str | None = None
    version_id: str | None = None


class Video(BaseModel):
    """The OpenAI video object."""

    id: str
    object: Literal["video"] = "video"
    model: str
    status: VideoStatus
    progress: int = Field(ge=0, le=100)
    created_at: int
    completed_at: int | None = None
    expires_at: int | None = None
    seconds: str
    size: str
    prompt: str | None = None
    error: VideoError | None = None
    remixed_from_video_id: str | None = None
    shotloom: VideoExtension


class VideoList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Video]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool


class VideoDeleted(BaseModel):
    id: str
    object: Literal["video.deleted"] = "video.deleted"
    deleted: bool
    status: VideoStatus = Field(description="cancelled/in_progress when DELETE cancelled the job.")


class CharacterCreateRequest(_Strict):
    """``POST /v1/videos/characters`` (JSON, or multipart with ``video`` a file part)."""

    name: str = Field(min_length=1, max_length=255, pattern=r"\S", description="Display name.")
    video: dict[str, str] | None = Field(
        default=None, description='{"id": "video_..."} of a completed video (or a file part in multipart).'
    )


class CharacterExtension(BaseModel):
    frame_sha256: str
    has_audio: bool
    source: dict[str, Any] = Field(description="The video it was taken from (version_id or sha256).")


class CharacterObject(BaseModel):
    id: str
    object: Literal["character"] = "character"
    name: str
    created_at: int
    shotloom: CharacterExtension


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "shotloom"
    family: str
    capabilities: dict[str, Any] | None = None
    defaults: dict[str, Any] = Field(default_factory=dict)
    adapters: list[dict[str, Any]] = Field(default_factory=list)
    parent: str | None = Field(default=None, description="An adapter's base model.")
    sampling: dict[str, Any] | None = Field(
        default=None,
        description="How it is sampled: mode (native | dmd), the default num_inference_steps, "
        "guidance_scale and step_cache, the model's step cache presets (step_caches), and the limits "
        "a request may choose within (limits.step_cache: the names this server offers).",
    )


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


VIDEO_ID = re.compile(r"^video_[0-9a-f]{32}$")


def video_id(version_id: str) -> str:
    return f"video_{version_id}"


def version_of(video: str) -> str | None:
    """``video_<hex>`` -> the store's version id (None for anything else)."""
    return video[len("video_") :] if VIDEO_ID.match(video) else None
