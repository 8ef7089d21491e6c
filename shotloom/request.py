"""What one generation asks for, independent of any HTTP or Dagster type, and :func:`resolve`:
the one place a request's unset fields get their defaults (the API answers with it at intake, the
worker runs with it)."""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from shotloom.config import NO_STEP_CACHE, Defaults, Performance, Sampler

GuideKind = Literal["video", "audio"]

# Seeds are 0 <= seed < MAX_SEED: what torch.manual_seed and every generator seeded from it take.
MAX_SEED = 2**32


@dataclass(frozen=True)
class MemorySlot:
    """One reference ("memory") input: an image, optionally with an audio file."""

    image: Path
    audio: Path | None = None


@dataclass(frozen=True)
class Guide:
    """Media anchored at a frame of the clip.

    ``kind`` video: an image (one frame) or a video (its frames, one per clip frame, from ``frame``
    on; they must fit in the clip), whose sound also conditions the clip's audio when
    ``with_audio``. ``kind`` audio: a sound alone, starting at ``frame``'s time (cut at the clip's
    end). ``frame`` is resolved: 0..num_frames-1. ``frames`` is how many clip frames a video-kind
    guide covers (1 for an image), measured from the file (:func:`shotloom.guides.measure`);
    None until measured (the family checks the fit when it reads the frames).
    """

    path: Path
    frame: int
    kind: GuideKind = "video"
    with_audio: bool = False
    frames: int | None = None


@dataclass(frozen=True)
class GenerationRequest:
    """A fully resolved request: every field has its final value (defaults applied)."""

    prompt: str
    width: int
    height: int
    num_frames: int
    fps: int
    seed: int
    guidance_scale: float = 1.0
    negative_prompt: str = ""
    # Denoising steps; None (a record of an earlier release): the sampler's default.
    num_inference_steps: int | None = None
    first_frame: Path | None = None
    last_frame: Path | None = None
    memory: tuple[MemorySlot, ...] = field(default_factory=tuple)
    # Video-to-video: the source's frames, re-noised to the schedule's first sigma <= strength,
    # are where denoising starts (strength 1: the source is ignored; lower: closer to it).
    source_video: Path | None = None
    strength: float | None = None
    # A configured LoRA adapter (by name) and its scale; None: the base weights alone.
    lora: str | None = None
    lora_scale: float | None = None
    # Frame-anchored guides (images, videos, sounds), in request order (refusals say guides[i]).
    guides: tuple[Guide, ...] = field(default_factory=tuple)
    # A step cache of the model's performance.step_caches by name, or "none"; None (a record of an
    # earlier release, or not resolved): the model's default.
    step_cache: str | None = None

    def to_json(self) -> dict:
        data = asdict(self)
        for key in ("first_frame", "last_frame", "source_video"):
            data[key] = str(data[key]) if data[key] is not None else None
        data["memory"] = [
            {"image": str(m.image), "audio": str(m.audio) if m.audio else None} for m in self.memory
        ]
        data["guides"] = [{**asdict(g), "path": str(g.path)} for g in self.guides]
        return data

    @classmethod
    def from_json(cls, data: dict) -> GenerationRequest:
        data = dict(data)
        for key in ("first_frame", "last_frame", "source_video"):
            data[key] = Path(data[key]) if data.get(key) else None
        data["memory"] = tuple(
            MemorySlot(Path(m["image"]), Path(m["audio"]) if m.get("audio") else None)
            for m in data.get("memory", [])
        )
        data["guides"] = tuple(Guide(**{**g, "path": Path(g["path"])}) for g in data.get("guides", []))
        return cls(**data)

    @property
    def duration_seconds(self) -> float:
        return self.num_frames / self.fps


def resolve_step_cache(perf: Performance, asked: str | None) -> str:
    """The step cache a request runs with: what it asked (a name, or ``none``), else the model's
    default, else ``none``."""
    if asked is not None:
        return asked
    return perf.step_cache or NO_STEP_CACHE


@dataclass(frozen=True)
class Sampling:
    """How a request is sampled, resolved: its step count (None: a sampler of an earlier release
    with no default), guidance scale and step cache."""

    num_inference_steps: int | None
    guidance_scale: float
    step_cache: str


def resolve_sampling(
    sampler: Sampler,
    performance: Performance,
    *,
    num_inference_steps: int | None = None,
    guidance_scale: float | None = None,
    step_cache: str | None = None,
) -> Sampling:
    """The sampling part of :func:`resolve`: unset fields from the ``sampler`` that will run the
    request and the model's default step cache."""
    return Sampling(
        num_inference_steps=num_inference_steps or sampler.steps,
        guidance_scale=guidance_scale if guidance_scale is not None else sampler.guidance_scale,
        step_cache=resolve_step_cache(performance, step_cache),
    )


def resolve(
    defaults: Defaults,
    sampler: Sampler,
    performance: Performance,
    prompt: str,
    *,
    width: int | None = None,
    height: int | None = None,
    num_frames: int | None = None,
    fps: int | None = None,
    seed: int | None = None,
    guidance_scale: float | None = None,
    num_inference_steps: int | None = None,
    negative_prompt: str | None = None,
    first_frame: Path | None = None,
    last_frame: Path | None = None,
    memory: list[MemorySlot] | tuple[MemorySlot, ...] = (),
    source_video: Path | None = None,
    strength: float | None = None,
    lora: str | None = None,
    lora_scale: float | None = None,
    guides: list[Guide] | tuple[Guide, ...] = (),
    step_cache: str | None = None,
) -> GenerationRequest:
    """Fill unset fields (None) from the inference YAML's ``defaults``, the ``sampler`` that will
    run the request (its adapter's, or the model's) and the model's ``performance`` (its default
    step cache); never rounds what was asked. An unset seed is drawn here."""
    sampling = resolve_sampling(
        sampler,
        performance,
        num_inference_steps=num_inference_steps,
        guidance_scale=guidance_scale,
        step_cache=step_cache,
    )
    return GenerationRequest(
        prompt=prompt,
        width=width or defaults.width,
        height=height or defaults.height,
        num_frames=num_frames or defaults.num_frames,
        fps=fps or defaults.fps,
        seed=seed if seed is not None else random.randrange(MAX_SEED),
        guidance_scale=sampling.guidance_scale,
        num_inference_steps=sampling.num_inference_steps,
        negative_prompt=negative_prompt if negative_prompt is not None else defaults.negative_prompt,
        first_frame=first_frame,
        last_frame=last_frame,
        memory=tuple(memory),
        source_video=source_video,
        # Video-to-video only: without a source, strength means nothing and stays as asked.
        strength=(strength if strength is not None else defaults.strength) if source_video else strength,
        lora=lora,
        lora_scale=lora_scale,
        guides=tuple(guides),
        step_cache=sampling.step_cache,
    )
