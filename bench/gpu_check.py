#!/usr/bin/env python
"""GPU readiness, in one run on a machine with an NVIDIA GPU (``bench/gpu_check.sh`` starts it).

1. builds a full-size, randomly initialised Wan 2.1 VACE 1.3B-shaped checkpoint on the machine
   (no download; ``WanAdapter.build_full_size_checkpoint``), in bfloat16;
2. runs the CUDA tests (tests/test_cuda.py: group-offload swap, measured peak, ``mem_get_info``
   admission, out-of-memory release and retry, residency ``auto`` choosing both ways) on it;
3. generates the same clip with ``inference.py`` and through the service (``server.py`` with one
   CUDA device worker, ``POST /r2v`` until ``succeeded``) and prints wall time and peak VRAM of
   both, side by side;
4. samples the clip with ``inference.py`` under both samplers, ``native`` (the checkpoint's UniPC,
   8 steps with CFG: two DiT calls a step) and ``dmd`` (4 sigmas, no CFG), and prints seconds per
   step of each (the denoise stage over its steps, in a fresh process: the first step's warm-up
   is included).

Without CUDA it says so and exits 0. Ends with one ``RESULT`` line. ``--cpu`` rehearses the whole
script on the CPU with the tiny checkpoint and a tiny clip (the CUDA tests skip), so its steps
and the packing of ``bench/gpu_carry.py`` can be tried before a GPU session spends device time.

    python bench/gpu_check.py [--work DIR] [--skip-tests] [--cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, result_line, run_measured  # noqa: E402

sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

PROMPT = "a lighthouse at dusk, waves below"


@dataclass(frozen=True)
class Target:
    """Where the check runs: the GPU (a full-size checkpoint) or the CPU rehearsal (the tiny one)."""

    device: str
    clip: dict
    inference: dict  # over configs/inference.wan-tiny.yaml
    full_size: bool


GPU = Target(
    device="cuda:0",
    clip={"width": 480, "height": 832, "num_frames": 33, "seed": 3},  # fps: the config's default
    inference={
        "dtype": "bfloat16",
        "tiling": {"enabled": True, "tile_px": 256, "stride_px": 192, "tile_frames": 16, "stride_frames": 8},
        "memory": {"denoise_gib": 8, "decode_gib": 8},
    },
    full_size=True,
)
CPU_REHEARSAL = Target(device="cpu", clip={"seed": 3}, inference={}, full_size=False)


SAMPLERS = {
    "native": {"mode": "native", "steps": 8, "guidance_scale": 5.0},
    "dmd": {"mode": "dmd", "sigmas": [1.0, 0.75, 0.5, 0.25], "shift": 1.0, "guidance_scale": 1.0},
}


def inference_yaml(
    path: Path, target: Target, checkpoint: Path, cache: Path, sampler: dict | None = None
) -> Path:
    data = yaml.safe_load((REPO / "configs" / "inference.wan-tiny.yaml").read_text())
    data.update(target.inference, device=target.device, offload=False)
    if sampler is not None:
        data["sampler"] = sampler
    data["memory"] = {**data["memory"], **target.inference.get("memory", {})}
    data["paths"] = {"checkpoint": str(checkpoint), "cache_dir": str(cache)}
    # The tiny config's LoRA adapters are shaped for the tiny DiT; the check needs none.
    data["adapters"] = []
    data["tiny"] = {**data["tiny"], "build_if_missing": False}
    path.write_text(yaml.safe_dump(data))
    return path


def through_service(root: Path, target: Target, inference: Path) -> dict:
    """The same clip through server.py: accept -> succeeded wall time, the peak it recorded."""
    from api_stack import launch, stop_api_stack, wait_ready
    from conftest import free_port

    state = root / "state"
    shutil.rmtree(state, ignore_errors=True)  # a fresh service each try; the checkpoint is kept
    state.mkdir()
    config = root / "server.yaml"
    config.write_text(yaml.safe_dump({
        "state_dir": str(state),
        "webserver": {"host": "127.0.0.1", "port": free_port()},
        "inference": {"config": str(inference)},
        "workers": {"warm": True, "devices": [{"device": target.device}]},
        "api": {"host": "127.0.0.1", "port": free_port()},
    }))  # fmt: skip
    started = time.perf_counter()
    stack = launch(config, state)
    try:
        wait_ready(stack, timeout=480)
        ready_s = time.perf_counter() - started
        body = {"work_id": "gpu", "shot_id": "s0", "prompt": PROMPT, "memory_slots": [], **target.clip}
        start = time.perf_counter()
        resp = stack.post("/r2v", body)
        assert resp.status_code == 202, resp.text
        done = stack.wait_version(resp.json()["version_id"], timeout=480)
        wall = time.perf_counter() - start
        assert done["status"] == "succeeded", done
        [video] = [a for a in done["artifacts"] if a["kind"] == "video"]
        return {"wall_s": wall, "ready_s": ready_s, "peak_mb": video["metadata"].get("peak_memory_mb")}
    finally:
        stop_api_stack(stack)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", type=Path, help="where the checkpoint and states go (default: a temp dir)")
    p.add_argument("--skip-tests", action="store_true", help="only the inference.py / service comparison")
    p.add_argument("--cpu", action="store_true", help="rehearse on the CPU with the tiny checkpoint")
    args = p.parse_args()
    import torch

    target = CPU_REHEARSAL if args.cpu else GPU
    if not args.cpu and not torch.cuda.is_available():
        print("no CUDA device here: nothing to check (run this on a machine with an NVIDIA GPU)")
        print(result_line({"cuda": "false"}))
        return 0
    began = time.perf_counter()
    root = args.work or Path(tempfile.mkdtemp(prefix="shotloom-gpu-"))
    root.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name(0) if target.full_size else "cpu rehearsal"
    print(f"{name}, torch {torch.__version__}, work under {root}", flush=True)

    from shotloom.families.wan import WanAdapter

    checkpoint = root / ("wan2.1-vace-1.3b-random" if target.full_size else "wan-tiny")
    start = time.perf_counter()
    if not (checkpoint / "model_index.json").is_file():
        if target.full_size:
            WanAdapter.build_full_size_checkpoint(checkpoint, seed=0)
        else:
            WanAdapter.build_tiny_checkpoint(checkpoint, seed=0)
    build_s = time.perf_counter() - start
    print(f"checkpoint built in {build_s:.0f} s at {checkpoint}", flush=True)

    # The image's own pytest plugins need not match the pytest packed beside this project.
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    if target.full_size:
        env["SHOTLOOM_GPU_CHECKPOINT"] = str(checkpoint)
    tests_ok = True
    if not args.skip_tests:
        tests = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-s", "tests/test_cuda.py"], cwd=REPO, env=env
        )
        tests_ok = tests.returncode == 0

    def generate(config: Path, output: Path) -> tuple[float, dict]:
        """One clip with inference.py: its wall time and the JSON line it prints."""
        cmd = [sys.executable, "inference.py", "--config", str(config), "--prompt", PROMPT]
        cmd += ["--output", str(output), *(f"--{k.replace('_', '-')}={v}" for k, v in target.clip.items())]
        wall, _, out = run_measured(cmd)
        return wall, json.loads(out.strip().splitlines()[-1])

    cli_wall, cli = generate(
        inference_yaml(root / "inference.yaml", target, checkpoint, root / "cache-cli"), root / "cli.mp4"
    )
    service = through_service(
        root, target, inference_yaml(root / "inference-svc.yaml", target, checkpoint, root / "cache-svc")
    )
    per_step = {}
    for mode, sampler in SAMPLERS.items():
        config = inference_yaml(
            root / f"inference-{mode}.yaml", target, checkpoint, root / "cache-cli", sampler
        )
        _, run = generate(config, root / f"{mode}.mp4")
        per_step[mode] = (run["timings"]["denoise"] / run["sampling"]["steps"], run["sampling"])

    print()
    print(f"{'one clip ' + str(target.clip):<60}")
    print(f"{'':<22}{'wall s':>10}{'peak MiB':>16}")
    print(f"{'inference.py':<22}{cli_wall:>10.1f}{cli['peak_memory_mb']:>16.0f}")
    peak = service["peak_mb"] or float("nan")
    print(f"{'service (accept->done)':<22}{service['wall_s']:>10.1f}{peak:>16.0f}")
    print(f"service ready (GET /health 200) {service['ready_s']:.0f} s after start; CUDA tests: {tests_ok}")
    for mode, (seconds, sampling) in per_step.items():
        print(
            f"{mode:<7} {sampling['scheduler']:<26} {sampling['steps']} steps x "
            f"{sampling['dit_calls_per_step']} DiT calls: {seconds:.3f} s/step"
        )
    print(result_line({
        "cuda": str(target.full_size).lower(),
        "gpu": name.replace(" ", "_"),
        "build_s": round(build_s, 1),
        "cuda_tests_passed": str(tests_ok).lower(),
        "cli_wall_s": round(cli_wall, 2),
        "cli_peak_mb": cli["peak_memory_mb"],
        "service_wall_s": round(service["wall_s"], 2),
        "service_peak_mb": service["peak_mb"],
        "service_over_cli": round(service["wall_s"] / cli_wall, 3),
        "native_s_per_step": round(per_step["native"][0], 4),
        "dmd_s_per_step": round(per_step["dmd"][0], 4),
        "total_s": round(time.perf_counter() - began, 1),
    }))  # fmt: skip
    return 0 if tests_ok else 1


if __name__ == "__main__":
    sys.exit(main())
