"""Operator control of the run queue, shared by the API (which writes requests) and the daemon's
run coordinator (which applies them on its next dequeue, and records each as a run event).

State lives in files under ``<state_dir>/queue`` (the control plane's host): ``paused.json`` while
intake to the devices is paused, one ``priority/<run id>.json`` per pending priority change, and
one ``notes/<time>-<run id>.json`` per operator action to record on a run that left the queue
(written atomically; applied once, then removed). No torch, no Dagster imports.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any


class QueueControl:
    def __init__(self, state_dir: str | Path):
        self.root = Path(state_dir) / "queue"

    @property
    def _paused_file(self) -> Path:
        return self.root / "paused.json"

    def paused(self) -> dict[str, Any] | None:
        """``{"by", "at"}`` while intake to the devices is paused, else None."""
        try:
            return json.loads(self._paused_file.read_text())
        except (OSError, ValueError):
            return None

    def pause(self, by: str) -> dict[str, Any]:
        state = self.paused()
        if state is None:
            state = {"by": by, "at": time.time()}
            _write(self._paused_file, state)
        return state

    def resume(self) -> bool:
        """True when it was paused."""
        try:
            self._paused_file.unlink()
            return True
        except FileNotFoundError:
            return False

    def fingerprint(self) -> tuple[bool, tuple[str, ...]]:
        """Changes whenever a request is written or applied (the daemon looks every few ms)."""
        pending: list[str] = []
        for sub in ("priority", "notes"):
            try:
                pending += sorted(f"{sub}/{e.name}" for e in os.scandir(self.root / sub))
            except OSError:
                pass
        return self._paused_file.exists(), tuple(pending)

    def request_priority(self, run_id: str, priority: int, by: str) -> None:
        _write(self.root / "priority" / f"{run_id}.json", {"priority": priority, "by": by, "at": time.time()})

    def priority_requests(self) -> list[tuple[str, dict[str, Any], Path]]:
        """Pending priority changes, oldest first: (run id, request, its file to remove once applied)."""
        folder = self.root / "priority"
        out = []
        for path in sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime) if folder.is_dir() else ():
            try:
                out.append((path.stem, json.loads(path.read_text()), path))
            except (OSError, ValueError):
                continue
        return out

    def note(self, run_id: str, message: str) -> None:
        """Record ``message`` as an event on the run (an operator action the queue did not make)."""
        _write(
            self.root / "notes" / f"{time.time_ns()}-{run_id}.json", {"run_id": run_id, "message": message}
        )

    def notes(self) -> list[tuple[str, str, Path]]:
        """Pending notes, oldest first: (run id, message, its file to remove once recorded)."""
        folder = self.root / "notes"
        out = []
        for path in sorted(folder.glob("*.json")) if folder.is_dir() else ():
            try:
                data = json.loads(path.read_text())
                out.append((data["run_id"], data["message"], path))
            except (OSError, ValueError, KeyError):
                continue
        return out


def _write(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)
