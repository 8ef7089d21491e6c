"""Native sampling (#22): every Wan pipeline shape a user meets, sampled with the checkpoint's own
scheduler, gives exactly the latents of diffusers' own ``__call__(..., output_type="latent")``.

The engine runs its stages apart (encode -> bundle on disk -> denoise), so the comparison is the
contract that a seed, steps and guidance found with diffusers reproduce here. Latents are compared,
never MP4s: on tiny random weights H.264's own error is larger than two seeds' difference.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from shotloom.admission import checkpoint_footprint
from shotloom.capabilities import CapabilityError
from shotloom.config import InferenceConfig
from shotloom.families.wan import TINY_SHAPES, WanAdapter
from shotloom.request import GenerationRequest, MemorySlot

pytestmark = pytest.mark.usefixtures("one_torch_thread")

STEPS, GUIDANCE, SEED = 5, 4.0, 3
PROMPT = "a red kite over the sea"
REAL_SCHEDULER = {  # what the published folders ship (flow_shift per the official configs)
    "vace": 3.0,
    "t2v": 3.0,
    "i2v": 3.0,
    "t2v-a14b": 12.0,
    "i2v-a14b": 5.0,
    "ti2v-5b": 5.0,
}


def native_config(checkpoint: Path, **sampler) -> InferenceConfig:
    return InferenceConfig.model_validate(
        {
            "family": "wan",
            "paths": {"checkpoint": checkpoint},
            "sampler": {"mode": "native", "steps": STEPS, "guidance_scale": GUIDANCE, **sampler},
            "defaults": {"width": 64, "height": 64, "num_frames": 9, "fps": 16},
            "tiling": {"enabled": False},
        }
    )


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("shapes")
    return {shape: WanAdapter.build_tiny_checkpoint(root / shape, shape=shape) for shape in TINY_SHAPES}


@pytest.fixture(scope="module")
def frame(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("frame") / "frame.png"
    Image.fromarray((np.random.default_rng(0).random((64, 64, 3)) * 255).astype(np.uint8)).save(path)
    return path


def count_dit_calls(adapter: WanAdapter) -> dict[str, int]:
    calls = {name: 0 for name in adapter.generator_names()}
    for name in calls:

        def hit(_module, _args, name=name):
            calls[name] += 1

        getattr(adapter.pipe, name).register_forward_pre_hook(hit)
    return calls


def request(**changes) -> GenerationRequest:
    base = GenerationRequest(
        prompt=PROMPT,
        width=64,
        height=64,
        num_frames=9,
        fps=16,
        seed=SEED,
        guidance_scale=GUIDANCE,
        num_inference_steps=STEPS,
    )
    return replace(base, **changes)


def pipeline_latents(pipe, **inputs) -> torch.Tensor:
    """diffusers' own ``__call__`` on the test clip (64x64, 9 frames, STEPS steps at GUIDANCE unless
    ``inputs`` say otherwise), seeded as a diffusers user seeds a run: its latent output."""
    call = dict(
        prompt=PROMPT,  # prompt only: the negative prompt is the pipeline's default ("")
        height=64,
        width=64,
        num_frames=9,
        num_inference_steps=STEPS,
        guidance_scale=GUIDANCE,
        generator=torch.Generator().manual_seed(SEED),
        output_type="latent",
    )
    return pipe(**{**call, **inputs}).frames


@pytest.mark.parametrize("shape", list(TINY_SHAPES))
def test_every_shape_equals_the_pipelines_own_call(shape, checkpoints, frame):
    ckpt = checkpoints[shape]
    scheduler = json.loads((ckpt / "scheduler" / "scheduler_config.json").read_text())
    assert scheduler["_class_name"] == "UniPCMultistepScheduler"
    assert scheduler["prediction_type"] == "flow_prediction" and scheduler["use_flow_sigmas"] is True
    assert scheduler["flow_shift"] == REAL_SCHEDULER[shape]

    adapter = WanAdapter.load(native_config(ckpt))
    calls = count_dit_calls(adapter)
    first = frame if shape.startswith("i2v") else None
    req = request(first_frame=first, fps=24 if shape == "ti2v-5b" else 16)
    latents = adapter.denoise(adapter.encode(req), req).tensors["video"]
    ours = dict(calls)
    calls.update(dict.fromkeys(calls, 0))

    image = {"image": Image.open(first).convert("RGB")} if first is not None else {}
    reference = pipeline_latents(adapter.pipe, **image)
    assert latents.shape == reference.shape
    assert torch.equal(latents, reference)  # bit for bit: the same ops in the same order
    # CFG: two DiT calls a step (the prompt and the negative prompt), as the pipeline makes them.
    assert sum(ours.values()) == 2 * STEPS == sum(calls.values())
    if shape.endswith("a14b"):  # both experts work: high noise first, then the low-noise one
        assert ours["transformer"] > 0 and ours["transformer_2"] > 0
    if shape == "ti2v-5b":
        assert latents.shape[1] == 48  # the 48-channel VAE's latents, decoded at full size
        decoded = adapter.decode(adapter.denoise(adapter.encode(req), req), req)
        assert decoded.frames.shape == (9, 64, 64, 3)


@pytest.mark.parametrize("shape", ["i2v", "i2v-a14b"])
def test_i2v_first_and_last_frame_equal_the_pipeline(shape, checkpoints, frame, tmp_path):
    """I2V between two frames: the pipeline's ``image`` and ``last_image`` (Wan 2.1 also embeds both
    with CLIP)."""
    last = tmp_path / "last.png"
    Image.fromarray((np.random.default_rng(1).random((64, 64, 3)) * 255).astype(np.uint8)).save(last)
    adapter = WanAdapter.load(native_config(checkpoints[shape]))
    assert adapter.capabilities.last_frame
    req = request(first_frame=frame, last_frame=last)
    latents = adapter.denoise(adapter.encode(req), req).tensors["video"]
    reference = pipeline_latents(
        adapter.pipe, image=Image.open(frame).convert("RGB"), last_image=Image.open(last).convert("RGB")
    )
    assert torch.equal(latents, reference)
    first_only = adapter.denoise(adapter.encode(request(first_frame=frame)), request(first_frame=frame))
    assert not torch.equal(first_only.tensors["video"], latents)  # the last frame conditions it


def test_vace_with_references_equals_the_pipeline(checkpoints, frame):
    """VACE prepends one latent frame per reference image; the pipeline's latent output keeps them
    (it drops them only when it decodes), the engine's does not: the clip's frames are equal."""
    adapter = WanAdapter.load(native_config(checkpoints["vace"]))
    req = request(first_frame=frame, memory=(MemorySlot(frame),))
    latents = adapter.denoise(adapter.encode(req), req).tensors["video"]
    image = Image.open(frame).convert("RGB")
    # A user's masked video: the first frame given (mask 0), the rest unknown (mid-grey, mask 1).
    video = np.full((1, 9, 64, 64, 3), 0.5, dtype=np.float32)
    video[0, 0] = np.asarray(image, dtype=np.float32) / 255.0
    mask = np.ones_like(video)
    mask[0, 0] = 0.0
    reference = pipeline_latents(adapter.pipe, video=video, mask=mask, reference_images=[image])
    assert reference.shape[2] == latents.shape[2] + 1
    assert torch.equal(latents, reference[:, :, 1:])


def test_steps_and_guidance_per_request(checkpoints):
    adapter = WanAdapter.load(native_config(checkpoints["t2v"]))
    calls = count_dit_calls(adapter)
    req = request(num_inference_steps=3, guidance_scale=1.0)
    out = adapter.denoise(adapter.encode(req), req)
    assert calls["transformer"] == 3  # no CFG at guidance 1: one call a step
    sampling = out.meta["sampling"]
    assert (sampling["mode"], sampling["steps"], sampling["guidance_scale"]) == ("native", 3, 1.0)
    assert sampling["scheduler"] == "UniPCMultistepScheduler" and len(sampling["sigmas"]) == 3
    # The default count when the request asks none; flow_shift from the YAML reshapes the schedule.
    default = adapter.denoise(adapter.encode(request(num_inference_steps=None)), request())
    assert default.meta["sampling"]["steps"] == STEPS
    shifted = WanAdapter.load(native_config(checkpoints["t2v"], flow_shift=1.0))
    other = shifted.denoise(shifted.encode(request()), request())
    assert other.meta["sampling"]["sigmas"] != default.meta["sampling"]["sigmas"]


def test_dmd_refuses_another_step_count(checkpoints):
    cfg = native_config(checkpoints["t2v"])
    cfg.sampler = type(cfg.sampler)(mode="dmd", sigmas=[1.0, 0.5])
    adapter = WanAdapter.load(cfg)
    with pytest.raises(CapabilityError) as err:
        adapter.check(request(num_inference_steps=5, guidance_scale=1.0))
    assert err.value.field == "num_inference_steps" and "2 steps" in str(err.value)
    adapter.check(request(num_inference_steps=2, guidance_scale=1.0))


def test_video_to_video_starts_at_the_strength(checkpoints, tmp_path):
    """A native scheduler's tail from the first sigma at or below the strength."""
    from shotloom import media

    adapter = WanAdapter.load(native_config(checkpoints["t2v"]))
    frames = (np.random.default_rng(1).random((9, 64, 64, 3)) * 255).astype(np.uint8)
    source = tmp_path / "source.mp4"
    media.write_mp4(source, frames, 16, None, None)
    req = request(source_video=source, strength=0.5, num_inference_steps=10)
    out = adapter.denoise(adapter.encode(req), req)
    sigmas = out.meta["sampling"]["sigmas"]
    assert 0 < len(sigmas) < 10 and sigmas[0] <= 0.5 + 1e-6
    again = adapter.denoise(adapter.encode(req), req)
    assert torch.equal(out.tensors["video"], again.tensors["video"])


def test_two_experts_count_in_admission_and_residency(checkpoints):
    ckpt = checkpoints["t2v-a14b"]
    adapter = WanAdapter.load(native_config(ckpt))
    assert adapter.generator_names() == ["transformer", "transformer_2"]
    footprint = checkpoint_footprint(ckpt, dtype="float32")
    one = sum(p.stat().st_size for p in (ckpt / "transformer").glob("*.safetensors"))
    assert footprint.generator_bytes >= 2 * one * 0.9  # both experts, not the first alone
    before = adapter.generator_bytes()
    adapter.release_generator()
    assert adapter.generator_location() == "released"
    adapter.ensure_generator()
    assert adapter.pipe.transformer_2 is not None and adapter.generator_bytes() == before


def test_an_adapters_sampler_serves_drafts_on_the_same_weights(checkpoints, tmp_path):
    """A distill LoRA declares dmd with its sigmas: one resident base model answers a native
    request and a 4-step draft, each as its sampler says, without a reload; the base model's
    output is unchanged after the draft."""
    from shotloom.runtime import ModelRuntime

    data = native_config(checkpoints["t2v"]).model_dump(mode="json")
    data["paths"]["cache_dir"] = str(tmp_path / "cache")
    data["tiny"] = {"build_if_missing": True}  # the adapter's tiny random LoRA, built here
    distill = {"mode": "dmd", "sigmas": [1.0, 0.75, 0.5, 0.25], "guidance_scale": 1.0}
    data["adapters"] = [{"name": "distill", "path": str(tmp_path / "distill"), "sampler": distill}]
    rt = ModelRuntime(InferenceConfig.model_validate(data))
    adapter = rt.adapter
    calls = count_dit_calls(adapter)

    def run(req):
        req = rt.check(req)
        cond, _ = rt.condition(req)
        return rt.denoise(cond, req)

    base = run(rt.resolve(PROMPT, seed=SEED))
    assert base.meta["sampling"]["steps"] == STEPS and calls["transformer"] == 2 * STEPS
    draft_req = rt.resolve(PROMPT, seed=SEED, lora="distill")
    assert (draft_req.num_inference_steps, draft_req.guidance_scale) == (4, 1.0)  # the adapter's defaults
    draft = run(draft_req)
    assert draft.meta["sampling"]["mode"] == "dmd" and draft.meta["sampling"]["steps"] == 4
    assert calls["transformer"] == 2 * STEPS + 4
    with pytest.raises(CapabilityError, match="num_inference_steps"):
        rt.check(rt.resolve(PROMPT, seed=SEED, lora="distill", num_inference_steps=STEPS))
    after = run(rt.resolve(PROMPT, seed=SEED))
    assert torch.equal(after.tensors["video"], base.tensors["video"])
    assert adapter.generator_loads == 0 and adapter.adapter_loads == 1


def test_inference_cli_steps_guidance_and_saved_latents(checkpoints, tmp_path):
    import subprocess
    import sys

    import yaml

    from shotloom.config import REPO_ROOT

    config = tmp_path / "native.yaml"
    data = native_config(checkpoints["t2v"]).model_dump(mode="json")
    data["paths"]["cache_dir"] = str(tmp_path / "cache")
    config.write_text(yaml.safe_dump(data))
    saved = tmp_path / "latents.safetensors"
    args = [sys.executable, str(REPO_ROOT / "inference.py"), "--config", str(config), "--prompt", PROMPT]
    args += ["--seed", str(SEED), "--num-frames", "9", "--steps", "3", "--guidance-scale", "2.5"]
    args += ["--output", str(tmp_path / "out.mp4"), "--save-latents", str(saved)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["sampling"]["steps"] == 3 and summary["sampling"]["guidance_scale"] == 2.5
    latents = load_file(str(saved))["latents"]
    adapter = WanAdapter.load(native_config(checkpoints["t2v"]))
    reference = pipeline_latents(adapter.pipe, num_inference_steps=3, guidance_scale=2.5)
    assert torch.equal(latents, reference)


def test_saved_latents_are_the_same_bytes_every_time(tmp_path):
    """Same latents, same file: comparing runs by sha256 must work for --save-latents too."""
    from safetensors import safe_open

    from shotloom.bundle import TensorBundle
    from shotloom.runtime import save_latent_tensors

    bundle = TensorBundle(
        tensors={"video": torch.randn(1, 4, 3, 8, 8), "audio": torch.randn(1, 8, 4)},
        meta={"family": "wan", "pipeline": "WanPipeline", "seed": SEED, "other": "not saved"},
    )
    digests = set()
    for i in range(4):
        save_latent_tensors(bundle, tmp_path / f"{i}.safetensors")
        digests.add(hashlib.sha256((tmp_path / f"{i}.safetensors").read_bytes()).hexdigest())
    assert len(digests) == 1
    with safe_open(str(tmp_path / "0.safetensors"), "pt") as f:
        assert set(f.keys()) == {"latents", "audio_latents"}
        meta = json.loads(f.metadata()["shotloom"])
    assert meta == {"family": "wan", "pipeline": "WanPipeline", "seed": SEED}


def test_ti2v_first_frame_equals_diffusers_i2v_pipeline_on_the_same_folder(checkpoints, frame):
    """Wan 2.2 TI2V-5B is one folder for text and image to video: with a first frame it runs as
    ``WanImageToVideoPipeline`` loaded from that folder (as diffusers' docs do), on the same weights."""
    from diffusers import WanImageToVideoPipeline

    ckpt = checkpoints["ti2v-5b"]
    adapter = WanAdapter.load(native_config(ckpt))
    assert adapter.capabilities.first_frame and not adapter.capabilities.last_frame
    req = request(first_frame=frame, fps=24)
    latents = adapter.denoise(adapter.encode(req), req).tensors["video"]
    pipe = WanImageToVideoPipeline.from_pretrained(str(ckpt), local_files_only=True)
    pipe.scheduler = type(pipe.scheduler).from_config(pipe.scheduler.config)
    reference = pipeline_latents(pipe, image=Image.open(frame).convert("RGB"))
    assert torch.equal(latents, reference)
    # and the text-only form of the same checkpoint still differs from it (the frame conditions)
    text_only = adapter.denoise(adapter.encode(request(fps=24)), request(fps=24)).tensors["video"]
    assert not torch.equal(text_only, latents)
