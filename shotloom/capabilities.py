"""What a model family can do, and the check that refuses a request before any work."""

from __future__ import annotations

from dataclasses import dataclass

from shotloom.config import NO_STEP_CACHE, Performance, Sampler
from shotloom.request import GenerationRequest


class CapabilityError(ValueError):
    """A request asks for something the loaded family cannot do. ``field`` names the input."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message  # without the field: the API names the field its own way


@dataclass(frozen=True)
class Capabilities:
    max_reference_images: int
    first_frame: bool
    last_frame: bool
    audio_in: bool
    audio_out: bool
    frame_multiple: int  # num_frames must be frame_multiple * k + 1
    size_multiple: int  # width and height must be multiples of this
    fps: tuple[int, ...]  # frame rates the family was trained for
    guidance_range: tuple[float, float]
    max_frames: int = 1025
    video_to_video: bool = False  # a source video conditions the generation at a strength
    adapters: tuple[str, ...] = ()  # LoRA adapters loaded beside the base weights, by name
    # Family rules that depend on the clip's length, here so the API refuses them at admission:
    references_per_latent_frame: bool = False  # at most one reference per latent frame (Wan VACE)
    anchors_need_two_latent_frames: bool = False  # last frame / references need num_frames > multiple
    max_audio_references: int | None = None  # audio tracks the family conditions on (None: no limit)
    # Guides anchored at chosen frames: images and videos (frame_guides), sounds (audio_guides).
    frame_guides: bool = False
    audio_guides: bool = False
    max_guides: int = 16

    def check(self, req: GenerationRequest) -> None:
        """Raise CapabilityError naming the first field outside these capabilities."""
        if not req.prompt.strip():
            raise CapabilityError("prompt", "must be a non-empty string")
        for name in ("width", "height"):
            value = getattr(req, name)
            if value <= 0 or value % self.size_multiple:
                raise CapabilityError(
                    name, f"must be a positive multiple of {self.size_multiple}, got {value}"
                )
        n = req.num_frames
        if n < 1 or (n - 1) % self.frame_multiple or n > self.max_frames:
            raise CapabilityError(
                "num_frames",
                f"must be {self.frame_multiple}*k+1 and at most {self.max_frames}, got {n}",
            )
        if req.fps not in self.fps:
            raise CapabilityError("fps", f"must be one of {list(self.fps)}, got {req.fps}")
        lo, hi = self.guidance_range
        if not lo <= req.guidance_scale <= hi:
            raise CapabilityError("guidance_scale", f"must be within [{lo}, {hi}], got {req.guidance_scale}")
        if req.first_frame is not None and not self.first_frame:
            raise CapabilityError("first_frame", "this model family does not take a first frame")
        if req.last_frame is not None and not self.last_frame:
            raise CapabilityError("last_frame", "this model family does not take a last frame")
        if req.source_video is not None and not self.video_to_video:
            raise CapabilityError("source_video", "this model family does not take a source video")
        if req.strength is not None:
            if req.source_video is None:
                raise CapabilityError("strength", "applies to a source video; none was given")
            if not 0.0 < req.strength <= 1.0:
                raise CapabilityError("strength", f"must be within (0, 1], got {req.strength}")
        if req.lora is not None and req.lora not in self.adapters:
            served = ", ".join(self.adapters) or "none"
            raise CapabilityError("lora", f"no adapter {req.lora!r} is configured (configured: {served})")
        if req.lora_scale is not None and req.lora is None:
            raise CapabilityError("lora_scale", "applies to an adapter; none was selected")
        if len(req.memory) > self.max_reference_images:
            raise CapabilityError(
                "memory",
                f"at most {self.max_reference_images} reference images, got {len(req.memory)}",
            )
        for i, slot in enumerate(req.memory):
            if slot.audio is not None and not self.audio_in:
                raise CapabilityError(f"memory[{i}].audio", "this model family does not take audio input")
        if self.references_per_latent_frame:
            limit = (n - 1) // self.frame_multiple + 1
            if len(req.memory) > limit:
                raise CapabilityError(
                    "memory", f"at most {limit} reference images for {n} frames, got {len(req.memory)}"
                )
        if self.anchors_need_two_latent_frames and n <= self.frame_multiple:
            for field, given in (("last_frame", req.last_frame is not None), ("memory", bool(req.memory))):
                if given:
                    raise CapabilityError(field, f"needs num_frames >= {self.frame_multiple + 1}, got {n}")
        with_audio = [i for i, slot in enumerate(req.memory) if slot.audio is not None]
        if self.max_audio_references is not None and len(with_audio) > self.max_audio_references:
            raise CapabilityError(
                f"memory[{with_audio[self.max_audio_references]}].audio",
                f"at most {self.max_audio_references} memory slot(s) may carry audio for this model",
            )
        if req.guides:
            self._check_guides(req, [f"memory[{i}].audio" for i in with_audio])

    def _check_guides(self, req: GenerationRequest, audio_sources: list[str]) -> None:
        """Each guide's kind, frame and span; no two frame anchors on the same frame; at most
        ``max_audio_references`` audio tracks counting the guides' sounds."""
        n = req.num_frames
        if len(req.guides) > self.max_guides:
            raise CapabilityError("guides", f"at most {self.max_guides} guides, got {len(req.guides)}")
        taken: list[tuple[int, int, str]] = []  # [start, end) of the frames each anchor holds
        if req.first_frame is not None:
            taken.append((0, 1, "first_frame"))
        if req.last_frame is not None:
            taken.append((n - 1, n, "last_frame"))
        sources = list(audio_sources)
        for i, guide in enumerate(req.guides):
            field = f"guides[{i}]"
            if guide.kind == "audio":
                if not self.audio_guides:
                    raise CapabilityError(
                        f"{field}.kind", "this model cannot condition on a sound at a frame"
                    )
            elif guide.kind == "video":
                if not self.frame_guides:
                    raise CapabilityError(field, "this model cannot condition on frames at chosen positions")
            else:
                raise CapabilityError(f"{field}.kind", f"must be video or audio, got {guide.kind!r}")
            if not 0 <= guide.frame < n:
                raise CapabilityError(
                    f"{field}.frame", f"must be within 0..{n - 1} (the clip's frames), got {guide.frame}"
                )
            if guide.kind == "audio" or guide.with_audio:
                if not self.audio_guides:
                    raise CapabilityError(field, "this model cannot condition on a guide's sound")
                sources.append(field)
            if guide.kind == "video":
                span = guide.frames or 1
                end = guide.frame + span
                if end > n:
                    raise CapabilityError(
                        field,
                        f"its {span} frames from frame {guide.frame} do not fit in the clip's {n} frames",
                    )
                other = next((name for s, e, name in taken if s < end and guide.frame < e), None)
                if other is not None:
                    raise CapabilityError(
                        f"{field}.frame", f"frames {guide.frame}..{end - 1} overlap those of {other}"
                    )
                taken.append((guide.frame, end, field))
        most = self.max_audio_references
        if most is not None and len(sources) > most:
            raise CapabilityError(
                sources[most],
                f"at most {most} audio track(s) condition this model (memory audio and guide sounds "
                f"together), got {len(sources)}",
            )


def check_sampling(sampler: Sampler, req: GenerationRequest, max_steps: int | None = None) -> None:
    """The request's step count against the sampler that will run it: a dmd sampler takes its own
    count only; a native one any from 1 to ``max_steps``."""
    check_steps(sampler, req.num_inference_steps, max_steps)


def check_steps(sampler: Sampler, steps: int | None, max_steps: int | None = None) -> None:
    """:func:`check_sampling` for a step count alone (None: the sampler's default)."""
    if steps is None:
        return
    if sampler.fixed_steps is not None and steps != sampler.fixed_steps:
        raise CapabilityError(
            "num_inference_steps",
            f"this model samples with its distilled schedule of {sampler.fixed_steps} steps, got {steps}",
        )
    if steps < 1 or (max_steps is not None and steps > max_steps):
        most = f"within [1, {max_steps}]" if max_steps is not None else "at least 1"
        raise CapabilityError("num_inference_steps", f"must be {most}, got {steps}")


def check_step_cache(perf: Performance, asked: str | None) -> None:
    """A request's ``step_cache``: one the model declares, or ``none`` (None: the model's default)."""
    if asked is None or asked == NO_STEP_CACHE or asked in perf.step_caches:
        return
    known = [NO_STEP_CACHE, *sorted(perf.step_caches)]
    raise CapabilityError("step_cache", f"unknown step cache {asked!r}; this model has {known}")
