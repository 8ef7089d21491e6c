"""Video-to-video in the engine, both families, on tiny random checkpoints.

The source's latents, re-noised to the sampler's first sigma at or below ``strength``, are where
denoising starts. Metric (stated): the mean absolute difference between a result's latents and the
source's own latents, both normalised as the DiT sees them. Latents, not pixels: a randomly
initialised VAE does not reconstruct what it encodes, so pixels of a tiny model say nothing about
what the DiT kept of the source.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from test_ltx2 import _config as ltx2_config
from test_wan import make_config as wan_config

from shotloom.capabilities import CapabilityError
from shotloom.families.ltx2 import LTX2Adapter
from shotloom.families.wan import WanAdapter, _latent_stats
from shotloom.media import write_mp4
from shotloom.request import GenerationRequest

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: one thread is fastest


def moving_square(path: Path, fps: int, frames: int = 17, with_audio: bool = False) -> Path:
    """A colour gradient with a yellow square crossing it (and a tone, if asked)."""
    yy, xx = np.mgrid[0:64, 0:64]
    video = np.zeros((frames, 64, 64, 3), np.uint8)
    video[..., 0], video[..., 2] = (xx * 4).clip(0, 255), (yy * 4).clip(0, 255)
    for i in range(frames):
        video[i, 20:40, 5 + 2 * i : 25 + 2 * i] = (255, 255, 0)
    audio, rate = None, None
    if with_audio:
        rate = 24000
        t = np.arange(int(rate * frames / fps)) / rate
        audio = np.stack([np.sin(2 * np.pi * 440 * t)] * 2).astype(np.float32) * 0.3
    write_mp4(path, video, fps, audio, rate)
    return path


@pytest.fixture(scope="module", params=["wan", "ltx2"])
def family(request, tmp_path_factory, wan_checkpoint):
    root = tmp_path_factory.mktemp(request.param)
    if request.param == "wan":
        adapter = WanAdapter.load(wan_config(wan_checkpoint))
        return adapter, moving_square(root / "source.mp4", 16), 16
    checkpoint = LTX2Adapter.build_tiny_checkpoint(root / "ltx2-tiny", seed=0)
    return (
        LTX2Adapter.load(ltx2_config(checkpoint)),
        moving_square(root / "source.mp4", 24, with_audio=True),
        24,
    )


def normalised_latents(adapter, req: GenerationRequest) -> tuple[torch.Tensor, torch.Tensor]:
    """(the result's latents, the source's latents), both as the DiT sees them."""
    cond = adapter.encode(req)
    z = adapter.denoise(cond, req).tensors["video"]
    pipe = adapter.pipe
    if adapter.family == "wan":
        mean, std = _latent_stats(pipe.vae, z.device, z.dtype)
        z = (z - mean) / std
    else:
        vae = pipe.vae
        z = pipe._normalize_latents(z, vae.latents_mean, vae.latents_std, vae.config.scaling_factor)
    return z, cond.tensors.get("source_latents")


def test_the_source_shapes_the_result_and_the_strength_says_how_much(family):
    adapter, source, fps = family
    text = GenerationRequest(
        prompt="a red kite over the sea", width=64, height=64, num_frames=17, fps=fps, seed=5
    )
    low, src = normalised_latents(adapter, replace(text, source_video=source, strength=0.3))
    high, _ = normalised_latents(adapter, replace(text, source_video=source, strength=0.5))
    alone, _ = normalised_latents(adapter, text)
    distance = {
        name: float((z - src).abs().mean()) for name, z in (("low", low), ("high", high), ("text", alone))
    }
    # Closer to the source than the text-only generation with the same seed, and more so at a
    # lower strength.
    assert distance["low"] < 0.7 * distance["text"], distance
    assert distance["low"] < distance["high"] < distance["text"], distance


def test_same_seed_same_output_and_strength_one_ignores_the_source(family):
    adapter, source, fps = family
    req = GenerationRequest(
        prompt="a blue bird",
        width=64,
        height=64,
        num_frames=17,
        fps=fps,
        seed=9,
        source_video=source,
        strength=0.5,
    )
    first = adapter.denoise(adapter.encode(req), req)
    again = adapter.denoise(adapter.encode(req), req)
    assert torch.equal(first.tensors["video"], again.tensors["video"])
    assert first.meta["strength"] == 0.5 and first.meta["sigmas"] == [0.5, 0.25]
    full = replace(req, strength=1.0)
    text = replace(req, source_video=None, strength=None)
    assert torch.equal(
        adapter.denoise(adapter.encode(full), full).tensors["video"],
        adapter.denoise(adapter.encode(text), text).tensors["video"],
    )


def test_refusals_name_the_field(family, tmp_path):
    adapter, source, fps = family
    base = GenerationRequest(prompt="x", width=64, height=64, num_frames=17, fps=fps, seed=1)
    for req, field in (
        (replace(base, strength=0.5), "strength"),  # nothing to apply it to
        (replace(base, source_video=source, strength=1.5), "strength"),
    ):
        with pytest.raises(CapabilityError) as info:
            adapter.check(req)
        assert info.value.field == field
    broken = tmp_path / "broken.mp4"
    broken.write_bytes(b"not a video at all")
    with pytest.raises(CapabilityError) as info:
        adapter.encode(replace(base, source_video=broken, strength=0.5))
    assert info.value.field == "source_video"


def test_the_yaml_default_strength_applies_when_a_request_gives_none(wan_checkpoint, tmp_path):
    from shotloom.runtime import ModelRuntime

    source = moving_square(tmp_path / "source.mp4", 16)
    paths = {"checkpoint": wan_checkpoint, "cache_dir": tmp_path / "cache"}
    runtime = ModelRuntime(wan_config(wan_checkpoint, paths=paths, defaults={"strength": 0.3}))
    asked = dict(prompt="a blue bird", width=64, height=64, num_frames=17, fps=16, seed=9)
    implicit = runtime.resolve(**asked, source_video=source)
    assert implicit.strength == 0.3  # the YAML's defaults.strength, not the schema's 0.6
    assert runtime.resolve(**asked, source_video=source, strength=0.8).strength == 0.8  # the request wins
    assert runtime.resolve(**asked).strength is None  # no source: nothing to apply it to
    # The generation denoises from the sampler's first sigma at or below 0.3, as if it were asked.
    adapter = runtime.adapter
    out = adapter.denoise(adapter.encode(implicit), implicit)
    assert out.meta["strength"] == 0.3 and out.meta["sigmas"] == [0.25]
    explicit = GenerationRequest(**asked, source_video=source, strength=0.3)
    asked_for = adapter.denoise(adapter.encode(explicit), explicit)
    assert torch.equal(out.tensors["video"], asked_for.tensors["video"])
