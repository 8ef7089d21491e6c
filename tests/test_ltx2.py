"""LTX-2 adapter on a tiny random LTX2ConditionPipeline: stages, conditioning, audio, tiling, checkpoint."""

from __future__ import annotations

import filecmp
import wave
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from shotloom.bundle import TensorBundle
from shotloom.capabilities import CapabilityError
from shotloom.config import REPO_ROOT, InferenceConfig, Tiling, load_inference_config
from shotloom.families.ltx2 import MAX_REFERENCES, LTX2Adapter
from shotloom.request import GenerationRequest, MemorySlot
from shotloom.sampler import seed_everything

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: one thread is fastest

SIGMAS = [1.0, 0.75, 0.5, 0.25]
TILING = {"enabled": True, "tile_px": 32, "stride_px": 16, "tile_frames": 16, "stride_frames": 8}


def _config(checkpoint: Path, **overrides) -> InferenceConfig:
    data = {
        "family": "ltx2",
        "paths": {"checkpoint": str(checkpoint), "cache_dir": str(checkpoint.parent / "cache")},
        "sampler": {"sigmas": SIGMAS, "shift": 1.0},
        "defaults": {"width": 64, "height": 64, "num_frames": 17, "fps": 24},
        "tiling": TILING,
        **overrides,
    }
    return InferenceConfig.model_validate(data)


@pytest.fixture(scope="session")
def ltx2_checkpoint(tmp_path_factory) -> Path:
    return LTX2Adapter.build_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "ltx2-tiny", seed=0)


@pytest.fixture(scope="module")
def adapter(ltx2_checkpoint) -> LTX2Adapter:
    return LTX2Adapter.load(_config(ltx2_checkpoint))


@pytest.fixture(scope="module")
def media(tmp_path_factory) -> dict[str, Path]:
    """A first/last frame, a reference (other aspect ratio) and a 1.3 s mono 44.1 kHz tone."""
    root = tmp_path_factory.mktemp("media")
    y, x = np.mgrid[0:64, 0:64]
    Image.fromarray(np.stack([x * 4, y * 4, (x + y) * 2], -1).astype(np.uint8)).save(root / "frame.png")
    y, x = np.mgrid[0:80, 0:120]
    Image.fromarray(np.stack([255 - x * 2, y * 3, x + y], -1).astype(np.uint8)).save(root / "ref.png")
    rate = 44100
    tone = 0.3 * np.sin(2 * np.pi * 440 * np.arange(int(rate * 1.3)) / rate)
    with wave.open(str(root / "tone.wav"), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((tone * 32767).astype("<i2").tobytes())
    return {"frame": root / "frame.png", "ref": root / "ref.png", "tone": root / "tone.wav"}


def _req(**kw) -> GenerationRequest:
    base = dict(prompt="a red bird flies over the sea", width=64, height=64, num_frames=17, fps=24, seed=7)
    return GenerationRequest(**{**base, **kw})


def _generate(adapter: LTX2Adapter, req: GenerationRequest) -> tuple[TensorBundle, TensorBundle]:
    cond = adapter.encode(req)
    return cond, adapter.denoise(cond, req)


# -- generation -------------------------------------------------------------------------------------
def test_text_to_video_with_audio(adapter):
    req = _req()
    cond = adapter.encode(req)
    counts = adapter.encoder_counter.calls
    assert counts["text_encoder"] > 0 and counts["connectors"] > 0
    encoded = adapter.encoder_counter.total
    steps: list[tuple[int, int]] = []
    latents = adapter.denoise(cond, req, progress=lambda i, n: steps.append((i, n)))
    media = adapter.decode(latents, req)
    assert adapter.encoder_counter.total == encoded  # denoise and decode run no encoder
    assert steps == [(i, len(SIGMAS)) for i in range(1, len(SIGMAS) + 1)]
    assert latents.meta["sigmas"] == SIGMAS  # exactly the YAML's, despite LTX-2's shift_terminal config
    assert media.frames.shape == (17, 64, 64, 3) and media.frames.dtype == np.uint8
    assert media.sample_rate == 24000
    assert media.audio.dtype == np.float32 and media.audio.shape == (2, round(17 / 24 * 24000))
    assert np.abs(media.audio).max() <= 1.0 and np.abs(media.audio).max() > 0


def test_denoise_matches_the_pipelines_own_call(adapter):
    """Text only, the hand-written loop is bit-identical to LTX2ConditionPipeline.__call__."""
    req = _req()
    latents = adapter.denoise(adapter.encode(req), req)
    pipe = adapter.pipe
    embeds, mask, _, _ = pipe.encode_prompt(req.prompt, do_classifier_free_guidance=False, device="cpu")
    video, audio = pipe(
        prompt_embeds=embeds,
        prompt_attention_mask=mask,
        height=64,
        width=64,
        num_frames=17,
        frame_rate=24.0,
        sigmas=SIGMAS,
        num_inference_steps=len(SIGMAS),
        guidance_scale=1.0,
        stg_scale=0.0,
        modality_scale=1.0,
        guidance_rescale=0.0,
        audio_guidance_scale=1.0,
        audio_modality_scale=1.0,
        audio_guidance_rescale=0.0,
        generator=seed_everything(req.seed),
        output_type="latent",
        return_dict=False,
    )
    assert torch.equal(video, latents.tensors["video"]) and torch.equal(audio, latents.tensors["audio"])


def test_first_frame_tokens_stay_clean_at_every_step(adapter, media):
    req = _req(first_frame=media["frame"])
    cond = adapter.encode(req)
    pipe = adapter.pipe
    first = pipe._pack_latents(cond.tensors["image_latents.0"], 1, 1)  # (1, 64 tokens, C)
    seen: list[torch.Tensor] = []
    hook = pipe.transformer.register_forward_pre_hook(
        lambda _m, _a, kw: seen.append(kw["hidden_states"][:, : first.shape[1]].clone()), with_kwargs=True
    )
    try:
        latents = adapter.denoise(cond, req)
    finally:
        hook.remove()
    # DMD re-noises each token to sigma_next * (1 - strength): strength-1 tokens are never re-noised.
    assert len(seen) == len(SIGMAS) and all(torch.equal(s, first) for s in seen)
    assert torch.allclose(latents.tensors["video"][:, :, :1], cond.tensors["image_latents.0"], atol=1e-6)
    assert adapter.decode(latents, req).frames.shape == (17, 64, 64, 3)


def test_last_frame_and_reference_images(adapter, media):
    refs = (MemorySlot(media["ref"]), MemorySlot(media["frame"]))
    req = _req(first_frame=media["frame"], last_frame=media["ref"], memory=refs)
    before = adapter.encoder_counter.calls.get("vae_encode", 0)
    cond, latents = _generate(adapter, req)
    assert adapter.encoder_counter.calls["vae_encode"] - before == 4
    roles = [(c["role"], c["pixel_frame"], c["strength"]) for c in cond.meta["conditions"]]
    assert roles == [
        ("first_frame", 0, 1.0),
        ("last_frame", 16, 1.0),
        ("reference", 5, 0.5),
        ("reference", 11, 0.5),
    ]
    assert latents.tensors["video"].shape == (1, 8, 3, 8, 8)  # keyframe tokens are dropped after sampling
    _, plain = _generate(adapter, _req(first_frame=media["frame"]))
    assert not torch.equal(latents.tensors["video"], plain.tensors["video"])  # they steer the clip
    assert adapter.decode(latents, req).frames.shape == (17, 64, 64, 3)


def test_audio_in_is_held_as_the_soundtrack(adapter, media):
    req = _req(memory=(MemorySlot(media["frame"], audio=media["tone"]),))
    before = adapter.encoder_counter.calls.get("audio_vae_encode", 0)
    cond, latents = _generate(adapter, req)
    assert adapter.encoder_counter.calls["audio_vae_encode"] == before + 1
    assert cond.meta["audio_in"] and latents.meta["audio_held"]
    assert torch.allclose(latents.tensors["audio"], cond.tensors["audio_latents"], atol=1e-6)
    _, silent = _generate(adapter, _req(memory=(MemorySlot(media["frame"]),)))
    assert not torch.equal(latents.tensors["video"], silent.tensors["video"])  # the video attends to it
    decoded = adapter.decode(latents, req)
    assert decoded.audio.shape == (2, 17000) and decoded.sample_rate == 24000


def test_guidance_encodes_negatives(adapter):
    req = _req(guidance_scale=3.0, negative_prompt="blurry")
    cond, latents = _generate(adapter, req)
    assert {"negative_prompt_embeds", "negative_audio_prompt_embeds"} <= set(cond.tensors)
    assert latents.tensors["video"].shape == (1, 8, 3, 8, 8)
    unguided = adapter.encode(_req())
    assert "negative_prompt_embeds" not in unguided.tensors
    with pytest.raises(ValueError, match="guidance_scale"):
        adapter.denoise(unguided, req)


# -- stages -----------------------------------------------------------------------------------------
def test_determinism_and_seed(adapter, media, tmp_path):
    req = _req(first_frame=media["frame"])
    cond = adapter.encode(req)
    a = adapter.denoise(cond, req)
    cond.save(tmp_path / "cond.safetensors")  # the stages may run in other processes
    b = adapter.denoise(TensorBundle.load(tmp_path / "cond.safetensors"), req)
    c = adapter.denoise(cond, replace(req, seed=8))
    for key in ("video", "audio"):
        assert torch.equal(a.tensors[key], b.tensors[key])
        assert not torch.equal(a.tensors[key], c.tensors[key])


def test_cancel_from_progress_propagates(adapter):
    req = _req()
    cond = adapter.encode(req)
    calls: list[int] = []

    def progress(i: int, _n: int) -> None:
        calls.append(i)
        if i == 2:
            raise KeyboardInterrupt("cancelled")

    with pytest.raises(KeyboardInterrupt):
        adapter.denoise(cond, req, progress)
    assert calls == [1, 2]


def test_conditioning_must_match_the_request(adapter):
    cond = adapter.encode(_req())
    with pytest.raises(ValueError, match="^num_frames"):
        adapter.denoise(cond, _req(num_frames=25))


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"width": 48}, "width"),
        ({"num_frames": 16}, "num_frames"),
        ({"fps": 30}, "fps"),
        ({"guidance_scale": 20.0}, "guidance_scale"),
        ({"memory": "too_many"}, "memory"),
        ({"memory": "two_audio"}, "memory[1].audio"),
        ({"num_frames": 1, "last_frame": "frame"}, "last_frame"),
        ({"num_frames": 1, "memory": "one"}, "memory"),
    ],
)
def test_capability_errors_name_the_field(adapter, media, change, field):
    slots = {
        "too_many": tuple(MemorySlot(media["ref"]) for _ in range(MAX_REFERENCES + 1)),
        "two_audio": (MemorySlot(media["ref"], media["tone"]), MemorySlot(media["ref"], media["tone"])),
        "one": (MemorySlot(media["ref"]),),
    }
    change = dict(change)
    if "memory" in change:
        change["memory"] = slots[change["memory"]]
    if "last_frame" in change:
        change["last_frame"] = media["frame"]
    with pytest.raises(CapabilityError) as err:
        adapter.encode(_req(**change))
    assert err.value.field == field
    assert adapter.capabilities.audio_in and adapter.capabilities.audio_out


@pytest.mark.parametrize("field", ["memory[1].audio", "first_frame"])
def test_unreadable_input_names_the_field_before_any_encoder_runs(adapter, media, tmp_path, field):
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not an image")
    memory = (MemorySlot(media["ref"]), MemorySlot(media["ref"], audio=media["frame"]))  # a PNG has no audio
    req = _req(memory=memory) if field.startswith("memory") else _req(first_frame=broken)
    before = adapter.encoder_counter.total
    with pytest.raises(CapabilityError) as err:
        adapter.encode(req)
    assert err.value.field == field and adapter.encoder_counter.total == before


# -- tiling -----------------------------------------------------------------------------------------
def test_tiled_decode_tiles_space_and_time(adapter):
    req = _req()
    latents = adapter.denoise(adapter.encode(req), req)
    vae = adapter.pipe.vae
    calls = {"tiled_decode": 0, "_temporal_tiled_decode": 0}

    def counted(name: str):
        original = getattr(vae, name)

        def wrapper(*args, **kwargs):
            calls[name] += 1
            return original(*args, **kwargs)

        return wrapper

    for name in calls:
        setattr(vae, name, counted(name))
    try:
        tiled = adapter.decode(latents, req)
        assert calls["_temporal_tiled_decode"] == 1 and calls["tiled_decode"] > 1
        adapter.configure_tiling(Tiling(enabled=False))
        untiled = adapter.decode(latents, req)
        assert calls["_temporal_tiled_decode"] == 1  # not called again
    finally:
        for name in calls:
            vae.__dict__.pop(name)
        adapter.configure_tiling(Tiling(**TILING))
    assert tiled.frames.shape == untiled.frames.shape == (17, 64, 64, 3)
    assert tiled.audio.shape == untiled.audio.shape


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"tile_px": 36}, "tiling.tile_px"),
        ({"stride_px": 12}, "tiling.stride_px"),
        ({"tile_frames": 12}, "tiling.tile_frames"),
        ({"stride_frames": 4}, "tiling.stride_frames"),
    ],
)
def test_tiling_must_align_to_the_vae(adapter, values, field):
    try:
        with pytest.raises(ValueError, match=f"^{field}"):
            adapter.configure_tiling(Tiling(**{**TILING, **values}))
    finally:
        adapter.configure_tiling(Tiling(**TILING))


# -- checkpoint and config --------------------------------------------------------------------------
def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_tiny_checkpoint_is_deterministic_and_reloads(ltx2_checkpoint, tmp_path):
    from diffusers import DiffusionPipeline, LTX2ConditionPipeline

    cfg = _config(tmp_path / "ltx2-tiny", tiny={"build_if_missing": True, "seed": 0})
    LTX2Adapter.load(cfg)  # builds the missing checkpoint first
    files = _files(ltx2_checkpoint)
    assert files == _files(cfg.paths.checkpoint)
    _, mismatch, errors = filecmp.cmpfiles(ltx2_checkpoint, cfg.paths.checkpoint, files, shallow=False)
    assert not mismatch and not errors
    assert sum((ltx2_checkpoint / f).stat().st_size for f in files) < 4_000_000
    assert not list(tmp_path.glob(".ltx2-tiny*"))  # no temp dir left behind
    pipe = DiffusionPipeline.from_pretrained(str(ltx2_checkpoint), local_files_only=True)
    assert isinstance(pipe, LTX2ConditionPipeline)
    assert pipe.tokenizer.decode(pipe.tokenizer("Zoë 42").input_ids) == "Zoë 42"  # byte fallback


def test_sibling_pipeline_checkpoint_is_rewrapped(adapter, tmp_path):
    """A checkpoint saved as LTX2Pipeline (same components) loads as LTX2ConditionPipeline."""
    from diffusers import FlowMatchEulerDiscreteScheduler, LTX2ConditionPipeline, LTX2Pipeline

    components = {k: v for k, v in adapter.pipe.components.items() if v is not None}
    components["scheduler"] = FlowMatchEulerDiscreteScheduler.from_config(components["scheduler"].config)
    LTX2Pipeline(**components).save_pretrained(tmp_path / "t2v")
    sibling = LTX2Adapter.load(_config(tmp_path / "t2v"))
    assert isinstance(sibling.pipe, LTX2ConditionPipeline)
    req = _req()
    latents = sibling.denoise(sibling.encode(req), req)
    assert torch.equal(latents.tensors["video"], adapter.denoise(adapter.encode(req), req).tensors["video"])


def test_missing_checkpoint_without_build_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="paths.checkpoint"):
        LTX2Adapter.load(_config(tmp_path / "absent"))


def test_yaml_config():
    cfg = load_inference_config(REPO_ROOT / "configs" / "inference.ltx2-tiny.yaml")
    assert cfg.family == "ltx2" and cfg.paths.checkpoint == REPO_ROOT / "checkpoints" / "ltx2-tiny"
    assert cfg.tiny.build_if_missing and cfg.sampler.sigmas == SIGMAS and cfg.defaults.fps == 24
    assert (cfg.defaults.num_frames - 1) % 8 == 0 and cfg.audio.sample_rate == 24000
    # At the default size both tiled paths run: tiles smaller than the frame and the clip.
    assert cfg.tiling.tile_px < cfg.defaults.width and cfg.tiling.tile_frames < cfg.defaults.num_frames
