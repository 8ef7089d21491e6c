"""Helpers shared by bench scripts."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run_measured(cmd: list[str], env: dict | None = None, cwd: Path = REPO) -> tuple[float, float, str]:
    """Run a command; return (wall seconds, peak RSS MiB over its process tree, stdout)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=cwd, env={**os.environ, **(env or {})}, stdout=out, stderr=err)
        # wait4's rusage covers the child and the descendants it waited for (ru_maxrss in KiB).
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if proc.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err.read()[-3000:]}")
        return wall, usage.ru_maxrss / 1024, out.read()


def result_line(figures: dict) -> str:
    return "RESULT " + " ".join(f"{k}={v}" for k, v in figures.items())
