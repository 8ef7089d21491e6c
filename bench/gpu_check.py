#!/usr/bin/env python
"""GPU readiness, in one run on a machine with an NVIDIA GPU (``bench/gpu_check.sh`` starts it).

1. builds a full-size, randomly initialised Wan 2.1 VACE 1.3B-shaped checkpoint on the machine
   (no download; ``WanAdapter.build_full_size_checkpoint``), in bfloat16;
2. runs the CUDA tests (tests/test_cuda.py: group-offload swap, measured peak, ``mem_get_info``
   admission, out-of-memory release and retry, residency ``auto`` choosing both ways) on it;
3. generates the same clip with ``inference.py`` and through the service (``server.py`` with one
   CUDA device worker, ``POST /r2v`` until ``succeeded``) and prints wall time and peak VRAM of
   both, side by side.

Without CUDA it says so and exits 0. Ends with one ``RESULT`` line.

    python bench/gpu_check.py [--work DIR] [--skip-tests]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, result_line, run_measured  # noqa: E402

sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

CLIP = {"width": 480, "height": 832, "num_frames": 33, "fps": 16, "seed": 3}
PROMPT = "a lighthouse at dusk, waves below"


def inference_yaml(path: Path, checkpoint: Path, cache: Path) -> Path:
    data = yaml.safe_load((REPO / "configs" / "inference.wan-tiny.yaml").read_text())
    data.update(dtype="bfloat16", device="cuda:0", offload=False)
    data["paths"] = {"checkpoint": str(checkpoint), "cache_dir": str(cache)}
    data["tiling"] = {
        "enabled": True,
        "tile_px": 256,
        "stride_px": 192,
        "tile_frames": 16,
        "stride_frames": 8,
    }
    data["memory"] = {**data["memory"], "denoise_gib": 8, "decode_gib": 8}
    path.write_text(yaml.safe_dump(data))
    return path


def through_service(root: Path, inference: Path) -> dict:
    """The same clip through server.py: accept -> succeeded wall time, the peak it recorded."""
    from api_stack import launch, stop_api_stack, wait_ready
    from conftest import free_port

    state = root / "state"
    state.mkdir()
    config = root / "server.yaml"
    config.write_text(yaml.safe_dump({
        "state_dir": str(state),
        "webserver": {"host": "127.0.0.1", "port": free_port()},
        "inference": {"config": str(inference)},
        "workers": {"warm": True, "devices": [{"device": "cuda:0"}]},
        "api": {"host": "127.0.0.1", "port": free_port()},
    }))  # fmt: skip
    started = time.perf_counter()
    stack = launch(config, state)
    try:
        wait_ready(stack, timeout=480)
        ready_s = time.perf_counter() - started
        body = {"work_id": "gpu", "shot_id": "s0", "prompt": PROMPT, "memory_slots": [], **CLIP}
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
    args = p.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device here: nothing to check (run this on a machine with an NVIDIA GPU)")
        print(result_line({"cuda": "false"}))
        return 0
    root = args.work or Path(tempfile.mkdtemp(prefix="shotloom-gpu-"))
    root.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name(0)
    print(f"{name}, torch {torch.__version__}, work under {root}", flush=True)

    from shotloom.families.wan import WanAdapter

    checkpoint = root / "wan2.1-vace-1.3b-random"
    start = time.perf_counter()
    if not (checkpoint / "model_index.json").is_file():
        WanAdapter.build_full_size_checkpoint(checkpoint, seed=0)
    build_s = time.perf_counter() - start
    print(f"checkpoint built in {build_s:.0f} s at {checkpoint}", flush=True)

    env = {**os.environ, "SHOTLOOM_GPU_CHECKPOINT": str(checkpoint), "PYTHONUNBUFFERED": "1"}
    tests_ok = True
    if not args.skip_tests:
        tests = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-s", "tests/test_cuda.py"], cwd=REPO, env=env
        )
        tests_ok = tests.returncode == 0

    inference = inference_yaml(root / "inference.yaml", checkpoint, root / "cache-cli")
    cmd = [sys.executable, "inference.py", "--config", str(inference), "--prompt", PROMPT]
    cmd += ["--output", str(root / "cli.mp4")]
    cmd += [f"--{k.replace('_', '-')}={v}" for k, v in CLIP.items()]
    cli_wall, _, out = run_measured(cmd)
    cli = json.loads(out.strip().splitlines()[-1])
    service = through_service(
        root, inference_yaml(root / "inference-svc.yaml", checkpoint, root / "cache-svc")
    )

    print()
    print(f"{'one clip ' + str(CLIP):<60}")
    print(f"{'':<22}{'wall s':>10}{'peak VRAM MiB':>16}")
    print(f"{'inference.py':<22}{cli_wall:>10.1f}{cli['peak_memory_mb']:>16.0f}")
    peak = service["peak_mb"] or float("nan")
    print(f"{'service (accept->done)':<22}{service['wall_s']:>10.1f}{peak:>16.0f}")
    print(f"service ready (GET /health 200) {service['ready_s']:.0f} s after start; CUDA tests: {tests_ok}")
    print(result_line({
        "cuda": "true",
        "gpu": name.replace(" ", "_"),
        "build_s": round(build_s, 1),
        "cuda_tests_passed": str(tests_ok).lower(),
        "cli_wall_s": round(cli_wall, 2),
        "cli_peak_mb": cli["peak_memory_mb"],
        "service_wall_s": round(service["wall_s"], 2),
        "service_peak_mb": service["peak_mb"],
        "service_over_cli": round(service["wall_s"] / cli_wall, 3),
    }))  # fmt: skip
    return 0 if tests_ok else 1


if __name__ == "__main__":
    sys.exit(main())
