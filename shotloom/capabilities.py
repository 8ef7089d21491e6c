"""What a model family can do, and the check that refuses a request before any work."""

from __future__ import annotations

from dataclasses import dataclass

from shotloom.request import GenerationRequest


class CapabilityError(ValueError):
    """A request asks for something the loaded family cannot do. ``field`` names the input."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


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
    max_audio_references: int | None = None  # memory slots that may carry audio (None: no limit)

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
