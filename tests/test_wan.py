"""Wan adapter on tiny random checkpoints: stages, capabilities, determinism, tiling, builder."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from shotloom.bundle import TensorBundle
from shotloom.capabilities import CapabilityError
from shotloom.config import REPO_ROOT, InferenceConfig, Tiling, load_inference_config
from shotloom.families.wan import I2V, T2V, WanAdapter, _load_rgb
from shotloom.request import GenerationRequest, MemorySlot
from shotloom.sampler import seed_everything

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: one thread is fastest

SIGMAS = [1.0, 0.75, 0.5, 0.25]


def make_config(checkpoint: Path, **overrides) -> InferenceConfig:
    data = {
        "family": "wan",
        "paths": {"checkpoint": checkpoint},
        "sampler": {"sigmas": SIGMAS, "shift": 1.0},
        "defaults": {"width": 64, "height": 64, "num_frames": 17, "fps": 16},
        "tiling": {"enabled": True, "tile_px": 32, "stride_px": 16},
        **overrides,
    }
    return InferenceConfig.model_validate(data)


def request(**changes) -> GenerationRequest:
    base = GenerationRequest(
        prompt="a red kite over the sea", width=64, height=64, num_frames=17, fps=16, seed=7
    )
    return replace(base, **changes)


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def wan(wan_checkpoint) -> WanAdapter:
    return WanAdapter.load(make_config(wan_checkpoint))


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> list[Path]:
    """Three distinct images; the second is not 64x64, to exercise resizing."""
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    paths = []
    for i, size in enumerate([(64, 64), (96, 48), (40, 80)]):
        path = root / f"img{i}.png"
        Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(path)
        paths.append(path)
    return paths


def generate(adapter: WanAdapter, req: GenerationRequest, progress=None):
    cond = adapter.encode(req)
    latents = adapter.denoise(cond, req, progress)
    return cond, latents, adapter.decode(latents, req)


def assert_video(decoded, req: GenerationRequest) -> None:
    assert decoded.frames.shape == (req.num_frames, req.height, req.width, 3)
    assert decoded.frames.dtype == np.uint8
    assert decoded.audio is None


# -- builder / loading ---------------------------------------------------------------------------
def test_builder_is_deterministic_small_and_reloads(wan_checkpoint, tmp_path):
    again = WanAdapter.build_tiny_checkpoint(tmp_path / "again", seed=0)
    other = WanAdapter.build_tiny_checkpoint(tmp_path / "other", seed=1)
    assert files(again) == files(wan_checkpoint)  # byte-identical for the same seed
    assert (
        files(other)["transformer/diffusion_pytorch_model.safetensors"]
        != files(again)["transformer/diffusion_pytorch_model.safetensors"]
    )
    assert sum(len(b) for b in files(again).values()) < 2_000_000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again", "other"]  # no temp dirs left behind

    from diffusers import DiffusionPipeline, WanVACEPipeline

    pipe = DiffusionPipeline.from_pretrained(str(again), local_files_only=True)
    assert isinstance(pipe, WanVACEPipeline)
    assert pipe.tokenizer("a cat").input_ids[-1] == pipe.tokenizer.eos_token_id


def test_load_builds_missing_checkpoint_and_refuses_without_flag(tmp_path):
    missing = tmp_path / "ckpt"
    with pytest.raises(FileNotFoundError, match="paths.checkpoint"):
        WanAdapter.load(make_config(missing))
    adapter = WanAdapter.load(make_config(missing, tiny={"build_if_missing": True, "seed": 0}))
    assert (missing / "model_index.json").is_file()
    assert adapter.kind == "WanVACEPipeline"
    assert type(adapter.pipe.scheduler).__name__ == "DMDScheduler"


def test_shipped_tiny_config(monkeypatch):
    for name in ("SHOTLOOM_CHECKPOINT", "ECHO_CHECKPOINT"):
        monkeypatch.delenv(name, raising=False)
    cfg = load_inference_config(REPO_ROOT / "configs" / "inference.wan-tiny.yaml")
    assert cfg.family == "wan" and cfg.paths.checkpoint == REPO_ROOT / "checkpoints" / "wan-tiny"
    assert cfg.tiny.build_if_missing and cfg.dtype == "float32"
    # Sampled as a published Wan folder is (its scheduler, tens of steps in real use, CFG); the
    # distill adapter carries the few-step schedule.
    assert (cfg.sampler.mode, cfg.sampler.steps, cfg.sampler.guidance_scale) == ("native", 8, 5.0)
    draft = cfg.sampler_for("wan-tiny-distill")
    assert (draft.mode, draft.sigmas, draft.fixed_steps) == ("dmd", SIGMAS, 4)
    assert (cfg.defaults.width, cfg.defaults.height, cfg.defaults.num_frames, cfg.defaults.fps) == (
        64,
        64,
        17,
        16,
    )
    assert cfg.tiling.enabled and cfg.tiling.tile_px % 8 == 0 and cfg.tiling.stride_px % 8 == 0


def test_tiling_must_align_to_vae_ratio(wan_checkpoint):
    with pytest.raises(ValueError, match="tiling.tile_px"):
        WanAdapter.load(make_config(wan_checkpoint, tiling={"tile_px": 36, "stride_px": 16}))
    with pytest.raises(ValueError, match="tiling.stride_px"):
        WanAdapter.load(make_config(wan_checkpoint, tiling={"tile_px": 32, "stride_px": 12}))


# -- generation ----------------------------------------------------------------------------------
def test_text_to_video(wan):
    req = request()
    steps: list[tuple[int, int]] = []
    wan.encoder_counter.calls.clear()
    cond = wan.encode(req)
    assert wan.encoder_counter.calls["text_encoder"] >= 1
    assert wan.encoder_counter.calls["vae_encode"] >= 1
    assert set(cond.tensors) == {"prompt_embeds", "vace_video_latents", "vace_mask"}
    encoded = dict(wan.encoder_counter.calls)
    latents = wan.denoise(cond, req, lambda done, total: steps.append((done, total)))
    assert wan.encoder_counter.calls == encoded  # denoise runs no encoder
    assert steps == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert latents.meta["shape"] == [1, 16, 5, 8, 8]
    assert_video(wan.decode(latents, req), req)


def test_guidance_encodes_negative_prompt(wan):
    req = request(guidance_scale=3.0, negative_prompt="blurry")
    cond = wan.encode(req)
    assert "negative_prompt_embeds" in cond.tensors
    assert wan.denoise(cond, req).tensors["video"].shape == (1, 16, 5, 8, 8)
    with pytest.raises(ValueError, match="negative_prompt_embeds"):
        wan.denoise(wan.encode(request()), req)


def test_first_frame(wan, images):
    req = request(first_frame=images[0])
    cond, _, decoded = generate(wan, req)
    plain = wan.encode(request())
    assert not torch.equal(cond.tensors["vace_video_latents"], plain.tensors["vace_video_latents"])
    assert_video(decoded, req)


def test_first_and_last_frame(wan, images):
    req = request(first_frame=images[0], last_frame=images[1])
    cond, _, decoded = generate(wan, req)
    only_first = wan.encode(request(first_frame=images[0]))
    last = cond.tensors["vace_video_latents"][:, :, -1]
    assert not torch.equal(last, only_first.tensors["vace_video_latents"][:, :, -1])
    assert_video(decoded, req)


def test_reference_images(wan, images):
    req = request(memory=(MemorySlot(images[1]), MemorySlot(images[2])))
    cond, latents, decoded = generate(wan, req)
    assert cond.meta["num_reference_images"] == 2
    assert cond.tensors["vace_video_latents"].shape[2] == 5 + 2  # one latent frame per reference, prepended
    assert cond.tensors["vace_mask"].shape[2] == 5 + 2
    assert latents.tensors["video"].shape[2] == 5  # reference frames dropped from the output
    assert_video(decoded, req)


def test_split_stages_match_the_pipelines_own_call(wan, images):
    """encode + denoise (injected conditioning) == WanVACEPipeline.__call__ with the raw inputs."""
    refs = (MemorySlot(images[1]), MemorySlot(images[2]))
    req = request(first_frame=images[0], last_frame=images[1], memory=refs, guidance_scale=2.0)
    ours = wan.denoise(wan.encode(req), req).tensors["video"]
    video, mask = wan._vace_video(req)
    native = wan.pipe(
        prompt=req.prompt,
        negative_prompt="",
        video=video,
        mask=mask,
        reference_images=[Image.open(slot.image).convert("RGB") for slot in refs],
        height=64,
        width=64,
        num_frames=17,
        num_inference_steps=len(SIGMAS),
        guidance_scale=2.0,
        generator=seed_everything(req.seed),
        output_type="latent",
        max_sequence_length=512,
    ).frames[:, :, len(refs) :]
    assert torch.equal(ours, native)


# -- capabilities --------------------------------------------------------------------------------
def test_capabilities(wan):
    caps = wan.capabilities
    assert (caps.first_frame, caps.last_frame, caps.audio_in, caps.audio_out) == (True, True, False, False)
    assert (caps.frame_multiple, caps.size_multiple, caps.fps) == (4, 16, (16,))
    assert caps.guidance_range == (1.0, 10.0)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"width": 65}, "width"),
        ({"height": 40}, "height"),
        ({"num_frames": 18}, "num_frames"),
        ({"fps": 24}, "fps"),
        ({"guidance_scale": 11.0}, "guidance_scale"),
        ({"prompt": " "}, "prompt"),
    ],
)
def test_capability_errors(wan, changes, field):
    with pytest.raises(CapabilityError) as err:
        wan.check(request(**changes))
    assert err.value.field == field


def test_memory_errors(wan, images, tmp_path):
    audio = tmp_path / "voice.wav"
    audio.write_bytes(b"RIFF")
    wan.encoder_counter.calls.clear()
    with pytest.raises(CapabilityError) as err:
        wan.encode(request(memory=(MemorySlot(images[0], audio),)))
    assert err.value.field == "memory[0].audio"
    assert wan.encoder_counter.total == 0  # refused before any encoder ran
    # 5 frames = 2 latent frames -> at most 2 references
    with pytest.raises(CapabilityError) as err:
        wan.check(request(num_frames=5, memory=tuple(MemorySlot(images[0]) for _ in range(3))))
    assert err.value.field == "memory"
    wan.check(request(num_frames=5, memory=tuple(MemorySlot(images[0]) for _ in range(2))))
    # fixed maximum of 7, even where the frame count would allow more
    with pytest.raises(CapabilityError) as err:
        wan.check(request(num_frames=33, memory=tuple(MemorySlot(images[0]) for _ in range(8))))
    assert err.value.field == "memory"


# -- determinism, cancel -------------------------------------------------------------------------
def test_same_seed_is_bit_identical_and_survives_a_disk_round_trip(wan, tmp_path):
    req = request(seed=3)
    cond = wan.encode(req)
    first = wan.denoise(cond, req).tensors["video"]
    reloaded = TensorBundle.load(cond.save(tmp_path / "cond.safetensors"))
    assert torch.equal(first, wan.denoise(reloaded, req).tensors["video"])
    assert not torch.equal(first, wan.denoise(cond, replace(req, seed=4)).tensors["video"])


def test_progress_exception_cancels_and_restores_the_pipeline(wan):
    req = request()
    cond = wan.encode(req)

    def cancel(done: int, total: int) -> None:
        raise KeyboardInterrupt("cancelled")

    with pytest.raises(KeyboardInterrupt):
        wan.denoise(cond, req, cancel)
    assert not {"prepare_video_latents", "prepare_masks", "preprocess_conditions"} & set(vars(wan.pipe))


# -- tiled decode --------------------------------------------------------------------------------
def test_tiled_decode_runs_and_matches_untiled_shape(wan, monkeypatch):
    req = request()
    latents = wan.denoise(wan.encode(req), req)
    vae = wan.pipe.vae
    calls = []
    tiled_decode = vae.tiled_decode
    monkeypatch.setattr(vae, "tiled_decode", lambda *a, **k: calls.append(1) or tiled_decode(*a, **k))
    tiled = wan.decode(latents, req)
    assert calls, "tiling enabled but the tiled path did not run"
    try:
        wan.configure_tiling(Tiling(enabled=False))
        calls.clear()
        untiled = wan.decode(latents, req)
        assert not calls
    finally:
        wan.configure_tiling(wan.cfg.tiling)
    assert tiled.frames.shape == untiled.frames.shape == (17, 64, 64, 3)


# -- other Wan pipelines: capability-correct and runnable ---------------------------------------
@pytest.fixture(scope="module")
def i2v(tmp_path_factory) -> WanAdapter:
    ckpt = WanAdapter.build_tiny_checkpoint(tmp_path_factory.mktemp("i2v") / "wan-i2v", pipeline=I2V)
    return WanAdapter.load(make_config(ckpt))


def test_image_to_video(i2v, images):
    caps = i2v.capabilities
    assert (caps.first_frame, caps.last_frame, caps.max_reference_images) == (True, True, 0)
    for changes, field in [
        ({}, "first_frame"),
        ({"first_frame": images[0], "memory": (MemorySlot(images[0]),)}, "memory"),
    ]:
        with pytest.raises(CapabilityError) as err:
            i2v.check(request(**changes))
        assert err.value.field == field
    req = request(first_frame=images[0], last_frame=images[1], guidance_scale=2.0)
    cond, latents, decoded = generate(i2v, req)
    assert "i2v_condition" in cond.tensors
    assert_video(decoded, req)
    image, last = _load_rgb(images[0], 64, 64), _load_rgb(images[1], 64, 64)
    native = i2v.pipe(
        prompt=req.prompt,
        negative_prompt="",
        image=image,
        last_image=last,
        height=64,
        width=64,
        num_frames=17,
        num_inference_steps=len(SIGMAS),
        guidance_scale=2.0,
        generator=seed_everything(req.seed),
        output_type="latent",
        max_sequence_length=512,
    ).frames
    assert torch.equal(latents.tensors["video"], native)


def test_text_only_pipeline(tmp_path):
    ckpt = WanAdapter.build_tiny_checkpoint(tmp_path / "wan-t2v", pipeline=T2V)
    t2v = WanAdapter.load(make_config(ckpt))
    caps = t2v.capabilities
    assert (caps.first_frame, caps.last_frame, caps.max_reference_images) == (False, False, 0)
    with pytest.raises(CapabilityError) as err:
        t2v.check(request(last_frame=ckpt / "model_index.json"))
    assert err.value.field == "last_frame"
    req = request()
    cond, _, decoded = generate(t2v, req)
    assert set(cond.tensors) == {"prompt_embeds"}
    assert_video(decoded, req)
