"""Native sampling on LTX-2 (#22): the tiny checkpoint's own scheduler (flow-match Euler, shifted by
``mu`` of the token count, stretched to ``shift_terminal``), sampled by the engine's loop, gives
exactly the latents of ``LTX2ConditionPipeline.__call__(..., output_type="latent")``.

``output_type="latent"`` returns, for LTX-2, the video latents unpacked (B, C, F, H, W) and
denormalised (the VAE's latents_mean/std and scaling factor undone) and the audio latents unpacked
(B, C, L, mel) and denormalised: the engine's bundle holds the same, so like is compared with like.

The pipeline's defaults also run STG, modality-isolation guidance and guidance rescale (one more
DiT call a step each for the first two). The engine runs them where the sampler YAML sets them
(tested against ``__call__`` with the same values); the other tests compare CFG alone, so their
reference calls switch them off (``stg_scale=0``, ``modality_scale=1``, ``guidance_rescale=0``).
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from test_ltx2 import _config as dmd_config

from shotloom.capabilities import CapabilityError
from shotloom.config import InferenceConfig
from shotloom.families.ltx2 import LTX2Adapter
from shotloom.request import GenerationRequest, Guide, MemorySlot

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: one thread is fastest

STEPS, GUIDANCE, AUDIO_GUIDANCE, SEED = 4, 3.0, 5.0, 3
PROMPT = "a red kite over the sea"
# What the real LTX-2 diffusers folder's scheduler/scheduler_config.json says.
REAL_SCHEDULER = {
    "_class_name": "FlowMatchEulerDiscreteScheduler",
    "num_train_timesteps": 1000,
    "shift": 1.0,
    "use_dynamic_shifting": True,
    "base_shift": 0.95,
    "max_shift": 2.05,
    "base_image_seq_len": 1024,
    "max_image_seq_len": 4096,
    "shift_terminal": 0.1,
    "time_shift_type": "exponential",
    "stochastic_sampling": False,
    "invert_sigmas": False,
    "use_karras_sigmas": False,
    "use_exponential_sigmas": False,
    "use_beta_sigmas": False,
}
# Only CFG: what the engine's native sampler runs unless its YAML sets the terms (module docstring).
CFG_ONLY = dict(
    stg_scale=0.0,
    audio_stg_scale=0.0,
    modality_scale=1.0,
    audio_modality_scale=1.0,
    guidance_rescale=0.0,
    audio_guidance_rescale=0.0,
)


def native_config(checkpoint: Path, **sampler) -> InferenceConfig:
    return InferenceConfig.model_validate(
        {
            "family": "ltx2",
            "paths": {"checkpoint": checkpoint, "cache_dir": checkpoint.parent / "cache"},
            "sampler": {
                "mode": "native",
                "steps": STEPS,
                "guidance_scale": GUIDANCE,
                "audio_guidance_scale": AUDIO_GUIDANCE,
                **sampler,
            },
            "defaults": {"width": 64, "height": 64, "num_frames": 17, "fps": 24},
            # The pipeline VAE-encodes image conditions with whatever tiling is on; the engine
            # encodes them untiled. Off here, so both encode alike.
            "tiling": {"enabled": False},
        }
    )


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return LTX2Adapter.build_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "ltx2-tiny", seed=0)


@pytest.fixture(scope="module")
def adapter(checkpoint) -> LTX2Adapter:
    return LTX2Adapter.load(native_config(checkpoint))


@pytest.fixture(scope="module")
def pipe(checkpoint):
    """The pipeline itself, freshly loaded from the same folder: its own scheduler, its own __call__."""
    from diffusers import LTX2ConditionPipeline

    pipe = LTX2ConditionPipeline.from_pretrained(str(checkpoint), local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture(scope="module")
def media(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("media")
    y, x = np.mgrid[0:64, 0:64]
    frame = np.stack([x * 4, y * 4, (x + y) * 2], -1).astype(np.uint8)
    Image.fromarray(frame).save(root / "frame.png")
    from shotloom.media import write_mp4

    video = np.repeat(frame[None], 17, 0)
    for i in range(17):
        video[i, 20:40, 5 + 2 * i : 25 + 2 * i] = (255, 255, 0)
    t = np.arange(int(24000 * 17 / 24)) / 24000
    tone = np.stack([np.sin(2 * np.pi * 440 * t)] * 2).astype(np.float32) * 0.3
    write_mp4(root / "source.mp4", video, 24, tone, 24000)
    return {"frame": root / "frame.png", "source": root / "source.mp4"}


class DiTCalls:
    """Forward calls of a transformer and the batch rows they carry (CFG: [negative, positive])."""

    def __init__(self, transformer) -> None:
        self.calls = self.rows = 0
        transformer.register_forward_pre_hook(self._hit, with_kwargs=True)

    def _hit(self, _module, _args, kwargs) -> None:
        self.calls += 1
        self.rows += kwargs["hidden_states"].shape[0]

    def take(self) -> tuple[int, int]:
        out, (self.calls, self.rows) = (self.calls, self.rows), (0, 0)
        return out


@pytest.fixture(scope="module")
def _counters(adapter, pipe) -> dict[str, DiTCalls]:
    return {"engine": DiTCalls(adapter.pipe.transformer), "pipeline": DiTCalls(pipe.transformer)}


@pytest.fixture
def dit_calls(_counters) -> dict[str, DiTCalls]:
    """The counters, from zero for this test."""
    for counter in _counters.values():
        counter.take()
    return _counters


def request(**changes) -> GenerationRequest:
    base = GenerationRequest(
        prompt=PROMPT,
        width=64,
        height=64,
        num_frames=17,
        fps=24,
        seed=SEED,
        guidance_scale=GUIDANCE,
        num_inference_steps=STEPS,
    )
    return replace(base, **changes)


def reference(pipe, conditions=None, **changes):
    """``__call__`` as a diffusers user calls it: a prompt, a seed, steps and guidance."""
    from diffusers.pipelines.ltx2.pipeline_ltx2_condition import LTX2VideoCondition

    kwargs = dict(
        prompt=PROMPT,  # the negative prompt is the pipeline's default ("")
        height=64,
        width=64,
        num_frames=17,
        frame_rate=24.0,
        num_inference_steps=STEPS,
        guidance_scale=GUIDANCE,
        audio_guidance_scale=AUDIO_GUIDANCE,
        generator=torch.Generator().manual_seed(SEED),  # how a diffusers user seeds a run
        output_type="latent",
        return_dict=False,
        **CFG_ONLY,
    )
    if conditions:
        kwargs["conditions"] = [LTX2VideoCondition(frames=f, index=i, strength=s) for f, i, s in conditions]
    return pipe(**{**kwargs, **changes})


# -- checkpoint ------------------------------------------------------------------------------------
def test_the_tiny_checkpoint_ships_the_real_scheduler(checkpoint):
    config = json.loads((checkpoint / "scheduler" / "scheduler_config.json").read_text())
    assert {k: config[k] for k in REAL_SCHEDULER} == REAL_SCHEDULER
    # DMD still samples exactly the YAML's sigmas on it (make_dmd_scheduler switches the shifting off).
    dmd = LTX2Adapter.load(dmd_config(checkpoint))
    req = request(guidance_scale=1.0, num_inference_steps=None)
    out = dmd.denoise(dmd.encode(req), req)
    assert out.meta["sampling"]["mode"] == "dmd" and out.meta["sigmas"] == [1.0, 0.75, 0.5, 0.25]


# -- equality with the pipeline --------------------------------------------------------------------
def test_prompt_only_equals_the_pipelines_own_call(adapter, pipe, dit_calls):
    req = request()
    out = adapter.denoise(adapter.encode(req), req)
    engine = dit_calls["engine"].take()
    video, audio = reference(pipe)
    # Bit for bit: the same ops in the same order (CFG in x0 space, the same schedule and noise).
    assert out.tensors["video"].shape == video.shape == (1, 8, 3, 8, 8)
    assert out.tensors["audio"].shape == audio.shape
    assert torch.equal(out.tensors["video"], video) and torch.equal(out.tensors["audio"], audio)
    # CFG: one DiT call a step on a [negative, positive] batch, as the pipeline makes it: two
    # evaluations a step (what dit_calls_per_step counts).
    assert engine == dit_calls["pipeline"].take() == (STEPS, 2 * STEPS)
    sampling = out.meta["sampling"]
    assert sampling["mode"] == "native" and sampling["scheduler"] == "FlowMatchEulerDiscreteScheduler"
    assert (sampling["steps"], sampling["guidance_scale"], sampling["dit_calls_per_step"]) == (STEPS, 3.0, 2)
    assert sampling["audio_guidance_scale"] == AUDIO_GUIDANCE
    # __call__'s schedule: linspace(1, 1/steps) shifted by mu of 192 tokens, ending at shift_terminal.
    assert out.meta["sigmas"] == pipe.scheduler.sigmas[:-1].tolist()
    assert out.meta["sigmas"][0] == 1.0 and out.meta["sigmas"][-1] == pytest.approx(0.1)


@pytest.mark.parametrize("case", ["first_frame", "first_frame+keyframe", "keyframe_half_strength"])
def test_image_conditions_equal_the_pipelines_own_call(adapter, pipe, media, dit_calls, case):
    """A first frame (latent index 0, replaced tokens) and a keyframe (appended tokens). The
    pipeline's ``index`` is a latent index: its keyframe at latent frame 2 sits at pixel frame
    (2 - 1) x 8 + 1 = 9, where the engine's guide at frame 9 puts it. The engine's memory
    references are keyframes at half strength; the pipeline takes any strength: the encoded
    condition's strength is set to 0.5 to compare that step too (tokens at (1 - s) x sigma)."""
    image = Image.open(media["frame"]).convert("RGB")
    conditions = [(image, 0, 1.0)]
    req = request(first_frame=media["frame"])
    if case != "first_frame":
        req = replace(req, guides=(Guide(media["frame"], 9, frames=1),))
        conditions.append((image, 2, 0.5 if case == "keyframe_half_strength" else 1.0))
    cond = adapter.encode(req)
    if case == "keyframe_half_strength":
        cond.meta["conditions"][1]["strength"] = 0.5
    out = adapter.denoise(cond, req)
    video, audio = reference(pipe, conditions)
    assert torch.equal(out.tensors["video"], video) and torch.equal(out.tensors["audio"], audio)
    assert dit_calls["engine"].take() == dit_calls["pipeline"].take() == (STEPS, 2 * STEPS)


def test_without_guidance_one_dit_evaluation_a_step(checkpoint, pipe, dit_calls):
    unguided = LTX2Adapter.load(native_config(checkpoint, audio_guidance_scale=None))  # audio: the video's
    calls = DiTCalls(unguided.pipe.transformer)
    req = request(guidance_scale=1.0)
    out = unguided.denoise(unguided.encode(req), req)
    video, audio = reference(pipe, guidance_scale=1.0, audio_guidance_scale=None)
    assert torch.equal(out.tensors["video"], video) and torch.equal(out.tensors["audio"], audio)
    assert calls.take() == dit_calls["pipeline"].take() == (STEPS, STEPS)
    sampling = out.meta["sampling"]
    assert sampling["dit_calls_per_step"] == 1 and "audio_guidance_scale" not in sampling


def test_a_request_without_guidance_keeps_the_samplers_audio_guidance(adapter, pipe, dit_calls):
    """The request's guidance 1 with the sampler's audio guidance 7: ``__call__`` still runs the
    [negative, positive] batch (the video's delta zero, the audio's guided), and so does the engine:
    its conditioning holds the negative prompt, cached apart from an unguided one's."""
    from shotloom.cache import conditioning_key

    req = request(guidance_scale=1.0)
    assert adapter.uses_negative(req)
    cond = adapter.encode(req)
    assert "negative_prompt_embeds" in cond.tensors and cond.meta["uses_negative"]
    identity = adapter.encoder_identity()
    assert conditioning_key(identity, req, True) != conditioning_key(identity, req, False)
    out = adapter.denoise(cond, req)
    video, audio = reference(pipe, guidance_scale=1.0, audio_guidance_scale=AUDIO_GUIDANCE)
    assert torch.equal(out.tensors["video"], video) and torch.equal(out.tensors["audio"], audio)
    assert dit_calls["engine"].take() == dit_calls["pipeline"].take() == (STEPS, 2 * STEPS)
    sampling = out.meta["sampling"]
    assert (sampling["guidance_scale"], sampling["audio_guidance_scale"]) == (1.0, AUDIO_GUIDANCE)
    assert sampling["dit_calls_per_step"] == 2


# -- LTX-2's further guidance terms -----------------------------------------------------------------
# As __call__'s defaults set them (the tiny DiT has two blocks: STG perturbs the last).
TERMS = dict(stg_scale=1.0, modality_scale=3.0, guidance_rescale=0.7, spatio_temporal_guidance_blocks=[1])


@pytest.fixture(scope="module")
def guided(checkpoint) -> LTX2Adapter:
    """The same checkpoint with the sampler's STG, modality isolation and guidance rescale on."""
    return LTX2Adapter.load(native_config(checkpoint, **TERMS))


@pytest.mark.parametrize("case", ["prompt", "first_frame"])
def test_stg_modality_isolation_and_rescale_equal_the_pipelines_own_call(
    guided, pipe, media, dit_calls, case
):
    """Each step: the CFG batch, one call with the STG block perturbed, one with the audio-video
    cross-attention off, every term a delta in x0 space, then rescaled: bit for bit ``__call__``
    with the same values (its defaults for LTX-2, with the tiny DiT's block)."""
    calls = DiTCalls(guided.pipe.transformer)
    req = request(first_frame=media["frame"]) if case == "first_frame" else request()
    out = guided.denoise(guided.encode(req), req)
    conditions = [(Image.open(media["frame"]).convert("RGB"), 0, 1.0)] if case == "first_frame" else None
    video, audio = reference(
        pipe,
        conditions,
        **TERMS,
        audio_stg_scale=TERMS["stg_scale"],
        audio_modality_scale=TERMS["modality_scale"],
        audio_guidance_rescale=TERMS["guidance_rescale"],
    )
    assert torch.equal(out.tensors["video"], video) and torch.equal(out.tensors["audio"], audio)
    # Three DiT calls a step: [negative, positive], the perturbed one, the isolated one.
    assert calls.take() == dit_calls["pipeline"].take() == (3 * STEPS, 4 * STEPS)
    sampling = out.meta["sampling"]
    assert sampling["dit_calls_per_step"] == 4
    assert {k: sampling[k] for k in TERMS} == TERMS
    assert (sampling["audio_stg_scale"], sampling["audio_modality_scale"]) == (1.0, 3.0)
    # The terms change the clip: the CFG-only sampler's latents are another clip.
    plain = LTX2Adapter.load(native_config(guided.cfg.paths.checkpoint))
    assert not torch.equal(plain.denoise(plain.encode(req), req).tensors["video"], out.tensors["video"])


def test_guidance_terms_are_refused_where_they_cannot_run(checkpoint):
    # STG needs the blocks it perturbs, and they must be blocks of the checkpoint's DiT.
    with pytest.raises(ValueError, match="spatio_temporal_guidance_blocks: STG"):
        native_config(checkpoint, stg_scale=1.0)
    with pytest.raises(ValueError, match=r"sampler\.spatio_temporal_guidance_blocks: \[2\] are not blocks"):
        LTX2Adapter.load(native_config(checkpoint, stg_scale=1.0, spatio_temporal_guidance_blocks=[2]))
    # Wan runs CFG only: an LTX-2 term in its YAML is refused, naming the key.
    wan = {"family": "wan", "paths": {"checkpoint": checkpoint}, "sampler": {"mode": "native"}}
    with pytest.raises(
        ValueError, match=r"sampler\.modality_scale: an LTX-2 guidance term; wan runs CFG only"
    ):
        InferenceConfig.model_validate({**wan, "sampler": {"mode": "native", "modality_scale": 2.0}})
    with pytest.raises(ValueError, match=r"sampler\.audio_guidance_scale: an LTX-2 guidance term"):
        InferenceConfig.model_validate({**wan, "sampler": {"mode": "native", "audio_guidance_scale": 5.0}})
    InferenceConfig.model_validate(wan)  # the terms' off values are every family's


def test_a_step_counts_the_evaluations_the_pipeline_makes_and_the_eta_counts_them_too():
    """LTX-2 at diffusers' defaults (configs/models/ltx2-dev.yaml): the CFG batch, STG and modality
    isolation, four evaluations a step, also at the request's guidance 1 (the audio's is 7); the
    API's ETA prices a queued job's denoising by them."""
    from api.core.sampling import dit_calls
    from shotloom.config import REPO_ROOT, StepCalls, load_inference_config

    dev = load_inference_config(REPO_ROOT / "configs" / "models" / "ltx2-dev.yaml").sampler
    assert dev.step_calls(3.0) == dev.step_calls(1.0) == StepCalls(cfg=True, stg=True, modality=True)
    assert dev.step_calls(1.0).evaluations == 4 and dit_calls(30, 1.0, dev) == 120
    plain = native_config(Path("unused"), audio_guidance_scale=None).sampler
    assert plain.step_calls(1.0).evaluations == 1 and plain.step_calls(3.0).evaluations == 2
    assert dit_calls(30, 1.0) == 30 and dit_calls(30, 3.0) == 60  # no sampler known: CFG alone


# -- steps, shift, modes ---------------------------------------------------------------------------
def test_steps_per_request_change_the_schedule(adapter, dit_calls):
    seen: list[tuple[int, int]] = []
    req = request(num_inference_steps=2, guidance_scale=1.0)
    two = adapter.denoise(adapter.encode(req), req, progress=lambda i, n: seen.append((i, n)))
    # Two calls on the [negative, positive] batch: the sampler's audio guidance keeps CFG on.
    assert seen == [(1, 2), (2, 2)] and dit_calls["engine"].take() == (2, 4)
    assert two.meta["sampling"]["steps"] == 2 and len(two.meta["sigmas"]) == 2
    default = adapter.denoise(adapter.encode(request()), request(num_inference_steps=None))
    assert default.meta["sampling"]["steps"] == STEPS  # the sampler's own count
    assert two.meta["sigmas"] != default.meta["sigmas"][:2]


def test_flow_shift_replaces_the_dynamic_shift(checkpoint, adapter):
    """LTX-2 shifts by mu of the token count; a YAML flow_shift fixes the shift instead. The
    exponential time shift by mu is the fixed shift exp(mu), so that value gives the same schedule."""
    from diffusers.pipelines.ltx2.pipeline_ltx2_condition import calculate_shift

    req = request(guidance_scale=1.0)
    cond = adapter.encode(req)
    dynamic = adapter.denoise(cond, req).meta["sigmas"]
    mu = calculate_shift(192, 1024, 4096, 0.95, 2.05)  # 3 x 8 x 8 tokens
    same = LTX2Adapter.load(native_config(checkpoint, flow_shift=math.exp(mu)))
    assert same.denoise(cond, req).meta["sigmas"] == pytest.approx(dynamic, abs=1e-6)
    flat = LTX2Adapter.load(native_config(checkpoint, flow_shift=1.0))
    unshifted = flat.denoise(cond, req).meta["sigmas"]
    assert unshifted != pytest.approx(dynamic, abs=1e-3) and unshifted[-1] == pytest.approx(0.1)


def test_dmd_refuses_another_step_count(checkpoint):
    dmd = LTX2Adapter.load(dmd_config(checkpoint))
    with pytest.raises(CapabilityError) as err:
        dmd.check(request(num_inference_steps=5, guidance_scale=1.0))
    assert err.value.field == "num_inference_steps" and "4 steps" in str(err.value)
    dmd.check(request(num_inference_steps=4, guidance_scale=1.0))


# -- conditions the pipeline cannot take -----------------------------------------------------------
def test_video_to_video_starts_at_the_strength(adapter, media, dit_calls):
    req = request(source_video=media["source"], strength=0.5, num_inference_steps=8, guidance_scale=1.0)
    cond = adapter.encode(req)
    out = adapter.denoise(cond, req)
    sigmas = out.meta["sigmas"]
    assert 0 < len(sigmas) < 8 and sigmas[0] <= 0.5 + 1e-6 and out.meta["sampling"]["steps"] == len(sigmas)
    assert dit_calls["engine"].take() == (len(sigmas), 2 * len(sigmas))  # the audio's CFG batch
    assert torch.equal(adapter.denoise(cond, req).tensors["video"], out.tensors["video"])  # same seed


def test_held_audio_stays_the_input_track(adapter, media, tmp_path):
    """An input track (a memory slot's audio) is held clean while the video attends to it."""
    from shotloom.media import write_mp4

    tone = tmp_path / "tone.mp4"
    t = np.arange(24000) / 24000
    sound = np.stack([np.sin(2 * np.pi * 330 * t)] * 2).astype(np.float32) * 0.3
    write_mp4(tone, np.zeros((24, 64, 64, 3), np.uint8), 24, sound, 24000)
    req = request(memory=(MemorySlot(media["frame"], audio=tone),))
    cond = adapter.encode(req)
    out = adapter.denoise(cond, req)
    assert out.meta["audio_held"]
    assert torch.allclose(out.tensors["audio"], cond.tensors["audio_latents"], atol=1e-6)
    silent = request(memory=(MemorySlot(media["frame"]),))
    plain = adapter.denoise(adapter.encode(silent), silent)
    assert not torch.equal(out.tensors["video"], plain.tensors["video"])  # the video attends to it
