"""Where produced media live: one root directory, a local disk or a shared filesystem mounted at the
same path on every host (workers write there, the API serves from there).

Paths handed around (asset metadata, the service store, URLs) are relative to the root. This class
is the one place that turns them into files, for the ops (through ``MediaStoreResource``), the API's
media routes and its job service alike: another backend (an object store) is one class with the
same methods.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import quote

# Stills written beside each MP4 (shot or film), once, after the MP4 is written.
THUMBNAIL_NAME = "thumbnail.png"
SPRITESHEET_NAME = "spritesheet.png"
KEPT_REFERENCE_DIR = "reference"  # beside a shot's MP4: its frames and sound for later shots
KEPT_REFERENCE_MANIFEST = "reference.json"


def url_path(relative: str) -> str:
    """A root-relative path as it goes in a URL under ``/media/``: each segment percent-encoded (a
    client's ``work_id`` or ``shot_id`` may hold ``#``, ``?``, ``%`` or spaces; the route decodes once)."""
    return quote(relative, safe="/")


def path_part(value: str) -> str:
    """``value`` as part of a path under the root (a client's work or shot id, which may hold
    ``/``: folders within folders), refused with a ValueError saying why where it would lead
    elsewhere or name nothing: an empty, ``.`` or ``..`` segment (a leading or doubled ``/``
    included), a ``\\`` or NUL, a segment over 255 bytes."""
    if "\\" in value or "\x00" in value:
        raise ValueError("is part of a path under the media root: no '\\' or NUL")
    if any(seg in ("", ".", "..") for seg in value.split("/")):
        raise ValueError("is part of a path under the media root: no empty, '.' or '..' segment")
    if any(len(seg.encode()) > 255 for seg in value.split("/")):
        raise ValueError("is part of a path under the media root: at most 255 bytes between slashes")
    return value


class LocalMediaStore:
    def __init__(self, root: str | Path):
        self.root = Path(root).resolve()

    # -- where things go ------------------------------------------------------------------------
    def shot_path(self, work_id: str, shot_id: str, run_id: str) -> Path:
        return self.path("r2v", work_id, shot_id, run_id, "output.mp4")

    def film_path(self, work_id: str, run_id: str) -> Path:
        return self.path("merge", work_id, run_id, "film.mp4")

    def reference_dir(self, run_id: str) -> Path:
        return self.path("references", run_id)

    def path(self, *parts: str) -> Path:
        """A root-relative path as a file path, refusing anything that leaves the root."""
        path = self.root.joinpath(*parts).resolve()
        if not path.is_relative_to(self.root):
            raise ValueError(f"path leaves the media root: {'/'.join(parts)}")
        return path

    def relative(self, path: Path) -> str:
        return Path(path).resolve().relative_to(self.root).as_posix()

    # -- reading --------------------------------------------------------------------------------
    def find(self, relative: str) -> Path | None:
        """The regular file ``relative`` names inside the root, if it is there."""
        found = self.served(relative)
        return found[0] if found else None

    def served(self, asset_path: str) -> tuple[Path, os.stat_result] | None:
        """The regular file a client's ``asset_path`` names (and its stat), or None for anything
        missing or outside the root: ``..``, absolute paths, a symlink leading out. The path is
        taken as it is (the URL was decoded once, by the HTTP server; a second decode would make
        ``%41`` in a client's id unreachable, and what a double-encoded ``..`` decodes to once is a
        plain name). The caller answers all of them alike."""
        decoded = asset_path
        if not decoded or "\x00" in decoded or "\\" in decoded:
            return None
        pure = PurePosixPath(decoded)
        if pure.is_absolute() or any(part in ("..", ".") for part in pure.parts) or decoded.startswith("/"):
            return None
        try:
            real = (self.root / pure).resolve(strict=True)
        except (OSError, RuntimeError):
            return None
        if not real.is_relative_to(self.root) or real == self.root:
            return None
        try:
            st = real.stat()
        except OSError:
            return None
        return (real, st) if stat.S_ISREG(st.st_mode) else None

    def preview_data_uri(self, relative: str, max_side: int) -> str | None:
        """A small JPEG of the image ``relative`` names, as a ``data:`` URI (a page shows it with
        no route to the media); None when the image is not there."""
        import base64
        import io

        from PIL import Image

        found = self.find(relative)
        if found is None:
            return None
        with Image.open(found) as image:
            small = image.convert("RGB")
            small.thumbnail((max_side, max_side))
        buf = io.BytesIO()
        small.save(buf, format="JPEG", quality=80)
        return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii")

    # -- writing --------------------------------------------------------------------------------
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

    def write_reference(self, video: Path, folder: Path, frames: list[str], audio: bool) -> dict[str, Any]:
        """What a video lends to later shots (a character, a memory slot, an extension's first
        frame): PNGs of its ``middle`` and/or ``last`` frame and a WAV of its sound (where it has
        one and ``audio``), in ``folder``. Returns root-relative paths and the video's frame count."""
        from shotloom import media

        info = media.probe(video)
        index = {"middle": None, "last": info.frames - 1}  # None: extract_frame's middle frame
        unknown = set(frames) - set(index)
        if unknown:
            raise ValueError(f"unknown reference frames {sorted(unknown)}: use {sorted(index)}")
        folder.mkdir(parents=True, exist_ok=True)
        out: dict[str, Any] = {"frames": {}, "audio": None, "video_frames": info.frames}
        for name in frames:
            path = folder / f"{name}.png"
            media.extract_frame(video, index[name]).save(path)
            out["frames"][name] = self.relative(path)
        if audio and info.has_audio:
            out["audio"] = self.relative(media.extract_audio_wav(video, folder / "audio.wav"))
        return out

    # A written shot keeps what it lends to later shots (its middle and last frames, its sound)
    # beside its MP4, so a request taking memory from it needs no media run.
    def kept_reference_dir(self, video: Path) -> Path:
        return video.parent / KEPT_REFERENCE_DIR

    def keep_reference(self, video: Path) -> dict[str, Any]:
        folder = self.kept_reference_dir(video)
        taken = self.write_reference(video, folder, ["middle", "last"], audio=True)
        manifest = folder / KEPT_REFERENCE_MANIFEST
        tmp = manifest.with_suffix(".tmp")
        tmp.write_text(json.dumps(taken))
        os.replace(tmp, manifest)  # last: a manifest names only files already written
        return taken

    def kept_reference(self, video: Path) -> dict[str, Any] | None:
        """What :meth:`keep_reference` wrote for ``video`` (root-relative paths), if it did."""
        try:
            return json.loads((self.kept_reference_dir(video) / KEPT_REFERENCE_MANIFEST).read_text())
        except (OSError, ValueError):
            return None

    def remove(self, relative: str) -> None:
        """Delete a file (a video with the reference it kept), and its run's folder once that is
        empty (one folder per written shot)."""
        try:
            path = self.path(relative)
        except ValueError:
            return
        if path == self.root:
            return
        path.unlink(missing_ok=True)
        if path.suffix == ".mp4":
            shutil.rmtree(self.kept_reference_dir(path), ignore_errors=True)
        parent = path.parent
        if parent != self.root and parent.is_relative_to(self.root) and not any(parent.iterdir()):
            shutil.rmtree(parent, ignore_errors=True)
