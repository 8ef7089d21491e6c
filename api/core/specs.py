"""What a client asks for, in no dialect: each HTTP dialect's request models convert themselves into
these (``to_spec()``), and the job service turns them into a Dagster run config.

A spec keeps the client's own field names beside each input (``InputRef.field``) so every refusal
names the field the way that client wrote it (``memory_slots[1].audio_url`` in R2V,
``image_reference[1].audio_url`` in the OpenAI dialect).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

Dialect = Literal["r2v", "openai", "images"]  # images: /v1/images (one-frame runs)


@dataclass(frozen=True)
class InputRef:
    """One client resource: a URL / data URL / path string, or an upload already spooled to disk."""

    field: str
    value: str | None = None
    upload: Path | None = None


@dataclass(frozen=True)
class MemoryRef:
    """One memory slot: an image (with optional audio), the newest successful shot of the work, or a
    character (its frame, and its audio where the model takes audio)."""

    field: str
    image: InputRef | None = None
    audio: InputRef | None = None
    shot_id: str | None = None
    character_id: str | None = None


@dataclass(frozen=True)
class GuideRef:
    """One frame-anchored guide: an uploaded file, the clip frame it starts at (0..num_frames-1,
    resolved by the dialect) and its kind (video: an image or a video; audio: a sound alone)."""

    field: str  # the client's name for it (``guides[0]``)
    file: InputRef
    frame: int
    kind: Literal["video", "audio"] = "video"


@dataclass(frozen=True)
class SourceRef:
    """A source video for video-to-video: a finished version of this service, or a resource."""

    field: str
    version_id: str | None = None
    video: InputRef | None = None


@dataclass(frozen=True)
class ShotSpec:
    """One shot to generate. ``None`` means "the model's preset decides" (the engine resolves it)."""

    work_id: str
    shot_id: str
    prompt: str
    client: dict[str, Any]  # the request as stored and shown back (no local paths, no inline data)
    idempotency_payload: dict[str, Any]  # what the idempotency hash covers
    dialect: Dialect = "r2v"
    negative_prompt: str | None = None
    seed: int | None = None
    width: int | None = None
    height: int | None = None
    num_frames: int | None = None
    fps: int | None = None
    guidance_scale: float | None = None
    num_inference_steps: int | None = None
    step_cache: str | None = None  # a preset of the model's performance.step_caches, or "none"
    first_frame: InputRef | None = None
    last_frame: InputRef | None = None
    memory: tuple[MemoryRef, ...] = ()
    memory_field: str = "memory_slots"  # the client's name for the list (count errors)
    source: SourceRef | None = None  # video-to-video
    strength: float | None = None
    # An extension: the shot continues this video (its first frame the video's last, the video in
    # its memory) and the run appends it to the video, answering the stitched film.
    extends: SourceRef | None = None
    lora: str | None = None  # a configured LoRA adapter, by name
    lora_scale: float | None = None
    guides: tuple[GuideRef, ...] = ()  # frame-anchored images, videos and sounds
    guide_no_audio: bool = False  # guide videos without their sound
    job_id: str | None = None
    callback_url: str | None = None
    callback_context: dict[str, Any] | None = None
    submitter: str | None = None
    version_id: str | None = None  # chosen by the dialect when its public id derives from it
    # Engine field -> the client's field, where the client spelled it otherwise (``width`` -> ``size``).
    field_names: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class MergeSource:
    """One shot of a film: a local version, or a video resource."""

    field: str
    version_id: str | None = None
    video: InputRef | None = None


@dataclass(frozen=True)
class MergeSpec:
    work_id: str
    shots: tuple[MergeSource, ...]
    client: dict[str, Any]
    idempotency_payload: dict[str, Any]
    dialect: Dialect = "r2v"
    job_id: str | None = None
    callback_url: str | None = None
    callback_context: dict[str, Any] | None = None
    submitter: str | None = None
