"""The inference YAML's ``performance`` (#23 points 1-2): diffusers' attention backends, step caches,
FP8 weight storage and regional compilation on the real tiny Wan, each proven at load (a choice
the device cannot do is refused naming its key) and a step cache chosen per request."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from pydantic import ValidationError

from shotloom.capabilities import CapabilityError
from shotloom.config import REPO_ROOT, InferenceConfig
from shotloom.families.wan import WanAdapter
from shotloom.performance import PerformanceError
from shotloom.runtime import ModelRuntime

pytestmark = pytest.mark.usefixtures("one_torch_thread")

STEPS = 12  # enough steps for a cache to have something to skip
CACHES = {
    "fbc": {"kind": "first_block", "threshold": 0.2},
    "taylor": {"kind": "taylorseer", "cache_interval": 3, "disable_cache_before_step": 2,
               "cache_identifiers": [r"^blocks\.\d+$"]},
    "mag": {"kind": "mag", "threshold": 0.1, "mag_ratios": [1.0] * 8},
}  # fmt: skip


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return WanAdapter.build_tiny_checkpoint(tmp_path_factory.mktemp("perf") / "t2v", shape="t2v")


def config(checkpoint: Path, cache_dir: Path, dtype: str = "float32", **performance) -> InferenceConfig:
    return InferenceConfig.model_validate(
        {
            "family": "wan",
            "dtype": dtype,
            "paths": {"checkpoint": checkpoint, "cache_dir": cache_dir},
            "sampler": {"mode": "native", "steps": STEPS, "guidance_scale": 4.0},
            "defaults": {"width": 64, "height": 64, "num_frames": 9, "fps": 16},
            "tiling": {"enabled": False},
            "performance": performance,
        }
    )


def denoise(rt: ModelRuntime, **asked):
    req = rt.check(rt.resolve("a red kite over the sea", seed=3, **asked))
    cond, _ = rt.condition(req)
    return rt.denoise(cond, req)


def count_block_calls(rt: ModelRuntime) -> dict[str, int]:
    """Forward calls inside the DiT's last block (its feed-forward): a cache hook replaces the
    block's forward, so a skipped step never reaches it (hooks on the block itself still fire)."""
    calls = {"last_block": 0}

    def hit(*_):
        calls["last_block"] += 1

    rt.adapter.pipe.transformer.blocks[-1].ffn.register_forward_pre_hook(hit)
    return calls


@pytest.fixture(scope="module")
def eager(checkpoint, tmp_path_factory):
    rt = ModelRuntime(config(checkpoint, tmp_path_factory.mktemp("cache")))
    return denoise(rt).tensors["video"]


def test_a_request_chooses_its_step_cache_and_the_next_one_starts_clean(checkpoint, eager, tmp_path):
    rt = ModelRuntime(config(checkpoint, tmp_path, step_caches=CACHES, step_cache="fbc"))
    calls = count_block_calls(rt)

    by_default = denoise(rt)  # the model's default: fbc
    assert by_default.meta["sampling"]["step_cache"] == {
        "name": "fbc",
        "kind": "first_block",
        "threshold": 0.2,
    }
    skipped = 2 * STEPS - calls["last_block"]
    assert skipped > 0  # whole steps ran without the blocks after the first
    video = by_default.tensors["video"]
    assert not torch.equal(video, eager) and (video - eager).abs().max() < 0.5

    for name in ("taylor", "mag"):
        calls["last_block"] = 0
        out = denoise(rt, step_cache=name)
        assert out.meta["sampling"]["step_cache"]["name"] == name
        assert calls["last_block"] < 2 * STEPS, name

    calls["last_block"] = 0
    off = denoise(rt, step_cache="none")  # no hook left behind, no state carried over
    assert off.meta["sampling"]["step_cache"] == {"name": "none"}
    assert calls["last_block"] == 2 * STEPS
    assert torch.equal(off.tensors["video"], eager)
    assert torch.equal(denoise(rt).tensors["video"], video)  # the cache's state was reset

    with pytest.raises(CapabilityError, match="step_cache") as refused:
        rt.check(rt.resolve("x", seed=1, step_cache="teacache"))
    assert refused.value.field == "step_cache" and "'fbc'" in refused.value.message


def test_fp8_stores_the_dit_in_float8_and_the_estimate_counts_it(checkpoint, tmp_path):
    bf16 = ModelRuntime(config(checkpoint, tmp_path, dtype="bfloat16"))
    fp8 = ModelRuntime(config(checkpoint, tmp_path, dtype="bfloat16", fp8=True))
    cold_bf16, cold_fp8 = bf16.footprint().generator_bytes, fp8.footprint().generator_bytes
    reference = denoise(bf16).tensors["video"]
    out = denoise(fp8).tensors["video"]

    linear = fp8.adapter.pipe.transformer.blocks[0].attn1.to_q
    assert linear.weight.dtype == torch.float8_e4m3fn  # stored as float8 ...
    assert fp8.adapter.pipe.transformer.blocks[0].norm2.weight.dtype != torch.float8_e4m3fn  # norms kept
    assert not torch.equal(out, reference) and (out - reference).abs().max() < 0.5  # ... computed in bf16
    warm_bf16, warm_fp8 = bf16.footprint().generator_bytes, fp8.footprint().generator_bytes
    assert warm_fp8 < 0.8 * warm_bf16
    # The cold estimate (file headers) misses the same non-file buffers with or without fp8: it
    # counts float8 layers at their real size, not at the load dtype.
    assert warm_fp8 - cold_fp8 == warm_bf16 - cold_bf16
    assert cold_fp8 < cold_bf16


@pytest.mark.parametrize(
    ("performance", "key"),
    [
        ({"attention_backend": "_native_cudnn"}, "performance.attention_backend"),  # CUDA only
        ({"attention_backend": "flash"}, "performance.attention_backend"),  # flash-attn not installed
        ({"attention_backend": "no-such-backend"}, "performance.attention_backend"),
        # diffusers' default patterns match no Wan module (attn1/attn2): a cache that hooks nothing
        ({"step_caches": {"ts": {"kind": "taylorseer"}}}, "performance.step_caches.ts"),
    ],
)
def test_a_choice_the_device_cannot_do_refuses_to_load_naming_the_key(checkpoint, tmp_path, performance, key):
    rt = ModelRuntime(config(checkpoint, tmp_path, **performance))
    with pytest.raises(PerformanceError) as refused:
        rt.adapter  # noqa: B018 - loads
    assert refused.value.key == key and str(refused.value).startswith(key)


def test_the_native_backend_runs_as_the_default(checkpoint, eager, tmp_path):
    rt = ModelRuntime(config(checkpoint, tmp_path, attention_backend="native"))
    assert torch.equal(denoise(rt).tensors["video"], eager)


def test_the_yaml_names_only_declared_caches(checkpoint, tmp_path):
    with pytest.raises(ValidationError, match="step_cache"):
        config(checkpoint, tmp_path, step_caches=CACHES, step_cache="teacache")
    with pytest.raises(ValidationError, match="reserved"):
        config(checkpoint, tmp_path, step_caches={"none": CACHES["fbc"]})


def test_compiled_at_load_so_the_default_shape_does_not_recompile(checkpoint, eager, tmp_path):
    from torch._dynamo.utils import counters

    rt = ModelRuntime(config(checkpoint, tmp_path, compile={"enabled": True}))
    rt.adapter  # noqa: B018 - loads, compiles and runs the default shape once
    assert rt.compile_seconds is not None and rt.adapter.encoder_counter.total == 0
    graphs = counters["stats"]["unique_graphs"]
    out = denoise(rt).tensors["video"]
    assert counters["stats"]["unique_graphs"] == graphs  # nothing compiled for the request
    assert torch.allclose(out, eager, atol=1e-4)  # inductor fuses ops: float rounding differs


def run_cli(config_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SHOTLOOM_", "ECHO_"))}
    argv = [sys.executable, str(REPO_ROOT / "inference.py"), "--config", str(config_path), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=REPO_ROOT, env=env)


def test_inference_cli_step_cache_and_refusal(checkpoint, tmp_path):
    good = tmp_path / "good.yaml"
    data = config(checkpoint, tmp_path / "cache", step_caches=CACHES).model_dump(mode="json")
    good.write_text(yaml.safe_dump(data))
    done = run_cli(
        good, "--prompt", "a kite", "--seed", "1", "--step-cache", "fbc", "--output", str(tmp_path / "a.mp4")
    )
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["sampling"]["step_cache"]["name"] == "fbc"

    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**data, "performance": {"attention_backend": "_native_cudnn"}}))
    done = run_cli(bad, "--prompt", "a kite", "--output", str(tmp_path / "b.mp4"))
    assert done.returncode == 2 and "performance.attention_backend" in done.stderr
    assert not (tmp_path / "b.mp4").exists()


def test_a_device_worker_refuses_to_start_on_a_choice_its_device_cannot_do(checkpoint, tmp_path):
    """Before it registers or takes a run: exit 2, the key in its log."""
    from dagster import DagsterInstance

    from orchestration.instance_yaml import write_dagster_yaml
    from orchestration.registry import WorkerRegistry
    from settings.server import ServerConfig

    inference = tmp_path / "inference.yaml"
    data = config(checkpoint, tmp_path / "cache", attention_backend="_native_cudnn").model_dump(mode="json")
    inference.write_text(yaml.safe_dump(data))
    cfg = ServerConfig.model_validate(
        {
            "state_dir": str(tmp_path / "state"),
            "inference": {"config": str(inference)},
            "workers": {"warm": False, "devices": [{"device": "cpu", "threads": 1}]},
        }
    ).resolved()
    write_dagster_yaml(cfg)
    env = {
        **os.environ,
        "DAGSTER_HOME": str(cfg.dagster_home),
        "SHOTLOOM_INFERENCE_CONFIG": str(inference),
    }
    with DagsterInstance.from_config(str(cfg.dagster_home)) as instance:
        instance.get_runs(limit=1)  # the schema, before the worker opens it
        args = [sys.executable, "-m", "orchestration.worker", "--device", "cpu", "--threads", "1"]
        args += ["--state-dir", str(cfg.state_dir), "--no-warm"]
        done = subprocess.run(args, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, done.stderr[-2000:]
        assert "performance.attention_backend" in done.stderr and "_native_cudnn" in done.stderr
        assert WorkerRegistry(instance.run_storage).records() == []  # never offered itself for runs
