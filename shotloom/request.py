"""What one generation asks for, independent of any HTTP or Dagster type."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class MemorySlot:
    """One reference ("memory") input: an image, optionally with an audio file."""

    image: Path
    audio: Path | None = None


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

    def to_json(self) -> dict:
        data = asdict(self)
        for key in ("first_frame", "last_frame", "source_video"):
            data[key] = str(data[key]) if data[key] is not None else None
        data["memory"] = [
            {"image": str(m.image), "audio": str(m.audio) if m.audio else None} for m in self.memory
        ]
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
        return cls(**data)

    @property
    def duration_seconds(self) -> float:
        return self.num_frames / self.fps
