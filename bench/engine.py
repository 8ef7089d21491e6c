#!/usr/bin/env python
"""The DiT's speed options side by side on this CPU (#23 point 4), on a Wan T2V whose DiT is large
enough to dominate the denoise (8 blocks of 4x32 heads, 2.8M parameters, 320 tokens for a
128x128x17 clip) beside the tiny encoders and VAE, all random, built here:

- eager vs regionally compiled denoise (``performance.compile``, compiled at load): time ratio;
- uncached vs a step cache at ``--steps`` native steps with CFG (``FirstBlockCacheConfig``): the
  ratio of full DiT calls and of time, and the PSNR of the cached clip against the uncached one
  (decoded frames, uint8);
- bfloat16 vs FP8-stored DiT weights (``performance.fp8``): the ratio of DiT bytes (measured);
- one process vs a 2-rank Ulysses group over gloo (``shotloom.parallel``): max abs difference of
  the latents and the time ratio (on 2 cores the ranks share the cores: a correctness figure).

Each figure is one denoise after a warm one, same seed and request. Ends with one ``RESULT`` line.

    python bench/engine.py [--steps 20] [--threshold 0.1] [--work DIR]
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, result_line  # noqa: E402

sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from shotloom.config import InferenceConfig  # noqa: E402
from shotloom.families.wan import WanAdapter  # noqa: E402
from shotloom.runtime import ModelRuntime  # noqa: E402

DIT = {
    "num_attention_heads": 4,
    "attention_head_dim": 32,
    "ffn_dim": 768,
    "num_layers": 8,
    "freq_dim": 64,
    "rope_max_seq_len": 256,
}
CLIP = {"width": 128, "height": 128, "num_frames": 17, "fps": 16}
PROMPT = "a lighthouse at dusk, waves below"
SEED = 5


def config(
    checkpoint: Path, work: Path, steps: int, dtype: str = "float32", **performance
) -> InferenceConfig:
    return InferenceConfig.model_validate(
        {
            "family": "wan",
            "dtype": dtype,
            "paths": {"checkpoint": checkpoint, "cache_dir": work / "cache"},
            "sampler": {"mode": "native", "steps": steps, "guidance_scale": 5.0},
            "defaults": CLIP,
            "tiling": {"enabled": False},
            "performance": performance,
        }
    )


def dit_calls(rt: ModelRuntime) -> dict[str, int]:
    """Full DiT calls: the last block's feed-forward runs only when no cache skipped the step."""
    calls = {"n": 0}

    def hit(*_):
        calls["n"] += 1

    rt.adapter.pipe.transformer.blocks[-1].ffn.register_forward_pre_hook(hit)
    return calls


def timed_denoise(rt: ModelRuntime, **asked):
    """(latents, seconds of the second of two identical denoises, the request)."""
    req = rt.check(rt.resolve(PROMPT, seed=SEED, **asked))
    cond, _ = rt.condition(req)
    rt.denoise(cond, req)  # warm: allocator, caches, any lazy setup
    started = time.perf_counter()
    out = rt.denoise(cond, req)
    return out, time.perf_counter() - started, req


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


def _ulysses_rank(rank: int, ranks: int, port: int, cfg: InferenceConfig, req: dict, out: Path) -> None:
    """One rank of the group, as a device group's worker runs it: join, load, split, denoise twice."""
    from shotloom.parallel import (
        ParallelConfig,
        close_group,
        enable_context_parallel,
        init_group,
        run_on_group,
    )
    from shotloom.request import GenerationRequest

    torch.set_num_threads(1)  # the ranks share this machine's cores
    device = init_group(rank, ParallelConfig(ulysses=ranks), "cpu", master_port=port, timeout_s=300)
    try:
        adapter = WanAdapter.load(cfg, device)
        enable_context_parallel(adapter, ParallelConfig(ulysses=ranks))
        request = GenerationRequest.from_json(req)
        cond = adapter.encode(request)
        run_on_group(lambda: adapter.denoise(cond, request))  # warm, as the one-process figure
        started = time.perf_counter()
        latents = run_on_group(lambda: adapter.denoise(cond, request))
        seconds = time.perf_counter() - started
        if latents is not None:
            torch.save({"video": latents.tensors["video"], "seconds": seconds}, out)
    finally:
        close_group()


def ulysses_figures(cfg: InferenceConfig, req, eager, eager_s: float, work: Path) -> dict[str, object]:
    """A 2-rank Ulysses group (gloo, one thread a rank) against the one-process denoise of the same
    request and seed, itself timed on one thread here so both use the same cores."""
    import torch.multiprocessing as mp

    from conftest import free_port

    ranks, out = 2, work / "ulysses.pt"
    mp.start_processes(
        _ulysses_rank,
        args=(ranks, free_port(), cfg, req.to_json(), out),
        nprocs=ranks,
        start_method="spawn",
    )
    group = torch.load(out)
    return {
        "ulysses_ranks": ranks,
        "ulysses_max_abs_diff": float((group["video"] - eager.tensors["video"]).abs().max()),
        "ulysses_denoise_s": round(group["seconds"], 3),
        "ulysses_time_ratio": round(group["seconds"] / eager_s, 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="native steps (CFG: two DiT calls each)")
    parser.add_argument("--threshold", type=float, default=0.1, help="the first-block cache's threshold")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--work", type=Path, help="where the checkpoint and caches go (default: a temp dir)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    work = args.work or Path(tempfile.mkdtemp(prefix="shotloom-bench-engine-"))
    checkpoint = WanAdapter.build_tiny_checkpoint(work / "wan-bench", seed=0, shape="t2v", dit=DIT)
    steps = args.steps
    figures: dict[str, object] = {"steps": steps, "dit_params": 0}

    # Eager, and the step cache on the same runtime (a request chooses it).
    caches = {"fbc": {"kind": "first_block", "threshold": args.threshold}}
    rt = ModelRuntime(config(checkpoint, work, steps, step_caches=caches))
    figures["dit_params"] = sum(p.numel() for p in rt.adapter.pipe.transformer.parameters())
    calls = dit_calls(rt)
    eager, eager_s, req = timed_denoise(rt, step_cache="none")
    full_calls = calls["n"] // 2  # two denoises ran
    calls["n"] = 0
    cached, cached_s, cached_req = timed_denoise(rt, step_cache="fbc")
    cached_calls = calls["n"] // 2
    frames = rt.decode(eager, req).frames
    cached_frames = rt.decode(cached, cached_req).frames
    figures |= {
        "eager_denoise_s": round(eager_s, 3),
        "cache_dit_calls": f"{cached_calls}/{full_calls}",
        "cache_call_ratio": round(cached_calls / full_calls, 3),
        "cache_time_ratio": round(cached_s / eager_s, 3),
        "cache_psnr_db": round(psnr(cached_frames, frames), 2),
    }
    print(
        f"eager {eager_s:.3f}s; first-block cache {cached_s:.3f}s, {cached_calls}/{full_calls} full DiT calls"
    )

    # Regional compilation: compiled (and run once) at load; the request is timed after a warm one.
    compiled_rt = ModelRuntime(config(checkpoint, work, steps, compile={"enabled": True}))
    compiled_rt.adapter  # noqa: B018 - loads and compiles
    compiled, compiled_s, _ = timed_denoise(compiled_rt)
    figures |= {
        "compile_at_load_s": compiled_rt.compile_seconds,
        "compiled_denoise_s": round(compiled_s, 3),
        "compile_speedup": round(eager_s / compiled_s, 3),
        "compile_max_abs_diff": float((compiled.tensors["video"] - eager.tensors["video"]).abs().max()),
    }
    print(f"compiled {compiled_s:.3f}s (compile at load {compiled_rt.compile_seconds}s)")
    del compiled_rt

    # FP8 storage of the DiT against bfloat16, both measured after load.
    bf16 = ModelRuntime(config(checkpoint, work, steps, dtype="bfloat16")).adapter.generator_bytes()
    fp8 = ModelRuntime(config(checkpoint, work, steps, dtype="bfloat16", fp8=True)).adapter.generator_bytes()
    figures |= {"bf16_dit_bytes": bf16, "fp8_dit_bytes": fp8, "fp8_bytes_ratio": round(fp8 / bf16, 3)}

    # Ulysses over 2 ranks, against one process on one thread (each rank has one).
    torch.set_num_threads(1)
    one_thread, one_thread_s, _ = timed_denoise(rt, step_cache="none")
    figures |= ulysses_figures(config(checkpoint, work, steps), req, one_thread, one_thread_s, work)
    print(f"ulysses x2 {figures['ulysses_denoise_s']}s vs one process {one_thread_s:.3f}s (one thread each)")
    print(result_line(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
