"""Where produced media live. Asset metadata stores paths relative to the root."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dagster import ConfigurableResource
from pydantic import Field

from shotloom import ENV_PREFIX
from shotloom.config import REPO_ROOT

# Stills written beside each MP4 (shot or film), once, when the MP4 is written.
THUMBNAIL_NAME = "thumbnail.png"
SPRITESHEET_NAME = "spritesheet.png"


def default_media_root() -> str:
    return os.environ.get(f"{ENV_PREFIX}_MEDIA_ROOT", str(REPO_ROOT / "var" / "media"))


class MediaStoreResource(ConfigurableResource):
    root: str = Field(default_factory=default_media_root, description="Media root directory.")

    @property
    def root_path(self) -> Path:
        return Path(self.root).resolve()

    def shot_path(self, work_id: str, shot_id: str, run_id: str) -> Path:
        return self._inside("r2v", work_id, shot_id, run_id, "output.mp4")

    def film_path(self, work_id: str, run_id: str) -> Path:
        return self._inside("merge", work_id, run_id, "film.mp4")

    def write_stills(self, frames_or_video: Any, mp4: Path, spritesheet_frames: int = 9) -> dict[str, Any]:
        """Thumbnail and spritesheet PNGs beside ``mp4``; returns their materialization metadata.

        ``frames_or_video``: the (F, H, W, 3) uint8 frames in memory, or the video file (then only
        the needed frames are decoded, by seeking). Paths in the metadata are root-relative.
        """
        from shotloom import media

        thumb = media.write_thumbnail(frames_or_video, mp4.with_name(THUMBNAIL_NAME))
        sheet = media.write_spritesheet(
            frames_or_video, mp4.with_name(SPRITESHEET_NAME), count=spritesheet_frames
        )
        return {
            "thumbnail": self.relative(thumb.path),
            "thumbnail_sha256": thumb.sha256,
            "thumbnail_bytes": thumb.bytes,
            "spritesheet": self.relative(sheet.path),
            "spritesheet_sha256": sheet.sha256,
            "spritesheet_bytes": sheet.bytes,
            "spritesheet_frames": list(sheet.frames),
            "spritesheet_grid": sheet.grid,
        }

    def resolve(self, relative: str) -> Path:
        """A media-root-relative path back to a file, refusing anything that leaves the root."""
        return self._inside(relative)

    def relative(self, path: Path) -> str:
        return path.resolve().relative_to(self.root_path).as_posix()

    def _inside(self, *parts: str) -> Path:
        path = self.root_path.joinpath(*parts).resolve()
        if not path.is_relative_to(self.root_path):
            raise ValueError(f"path leaves the media root: {'/'.join(parts)}")
        return path
