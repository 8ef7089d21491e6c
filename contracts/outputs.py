"""What a run's asset materializations say, typed: the ops write these as metadata, the API's
tracker reads them back to index a job's files and answer its result (GraphQL hands metadata over
as label -> value; :meth:`read` takes that, the ops' :meth:`to_metadata` makes it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from dagster import MetadataValue
from pydantic import BaseModel, ConfigDict, Field

STILL_ROLES = ("thumbnail", "spritesheet")  # the images made beside each video
# What a materialization shows an operator in the Dagster UI alone (ops.previews): never a fact of
# the job a client reads.
UI_ONLY_KEYS = frozenset({"preview"})
# The facts of a job's main video its result carries (both dialects' views read them).
RESULT_KEYS = (
    "width", "height", "frames", "fps", "duration_s", "has_audio", "seed", "video_mode", "peak_memory_mb",
    # How a shot was sampled (not on a film).
    "num_inference_steps", "guidance_scale", "sampler", "step_cache",
)  # fmt: skip


class _Output(BaseModel):
    # A materialization of an earlier (or later) release may carry other facts: kept, not refused.
    model_config = ConfigDict(extra="allow", frozen=True)

    def to_metadata(self) -> dict[str, Any]:
        """Asset metadata: structured values as JSON entries, the rest as Dagster infers them."""
        return {
            k: MetadataValue.json(v) if isinstance(v, dict | list) else v
            for k, v in self.model_dump(exclude_none=True).items()
        }


class VideoOutput(_Output):
    """A materialized MP4 (a shot or a film): the file, root-relative, and its form."""

    path: str
    bytes: int | None = None
    sha256: str | None = None
    frames: int | None = None
    fps: float | int | None = None  # as recorded (a reader shows what was written)
    width: int | None = None
    height: int | None = None
    duration_s: float | int | None = None

    @classmethod
    def read(cls, metadata: Mapping[str, Any]) -> VideoOutput | None:
        """The video a materialization records (None: it records no video, e.g. a shot's stills)."""
        if not isinstance(metadata.get("path"), str):
            return None
        return cls.model_validate(dict(metadata))

    def facts(self) -> dict[str, Any]:
        """Everything it says but where the file is and its stills (the artifact index keeps it)."""
        return {
            k: v
            for k, v in self.model_dump(exclude={"path", "bytes", "sha256"}, exclude_none=True).items()
            if not k.startswith(STILL_ROLES) and k not in UI_ONLY_KEYS
        }


class ShotOutput(VideoOutput):
    """The ``shot`` asset: one generated shot, how it was made and from what."""

    work_id: str
    shot_id: str
    seed: int
    checkpoint: str
    has_audio: bool
    size: str  # "WxH": how the Dagster UI's asset page lists it
    cache_hit: bool = False
    sampler: dict[str, Any] = Field(default_factory=dict)  # the sampler's mode, steps, guidance, cache
    num_inference_steps: int = 0
    guidance_scale: float = 1.0
    step_cache: str = "none"
    stage_timings: dict[str, float] = Field(default_factory=dict)
    peak_memory_mb: float = 0.0
    peak_memory_kind: str = ""
    version_id: str = ""  # the service version it is
    # Lineage: what it was made from (hashes, earlier versions, characters) and with what.
    inputs: dict[str, Any] = Field(default_factory=dict)
    derived_from: list[str] = Field(default_factory=list)
    adapter: str = ""
    spritesheet_count: int = 9  # for the stills made after it


class StillsOutput(_Output):
    """A video's thumbnail and spritesheet PNGs (root-relative), as ``write_stills`` made them."""

    thumbnail: str
    thumbnail_sha256: str
    thumbnail_bytes: int
    spritesheet: str
    spritesheet_sha256: str
    spritesheet_bytes: int
    spritesheet_frames: list[int] = Field(default_factory=list)
    spritesheet_grid: str


class FilmOutput(VideoOutput, StillsOutput):
    """The ``film`` asset: shots merged in order (a merge, or an extension stitched onto its
    source), with its own stills."""

    work_id: str
    video_mode: str  # "copy" or "reencode"
    size: str
    shots: str  # shot ids (or paths), comma-separated, as the UI lists them
    versions: list[str] = Field(default_factory=list)  # lineage: its shots' versions, in order


class Still(NamedTuple):
    role: str  # thumbnail | spritesheet
    path: str
    bytes: int | None
    sha256: str | None
    grid: str | None  # a spritesheet's "CxR"


def read_stills(metadata: Mapping[str, Any]) -> list[Still]:
    """The stills a materialization records (a shot's stills run, a film), in role order."""
    out = []
    for role in STILL_ROLES:
        path = metadata.get(role)
        if isinstance(path, str):
            size, digest = metadata.get(f"{role}_bytes"), metadata.get(f"{role}_sha256")
            grid = metadata.get("spritesheet_grid") if role == "spritesheet" else None
            out.append(Still(role, path, _int(size), digest, grid))
    return out


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
