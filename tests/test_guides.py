"""Frame-anchored guides in the engine, both families, on tiny random checkpoints.

What is measured, stated: a randomly initialised model does not draw what it is shown, so pixels
of a tiny model say nothing about a guide (nor do its latents say "closer to the guide"). What the
tests prove is where each family puts a guide and that it acts there:

* Wan VACE: the guide's frames sit in the masked VACE video at their frames (mask 0 there), and
  the generated latents change most at the latent frame that holds the guide's frame;
* LTX-2: a guide at frame 0 replaces the first latent frame (the clip's latents there are the
  guide's own); elsewhere its tokens are appended as a keyframe whose RoPE time is the guide's
  frame, held clean at every step; a sound is held clean from its frame on, the audio before it
  generated.
"""

from __future__ import annotations

import wave
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from test_ltx2 import _config as ltx2_config
from test_wan import make_config as wan_config

from shotloom.cache import conditioning_key
from shotloom.capabilities import CapabilityError
from shotloom.families.base import fit_image
from shotloom.families.ltx2 import LTX2Adapter
from shotloom.families.wan import T2V, WanAdapter
from shotloom.guides import anchor, measured
from shotloom.media import write_mp4
from shotloom.request import GenerationRequest, Guide, MemorySlot

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: one thread is fastest


def tone(path: Path, seconds: float, rate: int = 44100) -> Path:
    samples = 0.3 * np.sin(2 * np.pi * 440 * np.arange(int(rate * seconds)) / rate)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((samples * 32767).astype("<i2").tobytes())
    return path


def clip(path: Path, frames: int, fps: int, with_audio: bool) -> Path:
    """A short video of distinct solid colours (a 440 Hz tone under it when asked)."""
    video = np.zeros((frames, 64, 64, 3), np.uint8)
    for i in range(frames):
        video[i] = ((37 * i) % 256, 255 - (23 * i) % 256, 128)
    audio = None
    if with_audio:
        t = np.arange(int(24000 * frames / fps)) / 24000
        audio = np.stack([np.sin(2 * np.pi * 440 * t)] * 2).astype(np.float32) * 0.3
    write_mp4(path, video, fps, audio, 24000 if with_audio else None, silent_track=False)
    return path


@pytest.fixture(scope="module")
def media(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("guides")
    y, x = np.mgrid[0:64, 0:64]
    Image.fromarray(np.stack([x * 4, 255 - y * 4, np.full_like(x, 200)], -1).astype(np.uint8)).save(
        root / "guide.png"
    )
    return {
        "image": root / "guide.png",
        "tone": tone(root / "steps.wav", 1.3),
        "wan_clip": clip(root / "wan.mp4", 4, 16, with_audio=False),
        "ltx_clip": clip(root / "ltx.mp4", 9, 24, with_audio=True),
        "ltx_silent": clip(root / "ltx-silent.mp4", 9, 24, with_audio=False),
    }


# -- the request, measuring, the cache key --------------------------------------------------------
def test_frames_from_the_end_and_outside_the_clip():
    assert anchor(0, 17, "f") == 0 and anchor(16, 17, "f") == 16
    assert anchor(-1, 17, "f") == 16 and anchor(-9, 17, "f") == 8 and anchor(-17, 17, "f") == 0
    for frame in (17, -18):
        with pytest.raises(CapabilityError) as err:
            anchor(frame, 17, "guides[2].frame")
        assert err.value.field == "guides[2].frame"


def test_measuring_and_the_json_round_trip(media):
    req = GenerationRequest(prompt="p", width=64, height=64, num_frames=17, fps=24, seed=1)
    req = replace(
        req,
        guides=(
            Guide(media["image"], 3, with_audio=True),
            Guide(media["ltx_clip"], 8, with_audio=True),
            Guide(media["ltx_silent"], 0, with_audio=True),
            Guide(media["tone"], 5, "audio"),
        ),
    )
    image, video, silent, sound = measured(req).guides
    assert (image.frames, image.with_audio) == (1, False)  # an image has one frame and no sound
    assert (video.frames, video.with_audio) == (9, True)
    assert (silent.frames, silent.with_audio) == (9, False)  # no sound to take
    assert (sound.frames, sound.kind) == (None, "audio")
    again = GenerationRequest.from_json(measured(req).to_json())
    assert again == measured(req)
    with pytest.raises(CapabilityError) as err:
        measured(replace(req, guides=(Guide(Path(__file__), 0),)))  # no image, no video
    assert err.value.field == "guides[0]"


def test_the_conditioning_key_covers_each_guide(media, tmp_path):
    req = GenerationRequest(prompt="p", width=64, height=64, num_frames=17, fps=16, seed=1)
    other = tmp_path / "other.png"
    Image.new("RGB", (64, 64), (1, 2, 3)).save(other)
    keys = [
        conditioning_key("wan:x", r)
        for r in (
            req,
            replace(req, guides=(Guide(media["image"], 8),)),
            replace(req, guides=(Guide(media["image"], 9),)),  # another frame
            replace(req, guides=(Guide(other, 8),)),  # other bytes
            replace(req, guides=(Guide(media["ltx_clip"], 8),)),
            replace(req, guides=(Guide(media["ltx_clip"], 8, with_audio=True),)),  # its sound too
            replace(req, guides=(Guide(media["tone"], 8, "audio"),)),
        )
    ]
    assert len(set(keys)) == len(keys)
    assert conditioning_key("wan:x", replace(req, guides=(Guide(media["image"], 8, frames=1),))) == keys[1]


# -- Wan VACE -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def wan(wan_checkpoint) -> WanAdapter:
    return WanAdapter.load(wan_config(wan_checkpoint))


def wan_request(**changes) -> GenerationRequest:
    base = GenerationRequest(
        prompt="a red kite over the sea", width=64, height=64, num_frames=17, fps=16, seed=7
    )
    return measured(replace(base, **changes))


def wan_latents(wan: WanAdapter, req: GenerationRequest) -> torch.Tensor:
    return wan.denoise(wan.encode(req), req).tensors["video"]


def test_wan_guide_image_is_kept_at_its_frame_and_shapes_the_clip_there(wan, media):
    req = wan_request(guides=(Guide(media["image"], 8),))
    video, mask = wan._vace_video(req)
    kept = [i for i in range(17) if not mask[0, i].any()]
    assert kept == [8]  # the one frame given: kept (mask 0), the others generated
    expected = np.asarray(fit_image(Image.open(media["image"]), 64, 64), np.float32) / 255.0
    assert np.array_equal(video[0, 8], expected)

    guided, plain = wan_latents(wan, req), wan_latents(wan, wan_request())
    change = (guided - plain).abs().mean(dim=(0, 1, 3, 4))  # per latent frame
    # Wan's VAE: latent frame 0 is pixel frame 0, then 4 pixel frames each: frame 8 is in latent 2.
    others = [float(c) for i, c in enumerate(change) if i != 2]
    assert int(change.argmax()) == 2 and float(change[2]) > 5 * max(others), change
    # From the end: -9 of 17 frames is frame 8, the same clip; the same seed gives the same clip.
    from_end = wan_request(guides=(Guide(media["image"], anchor(-9, 17, "f")),))
    assert torch.equal(wan_latents(wan, from_end), guided)
    assert not torch.equal(wan_latents(wan, replace(req, seed=8)), guided)


def test_wan_guide_video_fills_its_frames_and_must_fit(wan, media):
    req = wan_request(guides=(Guide(media["wan_clip"], 5),))
    assert req.guides[0].frames == 4
    _, mask = wan._vace_video(req)
    assert [i for i in range(17) if not mask[0, i].any()] == [5, 6, 7, 8]
    assert wan_latents(wan, req).shape == (1, 16, 5, 8, 8)
    with pytest.raises(CapabilityError) as err:  # 4 frames from frame 14 of 17: no room
        wan.check(wan_request(guides=(Guide(media["wan_clip"], 14),)))
    assert err.value.field == "guides[0]"
    # Not measured (a caller of the engine that did not measure): the read refuses it, before
    # any encoder has run.
    before = wan.encoder_counter.total
    unmeasured = replace(wan_request(), guides=(Guide(media["wan_clip"], 14),))
    with pytest.raises(CapabilityError) as err:
        wan.encode(unmeasured)
    assert err.value.field == "guides[0]" and wan.encoder_counter.total == before


@pytest.mark.parametrize(
    ("guides", "changes", "field"),
    [
        (lambda m: (Guide(m["tone"], 4, "audio"),), {}, "guides[0].kind"),  # Wan takes no sound
        (lambda m: (Guide(m["image"], 16),), {"last_frame": True}, "guides[0].frame"),  # that frame is taken
        (lambda m: (Guide(m["image"], 3), Guide(m["wan_clip"], 1)), {}, "guides[1].frame"),  # overlap
        (lambda m: tuple(Guide(m["image"], i) for i in range(17)), {}, "guides"),  # more than 16
    ],
)
def test_wan_refusals_name_the_guide(wan, media, guides, changes, field):
    if changes.get("last_frame"):
        changes = {"last_frame": media["image"]}
    with pytest.raises(CapabilityError) as err:
        wan.check(wan_request(guides=guides(media), **changes))
    assert err.value.field == field


def test_wan_checkpoints_without_vace_take_no_guides(tmp_path, media):
    t2v = WanAdapter.load(wan_config(WanAdapter.build_tiny_checkpoint(tmp_path / "t2v", pipeline=T2V)))
    assert not t2v.capabilities.frame_guides and not t2v.capabilities.audio_guides
    with pytest.raises(CapabilityError) as err:
        t2v.check(wan_request(guides=(Guide(media["image"], 4),)))
    assert err.value.field == "guides[0]"


# -- LTX-2 ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ltx2(tmp_path_factory) -> LTX2Adapter:
    checkpoint = LTX2Adapter.build_tiny_checkpoint(tmp_path_factory.mktemp("ltx2") / "ltx2-tiny", seed=0)
    return LTX2Adapter.load(ltx2_config(checkpoint))


def ltx2_request(**changes) -> GenerationRequest:
    base = GenerationRequest(
        prompt="a red bird flies over the sea", width=64, height=64, num_frames=17, fps=24, seed=7
    )
    return measured(replace(base, **changes))


def seen_by_the_dit(adapter: LTX2Adapter, cond, req) -> tuple[list[dict], object]:
    """Every transformer call's hidden states and video coords, and the denoised bundle."""
    calls: list[dict] = []
    hook = adapter.pipe.transformer.register_forward_pre_hook(
        lambda _m, _a, kw: calls.append(
            {
                k: kw[k].clone()
                for k in ("hidden_states", "video_coords", "audio_hidden_states", "audio_timestep")
            }
        ),
        with_kwargs=True,
    )
    try:
        latents = adapter.denoise(cond, req)
    finally:
        hook.remove()
    return calls, latents


def test_ltx2_guide_at_frame_zero_replaces_the_first_latent_frame(ltx2, media):
    req = ltx2_request(guides=(Guide(media["image"], 0),))
    cond = ltx2.encode(req)
    assert cond.meta["conditions"] == [{"role": "guide", "pixel_frame": 0, "strength": 1.0}]
    latents = ltx2.denoise(cond, req).tensors["video"]
    guide = cond.tensors["image_latents.0"]
    pipe = ltx2.pipe
    normalised = pipe._normalize_latents(
        latents, pipe.vae.latents_mean, pipe.vae.latents_std, pipe.vae.config.scaling_factor
    )
    assert torch.allclose(normalised[:, :, :1], guide, atol=1e-5)  # the clip starts at the guide
    plain = ltx2.denoise(ltx2.encode(ltx2_request()), ltx2_request()).tensors["video"]
    assert not torch.allclose(plain[:, :, :1], latents[:, :, :1], atol=1e-3)


def test_ltx2_guide_elsewhere_is_a_clean_keyframe_at_its_frame(ltx2, media):
    req = ltx2_request(guides=(Guide(media["image"], 8),))
    cond = ltx2.encode(req)
    calls, latents = seen_by_the_dit(ltx2, cond, req)
    clip_tokens = 3 * 8 * 8  # 17 frames -> 3 latent frames of 8x8
    guide = ltx2.pipe._pack_latents(cond.tensors["image_latents.0"], 1, 1)
    for call in calls:
        assert call["hidden_states"].shape[1] == clip_tokens + guide.shape[1]
        assert torch.equal(call["hidden_states"][:, clip_tokens:], guide)  # held clean at every step
        start, end = call["video_coords"][0, 0, clip_tokens:].unbind(-1)  # time, in seconds
        assert torch.allclose(start, torch.full_like(start, 8 / 24))  # at frame 8
        assert torch.allclose(end, torch.full_like(end, 9 / 24))  # one frame long
    assert latents.tensors["video"].shape == (1, 8, 3, 8, 8)  # keyframe tokens dropped after sampling
    plain = ltx2.denoise(ltx2.encode(ltx2_request()), ltx2_request()).tensors["video"]
    later = ltx2_request(guides=(Guide(media["image"], 12),))
    elsewhere = ltx2.denoise(ltx2.encode(later), later).tensors["video"]
    assert not torch.equal(latents.tensors["video"], plain)  # it steers the clip
    assert not torch.equal(latents.tensors["video"], elsewhere)  # and where it sits matters
    from_end = ltx2_request(guides=(Guide(media["image"], anchor(-9, 17, "f")),))
    assert torch.equal(
        ltx2.denoise(ltx2.encode(from_end), from_end).tensors["video"], latents.tensors["video"]
    )
    assert torch.equal(ltx2.denoise(cond, req).tensors["video"], latents.tensors["video"])  # same seed


def test_ltx2_guide_video_is_one_multi_frame_condition(ltx2, media):
    at_start = ltx2_request(guides=(Guide(media["ltx_silent"], 0),))
    cond = ltx2.encode(at_start)
    assert cond.tensors["image_latents.0"].shape[2] == 2  # 9 frames: 2 latent frames
    assert "audio_latents" not in cond.tensors  # a silent video brings no sound
    latents = ltx2.denoise(cond, at_start).tensors["video"]
    pipe = ltx2.pipe
    normalised = pipe._normalize_latents(
        latents, pipe.vae.latents_mean, pipe.vae.latents_std, pipe.vae.config.scaling_factor
    )
    assert torch.allclose(normalised[:, :, :2], cond.tensors["image_latents.0"], atol=1e-5)
    later = ltx2_request(guides=(Guide(media["ltx_silent"], 8),))
    calls, _ = seen_by_the_dit(ltx2, ltx2.encode(later), later)
    assert calls[0]["hidden_states"].shape[1] == 3 * 64 + 2 * 64  # the clip, then the 2 latent frames
    start, _ = calls[0]["video_coords"][0, 0, 3 * 64 :].unbind(-1)  # the pipeline's keyframe times
    assert float(start.min()) == pytest.approx(8 / 24, abs=1e-6)  # from frame 8
    with pytest.raises(CapabilityError) as err:  # 9 frames from frame 9 of 17: no room
        ltx2.check(ltx2_request(guides=(Guide(media["ltx_silent"], 9),)))
    assert err.value.field == "guides[0]"


def test_ltx2_a_sound_is_held_from_its_frame_on(ltx2, media):
    req = ltx2_request(guides=(Guide(media["tone"], 8, "audio"),))
    cond = ltx2.encode(req)
    # 25 audio latent frames a second: 17 frames at 24 fps are 18; frame 8 starts at latent 8.
    mask = cond.tensors["audio_mask"][0]
    assert mask.tolist() == [0.0] * 8 + [1.0] * 10
    calls, latents = seen_by_the_dit(ltx2, cond, req)
    for call in calls:
        assert (call["audio_timestep"][:, 8:] == 0).all() and (call["audio_timestep"][:, :8] > 0).all()
    audio, clean = latents.tensors["audio"], cond.tensors["audio_latents"]
    assert torch.allclose(audio[:, :, 8:], clean[:, :, 8:], atol=1e-4)  # the sound, as given
    assert not torch.allclose(audio[:, :, :8], clean[:, :, :8], atol=1e-2)  # generated before it
    assert latents.meta["audio_held"] and latents.meta["audio_held_frames"] == 10
    assert torch.equal(ltx2.denoise(cond, req).tensors["audio"], audio)  # same seed, same track
    assert ltx2.decode(latents, req).audio.shape == (2, 17000)


def test_ltx2_a_guide_videos_sound_unless_left_out(ltx2, media):
    with_sound = ltx2_request(guides=(Guide(media["ltx_clip"], 0, with_audio=True),))
    assert with_sound.guides[0].with_audio
    cond = ltx2.encode(with_sound)
    held = cond.tensors["audio_mask"][0] if "audio_mask" in cond.tensors else torch.ones(18)
    assert held[0] == 1 and 9 <= int(held.sum()) <= 11  # 9 frames at 24 fps: 0.375 s, ~10 latents
    without = ltx2_request(guides=(Guide(media["ltx_clip"], 0, with_audio=False),))
    assert "audio_latents" not in ltx2.encode(without).tensors


@pytest.mark.parametrize(
    ("guides", "memory_audio", "field"),
    [
        (lambda m: (Guide(m["tone"], 0, "audio"),), True, "guides[0]"),  # a second track
        (lambda m: (Guide(m["tone"], 0, "audio"), Guide(m["tone"], 9, "audio")), False, "guides[1]"),
        (
            lambda m: (Guide(m["ltx_clip"], 0, with_audio=True), Guide(m["tone"], 9, "audio")),
            False,
            "guides[1]",
        ),
        (lambda m: (Guide(m["image"], 17),), False, "guides[0].frame"),  # outside the clip
    ],
)
def test_ltx2_refusals_name_the_guide(ltx2, media, guides, memory_audio, field):
    memory = (MemorySlot(media["image"], media["tone"]),) if memory_audio else ()
    req = replace(ltx2_request(memory=memory), guides=guides(media))
    with pytest.raises(CapabilityError) as err:
        ltx2.check(measured(req))
    assert err.value.field == field
    assert ltx2.capabilities.frame_guides and ltx2.capabilities.audio_guides
