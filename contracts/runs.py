"""The run configs of the code location's jobs, typed: the API builds them, the ops read them.

A job's run config is what Dagster stores with each run (and shows in the launchpad); these are the
one definition of it, on both sides of the wire. Paths are relative to the media root, or absolute.
"""

from __future__ import annotations

from typing import Any

from dagster import Config
from pydantic import Field

# The ops that take them (a run config's ``ops`` keys).
SHOT_OP = "condition_op"
STILLS_OP = "stills_op"
MERGE_OP = "merge_op"
STITCH_OP = "stitch_op"
REFERENCE_OP = "reference_op"


class MemorySlotConfig(Config):
    image: str = Field(description="Image file (absolute, or relative to the media root).")
    audio: str | None = Field(default=None, description="Optional audio file beside the image.")


class GuideConfig(Config):
    path: str = Field(description="Image, video or audio file (absolute, or relative to the media root).")
    frame: int = Field(description="The clip frame it starts at, 0..num_frames-1.")
    kind: str = Field(default="video", description="video (an image or a video) or audio (a sound alone).")
    with_audio: bool = Field(default=False, description="A guide video's sound conditions the audio too.")


class ShotConfig(Config):
    """One shot. Unset fields take the inference YAML's defaults."""

    work_id: str = Field(description="Work (film / sequence) the shot belongs to.")
    shot_id: str = Field(description="Shot identifier within the work.")
    prompt: str
    negative_prompt: str | None = None
    seed: int | None = None
    width: int | None = None
    height: int | None = None
    num_frames: int | None = None
    fps: int | None = None
    guidance_scale: float | None = None
    num_inference_steps: int | None = Field(
        default=None, description="Denoising steps; default: the sampler's (dmd: only its own)."
    )
    step_cache: str | None = Field(
        default=None,
        description="A step cache of the model's performance.step_caches by name, or 'none'; "
        "default: the model's.",
    )
    first_frame: str | None = None
    last_frame: str | None = None
    memory: list[MemorySlotConfig] = Field(default_factory=list)
    source_video: str | None = Field(
        default=None, description="Video-to-video: the MP4 the generation starts from."
    )
    strength: float | None = Field(
        default=None, description="How far from source_video to go, in (0, 1]; default: the YAML's."
    )
    lora: str | None = Field(default=None, description="A LoRA adapter of the inference YAML, by name.")
    lora_scale: float | None = Field(default=None, description="Its scale; default: the configured one.")
    guides: list[GuideConfig] = Field(
        default_factory=list, description="Images, videos and sounds anchored at frames of the clip."
    )
    lineage: dict[str, Any] = Field(
        default_factory=dict,
        description="What the shot is made from: inputs (content hashes, the versions and characters "
        "they came from), derived_from (versions), adapter. Recorded on the shot's materialization.",
    )


class StillsConfig(Config):
    work_id: str = Field(description="Work the shot belongs to.")
    shot_id: str = Field(description="The shot (partition of the shot and shot_stills assets).")
    video: str = Field(description="The shot's MP4, relative to the media root; the PNGs go beside it.")
    spritesheet_frames: int = Field(default=9, ge=1, description="Frames in the spritesheet.")


class MergeConfig(Config):
    work_id: str = Field(description="Work the film belongs to (partition of the film asset).")
    inputs: list[str] = Field(
        min_length=1, description="MP4s in order: paths relative to the media root, or absolute."
    )
    shot_ids: list[str] = Field(default_factory=list, description="Shot ids of the inputs, for metadata.")
    versions: list[str] = Field(
        default_factory=list, description="Service versions of the inputs (lineage: film -> shots)."
    )


class StitchConfig(Config):
    """The clips a generated shot is appended to (an extension of an earlier video)."""

    work_id: str = Field(description="Work the stitched film belongs to.")
    before: list[str] = Field(min_length=1, description="MP4s that come before the shot, in order.")
    shot_ids: list[str] = Field(default_factory=list, description="Shot ids of those MP4s, for metadata.")
    before_frames: int = Field(default=0, ge=0, description="Their frames in all (what readers expect).")
    versions: list[str] = Field(default_factory=list, description="Service versions of those MP4s (lineage).")


class ReferenceConfig(Config):
    video: str = Field(description="The video (absolute, or relative to the media root).")
    frames: list[str] = Field(default_factory=lambda: ["middle"], description="middle and/or last.")
    audio: bool = Field(default=True, description="Take its sound too (a WAV), where it has one.")


def run_config(**ops: Config) -> dict[str, Any]:
    """A run config from op name -> its config (unset fields left out: the op's defaults hold)."""
    return {"ops": {name: {"config": cfg.model_dump(exclude_unset=True)} for name, cfg in ops.items()}}
