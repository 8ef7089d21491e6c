"""Memory admission and weight tiering: fake-probe CUDA cases, real checkpoint/footprint agreement."""

from __future__ import annotations

import json

import pytest

from shotloom.admission import (
    GIB,
    FakeProbe,
    Headroom,
    LiveProbe,
    MemoryInfo,
    Requirement,
    WeightFootprint,
    admit,
    checkpoint_footprint,
    estimate_peak_bytes,
    load_measured_peak,
    measured_footprint,
    plan_admission,
    plan_residency,
    plan_tier,
    read_safetensors_header,
    requirement_for,
    resolve_peak_bytes,
    save_measured_peak,
)

from conftest import write_inference_yaml

H100 = 80.0  # GiB


def gpu_probe(gpu_free: float, gpu_total: float = H100, ram_free: float = 200.0, ram_total: float = 256.0):
    return FakeProbe.from_gib(gpu_free, gpu_total, ram_free, ram_total)


# -- admission ----------------------------------------------------------------------------------
def test_admit_with_exact_figures():
    probe = gpu_probe(gpu_free=60.0)
    decision = admit(Requirement(30 * GIB, 10 * GIB, "cold resident"), probe, Headroom())
    # GPU: 60 free - 5% of 80 = 56; RAM: 200 free - 10% of 256 = 174.4
    assert decision.verdict == "admit"
    assert decision.gpu.available_bytes == 56 * GIB
    assert decision.message == (
        "needs 30.0 GiB GPU, 56.0 GiB available (headroom 5%); "
        "needs 10.0 GiB RAM, 174.4 GiB available (headroom 10%) — admitted"
    )


def test_wait_when_gpu_is_occupied_then_admit_when_it_frees():
    probe = gpu_probe(gpu_free=26.4)
    req = Requirement(30 * GIB, 1 * GIB, "cold resident")
    decision = admit(req, probe, Headroom())
    assert decision.verdict == "wait"
    assert decision.message.startswith("needs 30.0 GiB GPU, 22.4 GiB available (headroom 5%);")
    assert decision.message.endswith("— waiting for memory")
    data = decision.to_json()
    assert data["gpu"]["needed_gib"] == 30.0 and data["gpu"]["available_gib"] == pytest.approx(22.4, abs=1e-3)
    assert data["gpu"]["capacity_gib"] == 76.0 and data["gpu"]["verdict"] == "wait"
    assert data["ram"]["verdict"] == "admit"

    probe.set_gpu(40 * GIB)  # another job finished
    assert admit(req, probe, Headroom()).verdict == "admit"


def test_wait_on_ram_alone():
    probe = gpu_probe(gpu_free=70.0, ram_free=30.0, ram_total=128.0)
    decision = admit(Requirement(10 * GIB, 40 * GIB, "swap"), probe, Headroom())
    assert decision.verdict == "wait"
    assert "needs 40.0 GiB RAM, 17.2 GiB available (headroom 10%)" in decision.message


def test_never_when_requirement_exceeds_capacity():
    probe = gpu_probe(gpu_free=80.0)  # an empty device still cannot hold it
    decision = admit(Requirement(77 * GIB, 0, "cold resident"), probe, Headroom())
    assert decision.verdict == "never"
    assert decision.message.startswith("needs 77.0 GiB GPU, 76.0 GiB capacity (headroom 5%);")
    assert decision.message.endswith("— can never fit on this machine")
    # RAM side too: 256 GiB total - 10% = 230.4 GiB capacity
    ram_never = admit(Requirement(1 * GIB, 231 * GIB, "cpu"), gpu_probe(gpu_free=80.0), Headroom())
    assert ram_never.verdict == "never"
    assert "needs 231.0 GiB RAM, 230.4 GiB capacity (headroom 10%)" in ram_never.message


def test_cpu_device_admission_checks_ram_only():
    probe = FakeProbe.from_gib(ram_free=20.0, ram_total=32.0)
    decision = admit(Requirement(0, 10 * GIB, "cpu"), probe, Headroom())
    assert decision.verdict == "admit" and decision.gpu is None
    assert decision.message == "needs 10.0 GiB RAM, 16.8 GiB available (headroom 10%) — admitted"
    assert decision.to_json()["gpu"] is None
    # Asking for VRAM on a device without any can never be satisfied.
    assert admit(Requirement(1 * GIB, 0, "x"), probe, Headroom()).verdict == "never"


# -- headroom -----------------------------------------------------------------------------------
def test_headroom_env_overrides(monkeypatch):
    for var in ("SHOTLOOM_GPU_HEADROOM_FRACTION", "ECHO_GPU_HEADROOM_FRACTION",
                "SHOTLOOM_RAM_HEADROOM_FRACTION", "ECHO_RAM_HEADROOM_FRACTION"):  # fmt: skip
        monkeypatch.delenv(var, raising=False)
    assert Headroom.from_env() == Headroom(gpu_fraction=0.05, ram_fraction=0.10)

    monkeypatch.setenv("ECHO_GPU_HEADROOM_FRACTION", "0.2")
    monkeypatch.setenv("SHOTLOOM_RAM_HEADROOM_FRACTION", "0.25")
    headroom = Headroom.from_env()
    assert (headroom.gpu_fraction, headroom.ram_fraction) == (0.2, 0.25)
    decision = admit(Requirement(60 * GIB, 0, "x"), gpu_probe(gpu_free=80.0), headroom)
    assert decision.verdict == "admit" and decision.gpu.headroom_bytes == 16 * GIB
    assert "64.0 GiB available (headroom 20%)" in decision.message
    assert admit(Requirement(65 * GIB, 0, "x"), gpu_probe(gpu_free=80.0), headroom).verdict == "never"

    monkeypatch.setenv("SHOTLOOM_GPU_HEADROOM_FRACTION", "0.01")  # SHOTLOOM_ wins over ECHO_
    assert Headroom.from_env().gpu_fraction == 0.01
    # A base config keeps its values where no variable is set.
    monkeypatch.delenv("SHOTLOOM_RAM_HEADROOM_FRACTION")
    assert Headroom.from_env(Headroom(ram_fraction=0.3)).ram_fraction == 0.3

    monkeypatch.setenv("SHOTLOOM_GPU_HEADROOM_FRACTION", "1.5")
    with pytest.raises(ValueError):
        Headroom.from_env()
    monkeypatch.setenv("SHOTLOOM_GPU_HEADROOM_FRACTION", "lots")
    with pytest.raises(ValueError, match="GPU_HEADROOM_FRACTION"):
        Headroom.from_env()


# -- residency ----------------------------------------------------------------------------------
def test_auto_residency_resident_on_big_free_gpu_and_swap_on_small_or_occupied():
    peak = 40 * GIB
    big = plan_residency("auto", MemoryInfo.from_gib(130.0, 140.0), peak, 0.05)
    assert big.mode == "resident"
    assert big.reserve_gib == 7.0 and big.required_gib == 47.0 and big.free_gib == 130.0
    assert "fits" in big.reason

    small = plan_residency("auto", MemoryInfo.from_gib(31.0, 32.0), peak, 0.05)
    assert small.mode == "swap" and small.required_gib == 41.6

    occupied = plan_residency("auto", MemoryInfo.from_gib(45.0, 140.0), peak, 0.05)  # 45 < 40 + 7
    assert occupied.mode == "swap"
    assert occupied.to_json()["required_bytes"] == peak + int(0.05 * 140 * GIB)


def test_forced_and_cpu_residency():
    small = MemoryInfo.from_gib(10.0, 32.0)
    forced = plan_residency("resident", small, 40 * GIB, 0.05)
    assert forced.mode == "resident" and "may run out of memory" in forced.reason
    assert plan_residency("swap", MemoryInfo.from_gib(130.0, 140.0), 40 * GIB, 0.05).mode == "swap"
    cpu = plan_residency("auto", None, 40 * GIB, 0.05)
    assert cpu.mode == "cpu" and cpu.free_gib is None
    assert plan_residency("resident", None, 1, 0.05).mode == "cpu"
    with pytest.raises(ValueError, match="dit_residency"):
        plan_residency("sometimes", small, 1, 0.05)


def test_measured_peak_round_trip_keeps_max(tmp_path):
    ckpt = "checkpoints/wan 2.1/fp4"
    assert load_measured_peak(tmp_path, ckpt) is None
    assert save_measured_peak(tmp_path, ckpt, 20 * GIB) == 20 * GIB
    assert save_measured_peak(tmp_path, ckpt, 15 * GIB) == 20 * GIB  # lower run does not shrink it
    assert load_measured_peak(tmp_path, ckpt) == 20 * GIB
    save_measured_peak(tmp_path, ckpt, 25 * GIB)
    assert load_measured_peak(tmp_path, ckpt) == 25 * GIB
    # Swap peaks are kept apart: they must not lower the resident figure auto compares against.
    save_measured_peak(tmp_path, ckpt, 9 * GIB, mode="swap")
    assert load_measured_peak(tmp_path, ckpt) == 25 * GIB
    assert load_measured_peak(tmp_path, ckpt, mode="swap") == 9 * GIB
    assert load_measured_peak(tmp_path, "other") is None
    (files,) = [list((tmp_path / "peaks").glob("*.json"))]
    assert len(files) == 1 and json.loads(files[0].read_text())["checkpoint_id"] == ckpt

    fp = WeightFootprint({"transformer": 10 * GIB}, {"transformer": "released"}, "checkpoint")
    assert estimate_peak_bytes(fp, 0.5) == 15 * GIB
    assert resolve_peak_bytes(tmp_path, ckpt, fp, 0.5) == (25 * GIB, "measured")
    assert resolve_peak_bytes(tmp_path, "other", fp, 0.5) == (15 * GIB, "estimated")


# -- requirements -------------------------------------------------------------------------------
def _fp(location: dict[str, str]) -> WeightFootprint:
    comps = {"transformer": 20 * GIB, "text_encoder": 8 * GIB, "vae": 1 * GIB}
    return WeightFootprint(comps, location, "checkpoint")


def test_requirement_cold_and_warm():
    cold = _fp({n: "released" for n in ("transformer", "text_encoder", "vae")})
    res = requirement_for(cold, "resident", True, 4 * GIB)
    assert (res.gpu_bytes, res.ram_bytes) == (33 * GIB, 29 * GIB)
    assert requirement_for(cold, "resident", True, 4 * GIB, staging="largest").ram_bytes == 20 * GIB
    swap = requirement_for(cold, "swap", True, 4 * GIB, swap_fraction=0.1)
    assert (swap.gpu_bytes, swap.ram_bytes) == (8 * GIB + 1 * GIB + 2 * GIB + 4 * GIB, 20 * GIB + 9 * GIB)
    cpu = requirement_for(cold, "cpu", False, 4 * GIB)
    assert (cpu.gpu_bytes, cpu.ram_bytes) == (0, 33 * GIB)

    # Warm: the DiT and VAE already sit on the GPU, the text encoder was staged on CPU.
    warm = _fp({"transformer": "cuda", "text_encoder": "cpu", "vae": "cuda"})
    res = requirement_for(warm, "resident", True, 4 * GIB)
    assert (res.gpu_bytes, res.ram_bytes) == (8 * GIB + 4 * GIB, 0)
    all_on_gpu = _fp({"transformer": "cuda", "text_encoder": "cuda", "vae": "cuda"})
    assert requirement_for(all_on_gpu, "resident", True, 4 * GIB).gpu_bytes == 4 * GIB


def test_plan_admission_bundle_json():
    cold = _fp({n: "released" for n in ("transformer", "text_encoder", "vae")})
    probe = gpu_probe(gpu_free=130.0, gpu_total=140.0)
    plan = plan_admission(cold, probe, Headroom(), policy="auto", peak_bytes=40 * GIB)
    data = json.loads(json.dumps(plan.to_json()))
    assert {"verdict", "message", "gpu", "ram", "dit_residency", "weights"} <= set(data)
    assert data["verdict"] == "admit" and data["dit_residency"]["mode"] == "resident"
    assert data["gpu"]["needed_gib"] == 40.0  # 29 GiB weights + 11 GiB activations (peak - weights)
    transformer = data["weights"]["components"]["transformer"]
    assert transformer == {"gib": 20.0, "bytes": 20 * GIB, "location": "released"}

    occupied = gpu_probe(gpu_free=30.0, gpu_total=140.0)
    plan = plan_admission(cold, occupied, Headroom(), policy="auto", peak_bytes=40 * GIB)
    assert plan.residency.mode == "swap"
    # swap on GPU: text encoder 8 + vae 1 + 10% of the 20 GiB DiT + 11 activations = 22 GiB
    assert plan.requirement.gpu_bytes == 22 * GIB and plan.verdict == "admit"


# -- tiering ------------------------------------------------------------------------------------
def test_plan_tier_three_outcomes():
    stack, generator = 10 * GIB, 30 * GIB
    assert plan_tier(stack, generator, gpu_probe(gpu_free=20.0), Headroom()) == "keep"
    # 12 GiB free - 4 GiB headroom = 8 < 10: move the generator to RAM (200 - 25.6 free)
    assert plan_tier(stack, generator, gpu_probe(gpu_free=12.0), Headroom()) == "stage_on_cpu"
    assert plan_tier(stack, generator, gpu_probe(gpu_free=12.0, ram_free=40.0), Headroom()) == "release"
    # CPU device: keep while RAM holds the stack beside the generator, else release.
    cpu_roomy = FakeProbe.from_gib(ram_free=20.0, ram_total=32.0)
    cpu_tight = FakeProbe.from_gib(ram_free=12.0, ram_total=32.0)
    assert plan_tier(stack, generator, cpu_roomy, Headroom()) == "keep"  # 20 - 3.2 >= 10
    assert plan_tier(stack, generator, cpu_tight, Headroom()) == "release"  # 12 - 3.2 < 10


# -- live probe ---------------------------------------------------------------------------------
def test_live_probe_on_cpu_device():
    probe = LiveProbe("cpu:0")
    assert probe.gpu() is None
    ram = probe.ram()
    assert 256 * 1024**2 < ram.total_bytes < 64 * 1024 * GIB
    assert 0 < ram.free_bytes <= ram.total_bytes


# -- footprints on the real tiny Wan checkpoint -------------------------------------------------
def test_checkpoint_footprint_reads_headers(wan_checkpoint):
    fp32 = checkpoint_footprint(wan_checkpoint, "float32")
    assert set(fp32.components) == {"transformer", "text_encoder", "vae"}
    assert set(fp32.location.values()) == {"released"}
    # float32 storage: header numel x 4 equals the data section of each file
    for name, filename in (("transformer", "diffusion_pytorch_model"), ("text_encoder", "model")):
        path = wan_checkpoint / name / f"{filename}.safetensors"
        header = read_safetensors_header(path)
        data_bytes = max(meta["data_offsets"][1] for meta in header.values())
        assert fp32.components[name] == data_bytes
    bf16 = checkpoint_footprint(wan_checkpoint, "bfloat16")
    assert bf16.components == {name: b // 2 for name, b in fp32.components.items()}
    assert bf16.total_bytes * 2 == fp32.total_bytes


def test_checkpoint_footprint_fallbacks(tmp_path):
    (tmp_path / "transformer").mkdir()
    (tmp_path / "transformer" / "diffusion_pytorch_model.bin").write_bytes(b"\0" * 1000)
    (tmp_path / "tokenizer").mkdir()
    (tmp_path / "tokenizer" / "tokenizer.json").write_text("{}")
    fp = checkpoint_footprint(tmp_path, "bfloat16")
    assert fp.components == {"transformer": 1000}
    with pytest.raises(FileNotFoundError):
        checkpoint_footprint(tmp_path / "tokenizer", "float32")


def _load(tmp_path, wan_checkpoint, dtype: str):
    from shotloom.config import load_inference_config
    from shotloom.families import adapter_class

    cfg_path = write_inference_yaml(
        tmp_path / f"inference-{dtype}.yaml", "wan", wan_checkpoint, tmp_path / "cache", dtype=dtype
    )
    return adapter_class("wan").load(load_inference_config(cfg_path))


def test_checkpoint_footprint_matches_loaded_model(tmp_path, wan_checkpoint):
    adapter = _load(tmp_path, wan_checkpoint, "float32")
    measured = measured_footprint(adapter.modules())
    cold = checkpoint_footprint(wan_checkpoint, "float32")
    assert measured.source == "measured" and set(measured.location.values()) == {"cpu"}
    assert set(measured.components) == set(cold.components)
    for name, b in cold.components.items():  # only non-persistent buffers (rope tables) differ
        assert measured.components[name] == pytest.approx(b, rel=0.03), name
    # Tied UMT5 embeddings are one storage, as in the file: counted once.
    assert measured.components["text_encoder"] == cold.components["text_encoder"]
    assert measured.total_bytes == pytest.approx(adapter.tensor_bytes(), rel=0.01)

    # Warm on CPU: nothing to load, only activations are new.
    req = requirement_for(measured, "cpu", False, 1234)
    assert (req.gpu_bytes, req.ram_bytes) == (0, 1234)
    # As if the same runtime were resident on CUDA: its components cost no extra GPU bytes.
    on_gpu = WeightFootprint(measured.components, {n: "cuda" for n in measured.components}, "measured")
    assert requirement_for(on_gpu, "resident", True, 1234).gpu_bytes == 1234
    assert requirement_for(measured, "resident", True, 1234).gpu_bytes == measured.total_bytes + 1234


def test_bfloat16_footprint_matches_loaded_model(tmp_path, wan_checkpoint):
    adapter = _load(tmp_path, wan_checkpoint, "bfloat16")
    measured = measured_footprint(adapter.modules())
    cold = checkpoint_footprint(wan_checkpoint, "bfloat16", component_dtypes={"vae": "float32"})
    fp32 = checkpoint_footprint(wan_checkpoint, "float32")
    assert cold.components["vae"] == fp32.components["vae"]  # Wan pins its VAE to float32
    assert measured.components["text_encoder"] == cold.components["text_encoder"]
    assert measured.total_bytes == pytest.approx(cold.total_bytes, rel=0.05)
    assert measured.total_bytes < 0.75 * fp32.total_bytes


def test_checkpoint_footprint_dtypes_and_variants(tmp_path):
    import torch
    from safetensors.torch import save_file

    (tmp_path / "transformer").mkdir()
    tensors = {
        "w": torch.zeros(10, 10, dtype=torch.float16),  # floating: loads at the config dtype
        "q": torch.zeros(100, dtype=torch.float8_e4m3fn),  # quantised storage: kept at 1 byte
        "ids": torch.zeros(5, dtype=torch.int64),  # integer: kept
    }
    save_file(tensors, tmp_path / "transformer" / "diffusion_pytorch_model.safetensors")
    # A variant beside the plain file is not what from_pretrained (no variant) reads.
    save_file({"w": torch.zeros(1000)}, tmp_path / "transformer" / "diffusion_pytorch_model.fp16.safetensors")
    fp = checkpoint_footprint(tmp_path, "float32")
    assert fp.components == {"transformer": 100 * 4 + 100 + 5 * 8}
    assert checkpoint_footprint(tmp_path, "bfloat16").components == {"transformer": 100 * 2 + 100 + 5 * 8}
    with pytest.raises(ValueError, match="dtype"):
        checkpoint_footprint(tmp_path, "int8")
