"""Inference YAML loading, env overrides, and the standalone inference.py CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from shotloom import media
from shotloom.config import load_inference_config

REPO = Path(__file__).resolve().parent.parent


def test_env_overrides_select_config_and_checkpoint(monkeypatch, wan_config, tmp_path):
    monkeypatch.setenv("SHOTLOOM_INFERENCE_CONFIG", str(wan_config))
    assert load_inference_config().source == wan_config.resolve()
    monkeypatch.setenv("SHOTLOOM_CHECKPOINT", str(tmp_path / "other"))
    assert load_inference_config().paths.checkpoint == tmp_path / "other"


def test_echo_aliases_are_accepted(monkeypatch, wan_config, tmp_path):
    monkeypatch.delenv("SHOTLOOM_INFERENCE_CONFIG", raising=False)
    monkeypatch.delenv("SHOTLOOM_CHECKPOINT", raising=False)
    monkeypatch.setenv("ECHO_INFERENCE_CONFIG", str(wan_config))
    monkeypatch.setenv("ECHO_CHECKPOINT", str(tmp_path / "echo"))
    cfg = load_inference_config()
    assert cfg.source == wan_config.resolve() and cfg.paths.checkpoint == tmp_path / "echo"


def test_relative_paths_resolve_against_repo_root():
    cfg = load_inference_config(REPO / "configs" / "inference.wan-tiny.yaml")
    assert cfg.paths.checkpoint == REPO / "checkpoints" / "wan-tiny"


def test_bad_yaml_values_are_refused(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("family: wan\npaths: {checkpoint: x}\nsampler: {sigmas: [0.5, 0.75]}\n")
    with pytest.raises(ValidationError, match="strictly descending"):
        load_inference_config(bad)
    bad.write_text("family: sora\npaths: {checkpoint: x}\n")
    with pytest.raises(ValidationError, match="family"):
        load_inference_config(bad)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "inference.py", *args], cwd=REPO, capture_output=True, text=True)


def test_cli_writes_the_mp4_the_yaml_asks_for(wan_config, tmp_path, image_file):
    out = tmp_path / "out.mp4"
    proc = run_cli(
        "--config",
        str(wan_config),
        "--prompt",
        "a red kite",
        "--seed",
        "5",
        "--first-frame",
        str(image_file),
        "--output",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    info = media.probe(out)
    assert (info.frames, info.width, info.height) == (17, 64, 64)
    assert summary["seed"] == 5 and summary["sha256"] == info.sha256 and summary["cache_hit"] is False


def test_cli_runs_video_to_video_from_a_source_clip(wan_config, tmp_path):
    source = tmp_path / "source.mp4"
    proc = run_cli(
        "--config", str(wan_config), "--prompt", "a red kite", "--seed", "1", "--output", str(source)
    )
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "remix.mp4"
    args = ["--config", str(wan_config), "--prompt", "a blue bird", "--seed", "2", "--output", str(out)]
    proc = run_cli(*args, "--source-video", str(source), "--strength", "0.5")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["strength"] == 0.5 and media.probe(out).frames == 17
    proc = run_cli(*args, "--strength", "0.5")  # a strength with nothing to apply it to
    assert proc.returncode == 2 and "strength" in proc.stderr


def test_cli_capability_error_names_the_field(wan_config, tmp_path):
    proc = run_cli(
        "--config",
        str(wan_config),
        "--prompt",
        "x",
        "--num-frames",
        "18",
        "--output",
        str(tmp_path / "o.mp4"),
    )
    assert proc.returncode == 2
    assert "num_frames" in proc.stderr and not (tmp_path / "o.mp4").exists()


def test_model_configs_for_real_checkpoints_validate():
    """configs/models/: a ready inference YAML per family, base and distilled, with its authors' sampler."""
    configs = {p.stem: load_inference_config(p) for p in sorted((REPO / "configs" / "models").glob("*.yaml"))}
    modes = {name: cfg.sampler.mode for name, cfg in configs.items()}
    for family in ("wan", "ltx2"):
        mine = [name for name, cfg in configs.items() if cfg.family == family]
        # a base checkpoint (native, tens of steps, CFG) and a distilled one (dmd, or a distill adapter)
        assert any(modes[n] == "native" and configs[n].sampler.steps >= 20 for n in mine), mine
        assert any(
            modes[n] == "dmd" or any(a.sampler and a.sampler.mode == "dmd" for a in configs[n].adapters)
            for n in mine
        ), mine
    for cfg in configs.values():
        assert not cfg.tiny.build_if_missing and cfg.device == "cuda"
        if cfg.sampler.mode == "native":
            assert cfg.sampler.guidance_scale > 1.0  # base checkpoints are sampled with CFG
    # LTX-2's base checkpoint with its pipeline's own guidance terms (__call__'s defaults).
    import inspect

    from diffusers import LTX2ConditionPipeline

    own = inspect.signature(LTX2ConditionPipeline.__call__).parameters
    sampler = configs["ltx2-dev"].sampler
    for term in ("guidance_scale", "audio_guidance_scale", "stg_scale", "modality_scale", "guidance_rescale"):
        assert getattr(sampler, term) == own[term].default, term
    assert sampler.spatio_temporal_guidance_blocks  # the block STG perturbs is the checkpoint's
