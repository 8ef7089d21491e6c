"""One denoise over a group of ranks (#23 point 3, engine side): diffusers' Ulysses context
parallelism on CPU (gloo), real processes, compared with the one-process denoise of the same
request and seed; and the refusals, naming the ``parallel`` key, of what cannot work."""

from __future__ import annotations

import functools
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from pydantic import ValidationError

from shotloom.config import InferenceConfig
from shotloom.families.wan import VACE, WanAdapter
from shotloom.parallel import (
    ParallelConfig,
    check_context_parallel,
    check_sequence,
    close_group,
    enable_context_parallel,
    group_progress,
    init_group,
    run_on_group,
)
from shotloom.request import GenerationRequest

from conftest import free_port

pytestmark = pytest.mark.usefixtures("one_torch_thread")

RANKS = 2
SHAPES = ("t2v", "t2v-a14b")  # one DiT; Wan 2.2's two experts (both get the plan)
REQ = GenerationRequest(
    prompt="a red kite over the sea",
    width=64,
    height=64,
    num_frames=9,
    fps=16,
    seed=3,
    guidance_scale=4.0,  # CFG: two DiT calls a step, each split over the ranks
    num_inference_steps=3,
)
# 9 frames -> 3 latent frames; 64 px -> 8 latent px -> 4 patches a side: 48 tokens, 24 a rank.
TOKENS = 3 * 4 * 4


class Cancelled(Exception):
    """What a progress callback raises to stop a run (as a worker's cancel does)."""


def native_config(checkpoint: Path) -> InferenceConfig:
    return InferenceConfig.model_validate(
        {
            "family": "wan",
            "paths": {"checkpoint": checkpoint},
            "sampler": {"mode": "native", "steps": 3, "guidance_scale": 4.0},
            "defaults": {"width": 64, "height": 64, "num_frames": 9, "fps": 16},
            "tiling": {"enabled": False},
        }
    )


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("parallel")
    return {shape: WanAdapter.build_tiny_checkpoint(root / shape, shape=shape) for shape in SHAPES}


def _tokens_seen(adapter: WanAdapter) -> list[int]:
    """The sequence length the second block of each DiT gets (after diffusers' split at block 0)."""
    seen: list[int] = []
    for name in adapter.generator_names():
        block = getattr(adapter.pipe, name).blocks[1]
        block.register_forward_pre_hook(lambda _m, args: seen.append(args[0].shape[1]))
    return seen


def _rank_main(rank: int, port: int, checkpoints: dict[str, Path], out_dir: Path) -> None:
    """One rank, as a worker of a device group runs it: join, load, parallelise, denoise."""
    torch.set_num_threads(1)
    device = init_group(rank, ParallelConfig(ulysses=RANKS), "cpu", master_port=port, timeout_s=60)
    report: dict = {"device": device}
    try:
        for shape, ckpt in checkpoints.items():
            adapter = WanAdapter.load(native_config(ckpt), device)
            enable_context_parallel(adapter, ParallelConfig(ulysses=RANKS))
            seen = _tokens_seen(adapter)
            cond = adapter.encode(REQ)
            start = time.perf_counter()
            out = run_on_group(functools.partial(adapter.denoise, cond, REQ, group_progress(None)))
            report[shape] = {
                "video": None if out is None else out.tensors["video"],
                "tokens": sorted(set(seen)),
                "seconds": time.perf_counter() - start,
            }

        def cancel_at_2(done: int, _total: int) -> None:
            if done == 2:
                raise Cancelled("cancelled")

        try:  # rank 0's cancel stops every rank (none is left waiting in an all-to-all)
            adapter.denoise(cond, REQ, group_progress(cancel_at_2))
        except Exception as exc:
            report["cancel"] = f"{type(exc).__name__}: {exc}"
    finally:
        close_group()
    torch.save(report, out_dir / f"rank{rank}.pt")


def _run_group(checkpoints: dict[str, Path], out_dir: Path, limit_s: float = 120.0) -> list[dict]:
    ctx = mp.start_processes(
        _rank_main, args=(free_port(), checkpoints, out_dir), nprocs=RANKS, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + limit_s
    while not ctx.join(timeout=1):  # raises if a rank raised
        if time.monotonic() > deadline:
            for process in ctx.processes:
                process.kill()
            pytest.fail(f"the {RANKS} ranks did not finish in {limit_s:.0f} s (a collective hung?)")
    return [torch.load(out_dir / f"rank{r}.pt") for r in range(RANKS)]


@pytest.mark.slow
def test_ulysses_over_two_cpu_ranks_equals_one_process(checkpoints, tmp_path):
    reports = _run_group(checkpoints, tmp_path)
    assert [r["device"] for r in reports] == ["cpu", "cpu"]
    for shape in SHAPES:
        adapter = WanAdapter.load(native_config(checkpoints[shape]))
        reference = adapter.denoise(adapter.encode(REQ), REQ).tensors["video"]
        ours, other = reports[0][shape], reports[1][shape]
        assert other["video"] is None  # rank 0 alone keeps the output
        # The sequence really was split: each rank's blocks saw half the tokens.
        assert ours["tokens"] == other["tokens"] == [TOKENS // RANKS]
        # Ulysses only changes which rank computes which heads: every head still attends over the
        # whole sequence, token-wise layers see the same rows. Measured here: bit-identical (0.0).
        # The tolerance allows a GEMM on half the rows being blocked differently by another CPU's
        # BLAS (TI2V's per-token timesteps show ~2e-6 here); a wrong split or gather is O(1).
        torch.testing.assert_close(ours["video"], reference, rtol=0, atol=1e-5)
    assert reports[0]["cancel"] == "Cancelled: cancelled"
    assert reports[1]["cancel"] == "StoppedByRankZero: rank 0 stopped the denoise at step 2/3"


def test_refusals_name_the_key(checkpoints, tmp_path):
    adapter = WanAdapter.load(native_config(checkpoints["t2v-a14b"]))
    assert adapter.pipe.transformer.config.num_attention_heads == 2
    with pytest.raises(ValueError, match=r"^parallel\.ring: ring attention needs .* none runs on cpu"):
        check_context_parallel(adapter, ParallelConfig(ring=2))
    with pytest.raises(ValueError, match=r"^parallel\.ulysses: 3 does not divide transformer's 2 attention"):
        check_context_parallel(adapter, ParallelConfig(ulysses=3))
    check_context_parallel(adapter, ParallelConfig(ulysses=2))  # both experts: 2 heads each
    # Refused before any group is needed or any DiT touched.
    with pytest.raises(ValueError, match=r"^parallel\.ulysses: 4"):
        enable_context_parallel(adapter, ParallelConfig(ulysses=4))
    assert adapter.pipe.transformer._parallel_config is None
    with pytest.raises(RuntimeError, match="init_group"):
        enable_context_parallel(adapter, ParallelConfig(ulysses=2))
    enable_context_parallel(adapter, ParallelConfig())  # degree 1: nothing to do, no group needed

    vace = WanAdapter.load(native_config(WanAdapter.build_tiny_checkpoint(tmp_path / "vace", pipeline=VACE)))
    with pytest.raises(ValueError, match=r"^parallel\.ulysses: transformer \(WanVACETransformer3DModel\)"):
        check_context_parallel(vace, ParallelConfig(ulysses=2))

    check_sequence(TOKENS, ParallelConfig(ulysses=2))
    with pytest.raises(ValueError, match=r"^width/height/num_frames: 27 DiT tokens"):
        check_sequence(3 * 3 * 3, ParallelConfig(ulysses=2))  # 48 x 48 px, 9 frames


def test_parallel_config():
    assert ParallelConfig().degree == 1
    assert ParallelConfig.model_validate({"ulysses": 2, "ring": 2}).degree == 4
    for bad in ({"ulysses": 0}, {"ring": -1}, {"tensor": 2}):
        with pytest.raises(ValidationError, match=next(iter(bad))):
            ParallelConfig.model_validate(bad)


def _rank0_fails_alone(checkpoint: Path, config_path: Path, out: Path) -> None:
    """Rank 0 of a real RankGroup whose own DiT fails mid-denoise (its third call raises, on rank 0
    only): the follower waits in that call's collective, so the group must be reported lost."""
    import os

    os.environ["SHOTLOOM_INFERENCE_CONFIG"] = str(config_path)  # the followers load it too
    from shotloom.parallel import GroupSpec, RankGroup
    from shotloom.runtime import get_runtime

    reported: list[list[int]] = []
    group = RankGroup(
        GroupSpec(
            parallel=ParallelConfig(ulysses=RANKS, collective_timeout_s=60), device_type="cpu", threads=1
        ),
        on_lost=reported.append,
    )
    rt = get_runtime(None, group.start())
    rt.group = group
    req = rt.check(rt.resolve(REQ.prompt, seed=REQ.seed))
    cond, _ = rt.condition(req)
    calls = {"n": 0}

    def fail_on_third_call(_module, _args):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("rank 0 alone fails")

    rt.adapter.pipe.transformer.register_forward_pre_hook(fail_on_third_call)
    try:
        rt.denoise(cond, req)
        outcome = "no error"
    except Exception as exc:
        outcome = type(exc).__name__
    group.close()
    torch.save({"reported": reported, "outcome": outcome}, out)


@pytest.mark.slow
def test_rank_0_failing_alone_reports_the_group_lost(checkpoints, tmp_path):
    import yaml

    config_path = tmp_path / "inference.yaml"
    config_path.write_text(yaml.safe_dump(native_config(checkpoints["t2v"]).model_dump(mode="json")))
    ctx = mp.get_context("spawn")
    proc = ctx.Process(target=_rank0_fails_alone, args=(checkpoints["t2v"], config_path, tmp_path / "r.pt"))
    proc.start()
    proc.join(120)
    assert proc.exitcode == 0
    result = torch.load(tmp_path / "r.pt")
    # Lost with no rank dead: the follower is alive but out of step (waiting in a collective).
    assert result["outcome"] == "RuntimeError" and result["reported"] == [[]]
