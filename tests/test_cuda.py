"""CUDA checks: what only a GPU can show (group-offload swap, measured peaks, admission from
``mem_get_info``, out-of-memory release and retry, residency ``auto`` choosing both ways).

Skipped without CUDA (CI has none). ``bench/gpu_check.sh`` runs them on a GPU machine against a
full-size, randomly initialised Wan 2.1 VACE 1.3B-shaped checkpoint it builds there
(``SHOTLOOM_GPU_CHECKPOINT``); without that variable they use the tiny checkpoint.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from shotloom.admission import Headroom, LiveProbe
from shotloom.config import InferenceConfig
from shotloom.request import GenerationRequest
from shotloom.runtime import ModelRuntime, is_out_of_memory

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
GIB = 2**30
SIZE = {"width": 480, "height": 832, "num_frames": 33} if os.environ.get("SHOTLOOM_GPU_CHECKPOINT") else {}


@pytest.fixture(scope="module")
def checkpoint(wan_checkpoint) -> Path:
    built = os.environ.get("SHOTLOOM_GPU_CHECKPOINT")
    return Path(built) if built else wan_checkpoint


def runtime(checkpoint: Path, tmp_path: Path, offload: bool) -> ModelRuntime:
    cfg = InferenceConfig.model_validate(
        {
            "family": "wan",
            "paths": {"checkpoint": str(checkpoint), "cache_dir": str(tmp_path / "cache")},
            "dtype": "bfloat16" if SIZE else "float32",
            "device": "cuda:0",
            "sampler": {"sigmas": [1.0, 0.75, 0.5, 0.25], "shift": 1.0},
            "defaults": {"width": 64, "height": 64, "num_frames": 17, "fps": 16},
            "offload": offload,
        }
    )
    return ModelRuntime(cfg, "cuda:0", headroom=Headroom(gpu_fraction=0.02, ram_fraction=0.05))


def request(seed: int = 1) -> GenerationRequest:
    base = {"width": 64, "height": 64, "num_frames": 17}
    return GenerationRequest(prompt="a lighthouse at dusk", fps=16, seed=seed, **{**base, **SIZE})


def generate_peak(rt: ModelRuntime, tmp_path: Path, name: str) -> tuple[int, dict]:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    result = rt.generate(request(), tmp_path / f"{name}.mp4")
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    rt.after_run()  # records the measured peak for residency 'auto'
    return peak, result.media


def free_all(rt: ModelRuntime) -> None:
    rt.release()
    torch.cuda.synchronize()


def test_admission_reads_live_free_memory_and_waits_while_it_is_taken(checkpoint, tmp_path):
    rt = runtime(checkpoint, tmp_path, offload=False)
    free, total = torch.cuda.mem_get_info()
    probed = LiveProbe("cuda:0").gpu()
    assert probed.total_bytes == total and abs(probed.free_bytes - free) < 256 * 2**20
    assert rt.admission_plan("resident").verdict == "admit"
    # Take all but a sliver of the free memory: the same job now waits, and fits again after.
    ballast = torch.empty(int(torch.cuda.mem_get_info()[0] - 0.5 * GIB), dtype=torch.uint8, device="cuda")
    plan = rt.admission_plan("resident")
    assert plan.verdict == "wait", plan.message
    del ballast
    torch.cuda.empty_cache()
    assert rt.admission_plan("resident").verdict == "admit"


def test_group_offload_swap_runs_with_a_lower_peak_and_the_peak_is_recorded(checkpoint, tmp_path):
    from shotloom.admission import load_measured_peak

    resident = runtime(checkpoint, tmp_path, offload=False)
    resident_peak, resident_media = generate_peak(resident, tmp_path, "resident")
    assert resident.weight_location() == "cuda"
    free_all(resident)
    swap = runtime(checkpoint, tmp_path, offload=True)
    swap_peak, swap_media = generate_peak(swap, tmp_path, "swap")
    assert swap.weight_location() != "cuda"  # the DiT's groups live on the CPU between uses
    assert swap_peak < resident_peak, (swap_peak, resident_peak)
    assert (swap_media["frames"], swap_media["width"]) == (resident_media["frames"], resident_media["width"])
    assert load_measured_peak(tmp_path / "cache", swap._peak_id()) is not None
    print(f"peak resident {resident_peak / GIB:.2f} GiB, swap {swap_peak / GIB:.2f} GiB")
    free_all(swap)


def test_out_of_memory_releases_every_weight_and_the_retry_succeeds(checkpoint, tmp_path):
    rt = runtime(checkpoint, tmp_path, offload=False)
    rt.adapter  # noqa: B018 - load
    cond, _ = rt.condition(request())
    loaded = torch.cuda.memory_allocated()
    ballast = torch.empty(int(torch.cuda.mem_get_info()[0] - 64 * 2**20), dtype=torch.uint8, device="cuda")
    with pytest.raises(Exception) as err:
        rt.denoise(cond, request())
    assert is_out_of_memory(err.value)
    del ballast
    rt.release()  # what the ops do on out of memory, before their one retry
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() < loaded / 2
    latents = rt.denoise(cond, request())  # the retry reloads and runs
    assert latents.tensors and rt.loads == 2
    free_all(rt)


def test_residency_auto_chooses_resident_when_it_fits_and_swap_when_it_does_not(checkpoint, tmp_path):
    rt = runtime(checkpoint, tmp_path, offload=False)
    assert rt.apply_residency("auto").mode == "resident"  # an empty GPU holds everything
    needs = {m: rt.admission_plan(m).to_json()["gpu"]["needed_gib"] for m in ("resident", "swap")}
    assert needs["swap"] < needs["resident"], needs
    # Leave room for the swap plan but not for the resident one.
    available = rt.admission_plan("resident").to_json()["gpu"]["available_gib"]
    target = (needs["swap"] + needs["resident"]) / 2
    ballast = torch.empty(int((available - target) * GIB), dtype=torch.uint8, device="cuda")
    crowded = runtime(checkpoint, tmp_path, offload=False)
    assert crowded.apply_residency("auto").mode == "swap", crowded.admission_plan("auto").message
    assert crowded.cfg.offload is True
    del ballast
    torch.cuda.empty_cache()
