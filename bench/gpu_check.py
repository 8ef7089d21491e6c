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
   is included);
5. speed options (the inference YAML's ``performance``, see the README's "Speed on a device"):
   native sampling with CFG, 20 steps, the same clip and seed, each choice in a fresh
   ``inference.py`` process, seconds per step beside plain eager diffusers (no ``performance``
   option): ``cudnn`` (attention ``_native_cudnn``), ``flash`` (attention ``flash``, where
   ``import flash_attn`` works), ``compile`` (regional, compiled at load: its load time shows
   it, the s/step excludes it), ``cache`` (a first-block step cache at 0.1, ``--step-cache``),
   ``fp8`` (float8-stored DiT weights, computed in bfloat16) and, where there are 2 GPUs,
   ``ulysses`` (a 2-rank group, ``shotloom.parallel``, on a T2V checkpoint with the same DiT
   dims, against one rank of it: Wan VACE's DiT has no context-parallel plan in diffusers).
   A choice that fails prints its error and ``=error`` and the others go on; one that cannot
   run here prints why it is skipped and ``=na``. Past ``--budget-s`` (540 s on the GPU, from
   the start) the choices left are skipped and a running one is stopped, so the ``RESULT``
   line comes within one device call.

Without CUDA it says so and exits 0. Ends with one ``RESULT`` line. ``--cpu`` rehearses the whole
script on the CPU with the tiny checkpoint and a tiny clip (the CUDA tests skip; speed options at
6 steps, attention ``native`` in place of the CUDA kernels, every choice must succeed), so its
steps and the packing of ``bench/gpu_carry.py`` can be tried before a GPU session spends device
time.

    python bench/gpu_check.py [--work DIR] [--skip-tests] [--cpu] [--budget-s S]
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
from dataclasses import dataclass, replace
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
    option_steps: int  # native steps (with CFG) of the speed options
    option_inference: dict  # over the inference YAML, for the speed options only
    budget_s: float | None  # from the start: past it no speed option starts (None: no limit)


GPU = Target(
    device="cuda:0",
    clip={"width": 480, "height": 832, "num_frames": 33, "seed": 3},  # fps: the config's default
    inference={
        "dtype": "bfloat16",
        "tiling": {"enabled": True, "tile_px": 256, "stride_px": 192, "tile_frames": 16, "stride_frames": 8},
        "memory": {"denoise_gib": 8, "decode_gib": 8},
    },
    full_size=True,
    option_steps=20,
    option_inference={},
    budget_s=540,  # one device call is 600 s, the packing's unpacking included
)
CPU_REHEARSAL = Target(
    device="cpu",
    clip={"seed": 3},
    inference={},
    full_size=False,
    option_steps=6,
    option_inference={"tiling": {"enabled": False}},  # an untiled decode: quicker, and not timed
    budget_s=None,
)


SAMPLERS = {
    "native": {"mode": "native", "steps": 8, "guidance_scale": 5.0},
    "dmd": {"mode": "dmd", "sigmas": [1.0, 0.75, 0.5, 0.25], "shift": 1.0, "guidance_scale": 1.0},
}


# The full-size Wan 2.1 1.3B DiT's dims on a T2V checkpoint (Ulysses: Wan VACE's DiT has no
# context-parallel plan in diffusers 0.42.1); text_dim stays the tiny text encoder's width.
T2V_DIT = {
    "num_attention_heads": 12,
    "attention_head_dim": 128,
    "ffn_dim": 8960,
    "num_layers": 30,
    "freq_dim": 256,
    "rope_max_seq_len": 1024,
}
FIRST_BLOCK = {"fbc": {"kind": "first_block", "threshold": 0.1}}


@dataclass(frozen=True)
class Choice:
    """One speed option: its ``performance`` section, the inference.py flags it needs, what the
    table says of it; ``skip``: why it does not run here (printed, ``na`` in RESULT)."""

    name: str
    performance: dict
    what: str
    args: tuple[str, ...] = ()
    skip: str | None = None


def speed_choices(target: Target) -> list[Choice]:
    cuda = target.full_size
    if not cuda:
        flash_skip = "CUDA only"
    else:  # in the interpreter inference.py runs in: a wheel built for another torch fails here
        probe = subprocess.run([sys.executable, "-c", "import flash_attn"], capture_output=True)
        flash_skip = None if probe.returncode == 0 else "flash-attn not installed"
    choices = [Choice("eager", {}, "plain diffusers (torch SDPA)")]
    if not cuda:
        choices.append(Choice("native", {"attention_backend": "native"}, "attention native"))
    choices += [
        Choice(
            "cudnn",
            {"attention_backend": "_native_cudnn"},
            "attention _native_cudnn",
            skip=None if cuda else "CUDA only",
        ),
        Choice("flash", {"attention_backend": "flash"}, "attention flash", skip=flash_skip),
        Choice("compile", {"compile": {"enabled": True}}, "compile_repeated_blocks, at load"),
        Choice(
            "cache",
            {"step_caches": FIRST_BLOCK},
            "first_block cache, threshold 0.1",
            args=("--step-cache", "fbc"),
        ),
        Choice("fp8", {"fp8": True}, f"float8 DiT weights, {'bfloat16' if cuda else 'float32'} compute"),
    ]
    return choices


def inference_yaml(
    path: Path,
    target: Target,
    checkpoint: Path,
    cache: Path,
    sampler: dict | None = None,
    performance: dict | None = None,
) -> Path:
    """The tiny config with ``target``'s settings; ``performance`` given: it replaces the tiny
    config's, with ``target.option_inference`` and the clip's geometry as the defaults (the
    compiled blocks' warm-up at load runs at the defaults, so the timed clip does not recompile)."""
    data = yaml.safe_load((REPO / "configs" / "inference.wan-tiny.yaml").read_text())
    data.update(target.inference, device=target.device, offload=False)
    if sampler is not None:
        data["sampler"] = sampler
    if performance is not None:
        data.update(target.option_inference, performance=performance)
        geometry = ("width", "height", "num_frames", "fps")
        data["defaults"] = {**data["defaults"], **{k: v for k, v in target.clip.items() if k in geometry}}
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


def run_inference(config: Path, output: Path, target: Target, args=(), timeout: float | None = None) -> dict:
    """One clip with inference.py in a fresh process: the JSON line it prints; a failure (or a
    run past ``timeout``) raises RuntimeError with the last line it wrote to stderr."""
    cmd = [sys.executable, "inference.py", "--config", str(config), "--prompt", PROMPT]
    cmd += ["--output", str(output), *(f"--{k.replace('_', '-')}={v}" for k, v in target.clip.items())]
    try:
        proc = subprocess.run([*cmd, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"stopped after {timeout:.0f} s (the --budget-s limit)") from exc
    if proc.returncode:
        lines = [x.strip() for x in proc.stderr.replace("\r", "\n").splitlines() if x.strip()]
        raise RuntimeError(f"exit {proc.returncode}: {lines[-1] if lines else 'no stderr'}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _ulysses_rank(rank: int, ranks: int, port: int, config: str, req: dict, out: str) -> None:
    """One rank: join the group, load, split the DiT (no-op for one rank), time one denoise."""
    import torch

    from shotloom.config import load_inference_config
    from shotloom.families.wan import WanAdapter
    from shotloom.parallel import (
        ParallelConfig,
        close_group,
        enable_context_parallel,
        init_group,
        run_on_group,
    )
    from shotloom.request import GenerationRequest

    cfg = load_inference_config(config)
    kind = torch.device(cfg.device).type
    parallel = ParallelConfig(ulysses=ranks)
    device = init_group(rank, parallel, kind, master_port=port, timeout_s=300)
    try:
        adapter = WanAdapter.load(cfg, device)
        enable_context_parallel(adapter, parallel)
        request = GenerationRequest.from_json(req)
        cond = adapter.encode(request)
        sync = torch.cuda.synchronize if kind == "cuda" else (lambda: None)
        sync()
        started = time.perf_counter()
        run_on_group(lambda: adapter.denoise(cond, request))
        sync()
        if rank == 0:
            steps = request.num_inference_steps
            Path(out).write_text(json.dumps({"s_per_step": (time.perf_counter() - started) / steps}))
    finally:
        close_group()


def ulysses(root: Path, target: Target) -> tuple[float, float]:
    """Seconds per step of one rank and of a 2-rank Ulysses group (``shotloom.parallel``) on a T2V
    checkpoint with the full-size DiT dims (tiny with ``--cpu``), same request and seed; each rank
    in its own process, the first step's warm-up included as in inference.py."""
    import torch.multiprocessing as mp

    from shotloom.config import load_inference_config
    from shotloom.families.wan import WanAdapter
    from shotloom.runtime import ModelRuntime

    from conftest import free_port

    checkpoint = root / ("wan2.1-t2v-1.3b-dit-random" if target.full_size else "wan-tiny-t2v")
    if not (checkpoint / "model_index.json").is_file():
        dit = T2V_DIT if target.full_size else None
        WanAdapter.build_tiny_checkpoint(checkpoint, seed=0, shape="t2v", dit=dit)
    sampler = {**SAMPLERS["native"], "steps": target.option_steps}
    config = inference_yaml(
        root / "inference-ulysses.yaml", target, checkpoint, root / "cache-ulysses", sampler, {}
    )
    req = ModelRuntime(load_inference_config(config)).resolve(PROMPT, **target.clip).to_json()
    seconds = []
    for ranks in (1, 2):
        out = root / f"ulysses-{ranks}.json"
        args = (ranks, free_port(), str(config), req, str(out))
        mp.start_processes(_ulysses_rank, args=args, nprocs=ranks, start_method="spawn")
        seconds.append(json.loads(out.read_text())["s_per_step"])
    return seconds[0], seconds[1]


def speed_options(
    root: Path, target: Target, checkpoint: Path, deadline: float | None
) -> tuple[dict, list[str]]:
    """Phase 5: every choice of :func:`speed_choices` on the same clip and seed, then Ulysses;
    prints a line as each ends; returns the RESULT figures and the table's lines."""
    import torch

    sampler = {**SAMPLERS["native"], "steps": target.option_steps}
    rows: list[tuple[str, str, float | None, float | None, str]] = []  # name, what, s/step, load s, note
    figures: dict[str, object] = {"opt_steps": target.option_steps}

    def left() -> float | None:
        return None if deadline is None else deadline - time.perf_counter()

    def past_budget() -> str | None:  # a choice needs half a minute at least: it would be stopped
        remaining = left()
        return None if remaining is None or remaining > 30 else f"past the {target.budget_s:.0f} s budget"

    for choice in speed_choices(target):
        key = f"opt_{choice.name}_s_per_step"
        if (skip := choice.skip or past_budget()) is not None:
            print(f"{choice.name}: skipped ({skip})", flush=True)
            rows.append((choice.name, choice.what, None, None, f"skipped ({skip})"))
            figures[key] = "na"
            continue
        config = inference_yaml(
            root / f"inference-opt-{choice.name}.yaml",
            target,
            checkpoint,
            root / "cache-opt",
            sampler,
            choice.performance,
        )
        try:
            run = run_inference(config, root / f"opt-{choice.name}.mp4", target, choice.args, left())
            cache = run["sampling"]["step_cache"]["name"]
            if cache != ("fbc" if choice.args else "none"):
                raise RuntimeError(f"ran with step cache {cache!r}")
        except Exception as exc:  # on the GPU one choice's failure is a figure, not the end
            if not target.full_size:  # the rehearsal proves every choice runs
                raise
            print(f"{choice.name}: error: {exc}", flush=True)
            rows.append((choice.name, choice.what, None, None, f"error: {exc}"[:70]))
            figures[key] = "error"
            continue
        sampling, load_s = run["sampling"], run["timings"]["load"]
        seconds = run["timings"]["denoise"] / sampling["steps"]
        print(
            f"{choice.name}: {seconds:.4f} s/step ({sampling['steps']} steps x "
            f"{sampling['dit_calls_per_step']} DiT calls; load {load_s:.1f} s)",
            flush=True,
        )
        rows.append((choice.name, choice.what, seconds, load_s, ""))
        figures[key] = round(seconds, 4)

    gpus = torch.cuda.device_count() if target.full_size else 0
    skip = f"{gpus} GPU{'' if gpus == 1 else 's'}" if gpus < 2 else past_budget()
    one_rank = two_ranks = "na"
    what = "2-rank Ulysses, T2V DiT (vs 1 rank)"
    if skip is not None:
        print(f"ulysses: skipped ({skip})", flush=True)
        rows.append(("ulysses", what, None, None, f"skipped ({skip})"))
    else:
        try:
            one_rank, two_ranks = ulysses(root, target)
            print(f"ulysses: {two_ranks:.4f} s/step on 2 GPUs, {one_rank:.4f} on one", flush=True)
            rows.append(("ulysses", what, two_ranks, None, f"{one_rank / two_ranks:.2f}x vs 1 rank"))
            one_rank, two_ranks = round(one_rank, 4), round(two_ranks, 4)
        except Exception as exc:  # a rank's failure (torch.multiprocessing re-raises it here)
            if not target.full_size:
                raise
            print(f"ulysses: error: {type(exc).__name__}: {exc}", flush=True)
            rows.append(("ulysses", what, None, None, "error"))
            one_rank = two_ranks = "error"
    figures |= {"ulysses_s_per_step": two_ranks, "ulysses_one_rank_s_per_step": one_rank}

    eager = next((seconds for name, _, seconds, _, _ in rows if name == "eager"), None)
    table = [
        f"speed options: native, {target.option_steps} steps with CFG, clip {target.clip}, "
        "each in a fresh inference.py",
        f"{'choice':<9}{'what':<40}{'s/step':>9}{'vs eager':>10}{'load s':>9}",
    ]
    for name, what_, seconds, load_s, note in rows:
        if seconds is None:
            table.append(f"{name:<9}{what_:<40}  {note}")
            continue
        speedup = f"{eager / seconds:.2f}x" if eager is not None and name != "ulysses" else ""
        load = f"{load_s:.1f}" if load_s is not None else ""
        table.append(f"{name:<9}{what_:<40}{seconds:>9.4f}{speedup:>10}{load:>9}  {note}".rstrip())
    table += [
        "(s/step: the denoise over its steps, the first step's warm-up included; load s: the model's",
        " load, compile's compilation in it; cache: the DiT calls it saved are not counted by inference.py)",
    ]
    return figures, table


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", type=Path, help="where the checkpoint and states go (default: a temp dir)")
    p.add_argument("--skip-tests", action="store_true", help="only the inference.py / service comparison")
    p.add_argument("--cpu", action="store_true", help="rehearse on the CPU with the tiny checkpoint")
    p.add_argument(
        "--budget-s",
        type=float,
        help="seconds from the start past which no speed option starts and a running one stops "
        "(default: 540 on the GPU, none with --cpu)",
    )
    args = p.parse_args()
    import torch

    target = CPU_REHEARSAL if args.cpu else GPU
    if not args.cpu and not torch.cuda.is_available():
        print("no CUDA device here: nothing to check (run this on a machine with an NVIDIA GPU)")
        print(result_line({"cuda": "false"}))
        return 0
    began = time.perf_counter()
    budget = args.budget_s if args.budget_s is not None else target.budget_s
    target = replace(target, budget_s=budget)
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
    deadline = None if target.budget_s is None else began + target.budget_s
    options, options_table = speed_options(root, target, checkpoint, deadline)

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
    print()
    print("\n".join(options_table))
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
        **options,
        "total_s": round(time.perf_counter() - began, 1),
    }))  # fmt: skip
    return 0 if tests_ok else 1


if __name__ == "__main__":
    sys.exit(main())
