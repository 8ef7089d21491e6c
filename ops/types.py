"""Dagster types for op inputs and outputs.

Tensors travel as TensorBundles (safetensors through TensorIOManager); the bundle's
``meta["kind"]`` tells which stage made it, and the type check refuses a bundle
from the wrong stage.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dagster import DagsterType, TypeCheck

from shotloom.bundle import TensorBundle


def _bundle_type(kind: str, description: str) -> DagsterType:
    def check(_context, value) -> TypeCheck:
        if not isinstance(value, TensorBundle):
            return TypeCheck(False, description=f"expected TensorBundle, got {type(value).__name__}")
        got = value.meta.get("kind")
        return TypeCheck(got == kind, description=f"bundle kind {got!r}, expected {kind!r}")

    return DagsterType(
        name=f"{kind.capitalize()}Bundle",
        type_check_fn=check,
        typing_type=TensorBundle,
        description=description,
    )


ConditioningBundle = _bundle_type("conditioning", "Encoded text/image/audio conditioning (safetensors).")
LatentsBundle = _bundle_type("latents", "Denoised video (and audio) latents (safetensors).")
DecodedBundle = _bundle_type("decoded", "Decoded uint8 frames and float audio (safetensors, never pickled).")


@dataclass
class ShotArtifact:
    """The MP4 of one shot, as recorded on its asset materialization."""

    work_id: str
    shot_id: str
    path: str  # relative to the media root
    bytes: int
    sha256: str
    frames: int
    fps: float
    width: int
    height: int
    duration_s: float
    seed: int
    checkpoint: str
    has_audio: bool
    timings: dict[str, float] = field(default_factory=dict)


@dataclass
class FilmArtifact:
    work_id: str
    path: str
    bytes: int
    sha256: str
    frames: int
    fps: float
    width: int
    height: int
    duration_s: float
    video_mode: str  # "copy" or "reencode"
    shots: list[str] = field(default_factory=list)


@dataclass
class StillsArtifact:
    """A video's thumbnail and spritesheet PNGs (paths relative to the media root)."""

    video: str
    thumbnail: str
    spritesheet: str
    spritesheet_grid: str
    spritesheet_frames: list[int] = field(default_factory=list)


@dataclass
class ReferenceArtifact:
    """Stills and sound taken from a video (paths relative to the media root)."""

    frames: dict[str, str]  # middle / last -> PNG
    audio: str | None
    video_frames: int
