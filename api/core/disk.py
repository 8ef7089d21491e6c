"""Room on the disks the service writes to: the media root (inputs, shots, films) and the state
directory (the stores, Dagster's storage, step outputs). Below ``api.min_free_mb`` on either, new
work is refused (507) and ``/health`` says which, until space is back: a run that started with
room and then could not write its MP4 fails with the path and the missing room
(:func:`shotloom.media.write_mp4`), and nothing half-written is kept; one that cannot write
Dagster's storage waits for room (:func:`orchestration.storage.retry_run_writes`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from shotloom.media import free_bytes

MB = 1 << 20


@dataclass(frozen=True)
class Volume:
    name: str  # media_root | state_dir
    free_bytes: int
    min_free_bytes: int

    @property
    def ok(self) -> bool:
        return self.free_bytes >= self.min_free_bytes

    def refusal(self) -> str:
        return (
            f"no room for new work: the {self.name} has {self.free_bytes // MB} MB free, below "
            f"api.min_free_mb ({self.min_free_bytes // MB} MB); send again once space is freed"
        )


def volumes(places: dict[str, Path], min_free_mb: int) -> list[Volume]:
    """Free space where each of ``places`` lives (a place not made yet: its nearest parent)."""
    return [Volume(name, free_bytes(path), min_free_mb * MB) for name, path in places.items()]
