"""Where produced media live. Asset metadata stores paths relative to the root."""

from __future__ import annotations

import os
from pathlib import Path

from dagster import ConfigurableResource
from pydantic import Field

from shotloom import ENV_PREFIX
from shotloom.config import REPO_ROOT


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
