"""bench/gpu_check.sh, the GPU readiness check: it runs only where a GPU session is lent, so its
steps are rehearsed here on the CPU (tiny checkpoint), to find out before device time is spent
that the script still speaks the service's API."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent


def gpu_check(*args: str, timeout: float) -> tuple[dict[str, str], str]:
    proc = subprocess.run(
        ["bash", "bench/gpu_check.sh", *args],
        cwd=REPO,
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [line] = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    return dict(kv.split("=", 1) for kv in line.split()[1:]), proc.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_without_cuda_it_says_so_and_exits_0():
    figures, out = gpu_check(timeout=120)
    assert figures == {"cuda": "false"}
    assert "no CUDA device here" in out


@pytest.mark.slow
def test_the_cpu_rehearsal_runs_every_step_through_the_service(tmp_path):
    figures, out = gpu_check("--cpu", "--skip-tests", "--work", str(tmp_path), timeout=600)
    # Both ways generated the clip and measured it: inference.py in its own process, then the
    # same clip accepted by a started service until succeeded.
    assert figures["cuda"] == "false" and figures["gpu"] == "cpu_rehearsal"
    assert float(figures["cli_wall_s"]) > 0 and float(figures["service_wall_s"]) > 0
    assert float(figures["cli_peak_mb"]) > 0 and float(figures["service_peak_mb"]) > 0
    assert (tmp_path / "cli.mp4").stat().st_size > 0
    # Both samplers ran and were timed per step (native: 8 steps with CFG; dmd: 4 without).
    assert float(figures["native_s_per_step"]) > 0 and float(figures["dmd_s_per_step"]) > 0
    assert "native  UniPCMultistepScheduler" in out and "8 steps x 2 DiT calls" in out
    assert "dmd     DMDScheduler" in out and "4 steps x 1 DiT calls" in out
    assert (tmp_path / "wan-tiny" / "model_index.json").is_file()
