"""The ops' access to the media store (``shotloom.media_store``): a Dagster resource holding its root.
Asset metadata stores paths relative to the root."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dagster import ConfigurableResource
from pydantic import Field

from shotloom import ENV_PREFIX
from shotloom.config import REPO_ROOT
from shotloom.media_store import SPRITESHEET_NAME, THUMBNAIL_NAME, LocalMediaStore

__all__ = ["SPRITESHEET_NAME", "THUMBNAIL_NAME", "MediaStoreResource", "default_media_root"]


def default_media_root() -> str:
    return os.environ.get(f"{ENV_PREFIX}_MEDIA_ROOT", str(REPO_ROOT / "var" / "media"))


class MediaStoreResource(ConfigurableResource):
    root: str = Field(default_factory=default_media_root, description="Media root directory.")

    @property
    def store(self) -> LocalMediaStore:
        return LocalMediaStore(self.root)

    @property
    def root_path(self) -> Path:
        return self.store.root

    def shot_path(self, work_id: str, shot_id: str, run_id: str) -> Path:
        return self.store.shot_path(work_id, shot_id, run_id)

    def film_path(self, work_id: str, run_id: str) -> Path:
        return self.store.film_path(work_id, run_id)

    def write_stills(self, frames_or_video: Any, mp4: Path, spritesheet_frames: int = 9) -> dict[str, Any]:
        return self.store.write_stills(frames_or_video, mp4, spritesheet_frames)

    def reference_dir(self, run_id: str) -> Path:
        return self.store.reference_dir(run_id)

    def write_reference(self, video: Path, folder: Path, frames: list[str], audio: bool) -> dict[str, Any]:
        return self.store.write_reference(video, folder, frames, audio)

    def keep_reference(self, video: Path) -> dict[str, Any]:
        return self.store.keep_reference(video)

    def resolve(self, relative: str) -> Path:
        """A media-root-relative path back to a file, refusing anything that leaves the root."""
        return self.store.path(relative)

    def relative(self, path: Path) -> str:
        return self.store.relative(path)

    def preview_data_uri(self, relative: str, max_side: int) -> str | None:
        return self.store.preview_data_uri(relative, max_side)
