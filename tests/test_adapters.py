"""LoRA adapters on the tiny Wan checkpoint: tiny random LoRAs in the diffusers on-disk format,
loaded once beside the base weights and switched per request without reloading anything."""

from __future__ import annotations

from dataclasses import replace

import diffusers
import pytest
import torch
from test_wan import make_config

from shotloom.capabilities import CapabilityError
from shotloom.families.weights import build_tiny_lora
from shotloom.runtime import ModelRuntime

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: one thread is fastest


@pytest.fixture(scope="module")
def runtime(wan_checkpoint, tmp_path_factory) -> ModelRuntime:
    root = tmp_path_factory.mktemp("loras")
    anime = build_tiny_lora(wan_checkpoint, root / "anime", seed=1)
    assert (anime / "pytorch_lora_weights.safetensors").is_file()  # what real adapters ship as
    cfg = make_config(
        wan_checkpoint,
        paths={"checkpoint": wan_checkpoint, "cache_dir": root / "cache"},
        adapters=[
            {"name": "anime", "path": anime},
            {"name": "noir", "path": root / "noir", "scale": 0.5},  # missing: built (tiny.build_if_missing)
        ],
        tiny={"build_if_missing": True, "seed": 0},
    )
    return ModelRuntime(cfg)


def test_switching_adapters_never_reloads_the_base_weights(runtime, monkeypatch):
    adapter = runtime.adapter  # loads the pipeline and both adapters once
    assert adapter.capabilities.adapters == ("anime", "noir") and adapter.adapter_loads == 2
    reads: list[str] = []
    for cls in (diffusers.DiffusionPipeline, diffusers.ModelMixin):
        original = cls.from_pretrained.__func__
        monkeypatch.setattr(
            cls,
            "from_pretrained",
            classmethod(lambda c, *a, _o=original, **k: reads.append(c.__name__) or _o(c, *a, **k)),
        )
    load_lora = adapter.pipe.load_lora_weights
    monkeypatch.setattr(
        adapter.pipe, "load_lora_weights", lambda *a, **k: reads.append("lora") or load_lora(*a, **k)
    )

    req = runtime.resolve("a red kite over the sea", seed=3)
    cond, _ = runtime.condition(req)

    def latents(**change):
        r = replace(req, **change)
        runtime.check(r)
        return runtime.denoise(cond, r).tensors["video"]

    base, anime, noir = latents(), latents(lora="anime"), latents(lora="noir")
    half = latents(lora="anime", lora_scale=0.5)
    assert not torch.equal(base, anime) and not torch.equal(anime, noir) and not torch.equal(anime, half)
    # Back and forth gives the same results: each switch is exact.
    assert torch.equal(latents(lora="anime"), anime) and torch.equal(latents(), base)
    assert torch.equal(latents(lora="noir", lora_scale=0.5), noir)  # its configured scale is 0.5
    assert reads == [] and runtime.loads == 1 and adapter.generator_loads == 0 and adapter.adapter_loads == 2


def test_an_adapter_not_configured_is_refused_naming_the_field(runtime):
    req = runtime.resolve("x", seed=1)
    for change, field in (({"lora": "pixar"}, "lora"), ({"lora_scale": 0.3}, "lora_scale")):
        with pytest.raises(CapabilityError) as info:
            runtime.check(replace(req, **change))
        assert info.value.field == field


def test_a_released_dit_comes_back_with_its_adapters(runtime):
    adapter = runtime.adapter
    req = runtime.resolve("a red kite over the sea", seed=3, lora="anime")
    cond, _ = runtime.condition(req)
    before = runtime.denoise(cond, req).tensors["video"]
    adapter.release_generator()
    after = runtime.denoise(cond, req).tensors["video"]
    assert adapter.generator_loads == 1 and adapter.adapter_loads == 4 and torch.equal(before, after)
