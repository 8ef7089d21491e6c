"""Shared fixtures: tiny checkpoints built once per session, temp configs and media roots."""

from __future__ import annotations

import os
from pathlib import Path

# Tiny models are many small kernels: one thread each is much faster than two fighting
# over 2 cores (also inherited by the subprocesses tests start).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import pytest
import yaml
from PIL import Image


def write_inference_yaml(path: Path, family: str, checkpoint: Path, cache_dir: Path, **overrides) -> Path:
    data = {
        "family": family,
        "paths": {"checkpoint": str(checkpoint), "cache_dir": str(cache_dir)},
        "dtype": "float32",
        "sampler": {"sigmas": [1.0, 0.75, 0.5, 0.25], "shift": 1.0},
        "tiling": {"enabled": True, "tile_px": 32, "stride_px": 16, "tile_frames": 16, "stride_frames": 8},
    }
    if family == "wan":
        data["defaults"] = {"width": 64, "height": 64, "num_frames": 17, "fps": 16}
    for key, value in overrides.items():
        data[key] = value
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="session")
def wan_checkpoint(tmp_path_factory) -> Path:
    from shotloom.families.wan import WanAdapter

    return WanAdapter.build_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "wan-tiny", seed=0)


@pytest.fixture
def wan_config(tmp_path, wan_checkpoint) -> Path:
    return write_inference_yaml(tmp_path / "inference.yaml", "wan", wan_checkpoint, tmp_path / "cache")


@pytest.fixture
def image_file(tmp_path) -> Path:
    """A 64x64 PNG with a gradient (a first frame / reference image)."""
    y, x = np.mgrid[0:64, 0:64]
    pixels = np.stack([x * 4, y * 4, (x + y) * 2], axis=-1).astype(np.uint8)
    path = tmp_path / "frame.png"
    Image.fromarray(pixels).save(path)
    return path
