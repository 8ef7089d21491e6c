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
import yaml

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


# Not marked slow: a whole service that measures no time against a bound (only that each step ran),
# so it runs beside the other files of the parallel pass, out of the serial one's 20 minutes.
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
    # The speed options, each in its own inference.py on the same clip and seed, timed per step
    # beside plain eager diffusers; what only a GPU runs is skipped, saying why, never silently.
    assert figures["opt_steps"] == "6"
    for choice in ("eager", "native", "compile", "cache", "fp8"):
        assert float(figures[f"opt_{choice}_s_per_step"]) > 0, choice
        assert (tmp_path / f"opt-{choice}.mp4").stat().st_size > 0, choice
        assert f"{choice}: " in out and " s/step (6 steps x 2 DiT calls; load " in out
    for key in ("opt_cudnn", "opt_flash", "ulysses", "ulysses_one_rank"):
        assert figures[f"{key}_s_per_step"] == "na", key
    assert "cudnn: skipped (CUDA only)" in out and "flash: skipped (CUDA only)" in out
    assert "ulysses: skipped (0 GPUs)" in out
    assert "speed options: native, 6 steps with CFG" in out
    # Eager is diffusers without any performance option; the others differ from it in one key.
    perf = {
        choice: yaml.safe_load((tmp_path / f"inference-opt-{choice}.yaml").read_text())["performance"]
        for choice in ("eager", "native", "compile", "cache", "fp8")
    }
    assert perf == {
        "eager": {},
        "native": {"attention_backend": "native"},
        "compile": {"compile": {"enabled": True}},
        "cache": {"step_caches": {"fbc": {"kind": "first_block", "threshold": 0.1}}},
        "fp8": {"fp8": True},
    }
