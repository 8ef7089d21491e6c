"""Frames and sound a request takes from a video before it can answer (a character, a memory slot
from an earlier shot, an extension's first frame). In the service they are taken by a ``reference``
run on a media worker, submitted over GraphQL and waited for: the API never decodes video itself.
A job service without Dagster (tests of the intake) takes them in-process, by the same code."""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from api.core.errors import Unavailable
from api.dagster import DagsterGatewayError, Gateway
from contracts.runs import REFERENCE_OP, ReferenceConfig, run_config
from contracts.tags import KIND_TAG, PRIORITY_TAG, USER_TAG
from shotloom.media_store import LocalMediaStore

REFERENCE_JOB = "reference"
# A request waits for it: it goes before the queued stills and merges of the media lanes.
REFERENCE_PRIORITY = "10"
REFERENCE_ASSET = ("reference",)  # its materializations, as GraphQL reads the key
POLL_S = 0.05  # a warm media worker answers in a few hundred ms


@dataclass(frozen=True)
class Reference:
    """What a video lends to later shots: frames by name (middle, last), its sound, its length."""

    frames: dict[str, Path]
    audio: Path | None
    video_frames: int
    # Holds the files: the caller copies them into its inputs, then releases it. None: a shot's
    # own kept reference (it stays with the shot).
    folder: Path | None

    def release(self) -> None:
        """Drop the taken files once copied (a shot's kept ones stay)."""
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)

    @classmethod
    def from_written(cls, media: LocalMediaStore, written: dict[str, Any], folder: Path | None) -> Reference:
        """From what ``LocalMediaStore.write_reference`` answered (root-relative paths)."""
        return cls(
            frames={name: media.path(rel) for name, rel in dict(written["frames"]).items()},
            audio=media.path(written["audio"]) if written.get("audio") else None,
            video_frames=int(written["video_frames"]),
            folder=folder,
        )


def kept_reference(media: LocalMediaStore, video: Path, frames: list[str], audio: bool) -> Reference | None:
    """What a shot of ours (``video``, its MP4) kept when its stills were made, if it has all of
    ``frames``: no run needed (None for a shot of an earlier release, or before its stills)."""
    kept = media.kept_reference(video)
    if kept is None or not set(frames) <= set(kept["frames"]):
        return None
    wanted = {
        "frames": {name: kept["frames"][name] for name in frames},
        "audio": kept["audio"] if audio else None,
        "video_frames": kept["video_frames"],
    }
    return Reference.from_written(media, wanted, folder=None)


class ReferenceTaker(Protocol):
    """ValueError when the video cannot be read; Unavailable when the media work cannot be done."""

    def reference(self, video: Path, frames: list[str], audio: bool, user: str | None) -> Reference: ...


class MediaWorkerReferences:
    """A ``reference`` run on a media worker (its own queue limit: never behind a generation)."""

    def __init__(self, gateway: Gateway, media: LocalMediaStore, timeout_s: float):
        self.gateway = gateway
        self.media = media
        self.timeout_s = timeout_s

    def reference(self, video: Path, frames: list[str], audio: bool, user: str | None) -> Reference:
        config = ReferenceConfig(video=str(video), frames=frames, audio=audio)
        try:
            run_id = self.gateway.submit(
                REFERENCE_JOB,
                run_config(**{REFERENCE_OP: config}),
                {KIND_TAG: REFERENCE_JOB, USER_TAG: user or "api", PRIORITY_TAG: REFERENCE_PRIORITY},
            )
        except DagsterGatewayError as exc:
            raise Unavailable(f"could not start taking the video's frames: {exc}") from None
        deadline = time.monotonic() + self.timeout_s
        run = self.gateway.run(run_id)
        while run is None or not run.finished:
            if time.monotonic() > deadline:
                self.gateway.terminate(run_id, wait_starting_s=0)
                raise Unavailable(f"no media worker took the video's frames in {self.timeout_s:g} s")
            time.sleep(POLL_S)
            run = self.gateway.run(run_id)
        if run.status != "SUCCESS":
            refused = [
                f.description for f in run.step_failures if f.class_name == "Failure" and f.description
            ]
            if refused:  # the op refused the video itself (it cannot be read)
                raise ValueError(refused[0])
            raise Unavailable(f"taking the video's frames failed: {run.error_summary() or run.status}")
        [mat] = [m for m in self.gateway.materializations(run_id) if m.asset_key == REFERENCE_ASSET]
        return Reference.from_written(self.media, mat.metadata, self.media.reference_dir(run_id))


class InProcessReferences:
    """The same frames, taken in this process (a job service without Dagster)."""

    def __init__(self, media: LocalMediaStore):
        self.media = media

    def reference(self, video: Path, frames: list[str], audio: bool, user: str | None) -> Reference:
        self.media.root.mkdir(parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix="reference-", dir=self.media.root))
        taken = self.media.write_reference(video, folder, frames, audio)
        return Reference.from_written(self.media, taken, folder)
