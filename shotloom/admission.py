"""Memory admission and weight tiering: the arithmetic a device worker runs before it claims a job.

Everything here is plain Python over byte counts. The only live inputs come through a
``MemoryProbe`` (``LiveProbe`` asks ``torch.cuda.mem_get_info`` and ``psutil``; ``FakeProbe`` is
set by hand, e.g. to simulate a CUDA device on a CPU-only machine). torch is imported lazily, only
by the functions that touch real tensors or CUDA.

The pieces, in the order a worker uses them:

1. ``Headroom`` - the share of each reported total that is never handed out (5% GPU, 10% RAM by
   default; ``SHOTLOOM_/ECHO_GPU_HEADROOM_FRACTION`` and ``..._RAM_HEADROOM_FRACTION`` override).
2. ``WeightFootprint`` - what the weights weigh and where they sit: ``checkpoint_footprint`` for a
   cold load (read from safetensors headers, no tensor is loaded), ``measured_footprint`` for a warm
   runtime (real tensor storage and device).
3. ``plan_residency`` - ``auto`` picks a fully resident DiT when live free VRAM holds the whole-device
   peak plus a device-relative reserve, else layerwise swap. The peak is the measured one
   (``load_measured_peak``) when a real CUDA run recorded it, else ``estimate_peak_bytes``.
4. ``requirement_for`` + ``admit`` - what the job must newly allocate, against what is free now
   (``wait``) and what the device could ever offer (``never``).
5. ``plan_tier`` - before a conditioning-cache miss or a decode: keep the generator on the GPU, stage
   it on CPU, or release it.

``plan_admission`` bundles 3-4 into an ``AdmissionPlan`` whose ``to_json()`` is what ``/health`` and
run tags expose as ``admission_plan``. All JSON figures come as GiB rounded to 3 decimals plus raw
bytes.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from hashlib import sha256
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from shotloom.config import env

GIB = 1024**3

Residency = Literal["auto", "resident", "swap"]
Mode = Literal["resident", "swap", "cpu"]
Location = Literal["cuda", "cpu", "released"]
Verdict = Literal["admit", "wait", "never"]
Tier = Literal["keep", "stage_on_cpu", "release"]

RESIDENCY_POLICIES: tuple[str, ...] = ("auto", "resident", "swap")
# Components streamed block by block under layerwise swap (``place_pipeline`` uses the same rule;
# Wan 2.2 also has ``transformer_2``).
GENERATOR_PREFIX = "transformer"


def gib(n: int | float | None, ndigits: int = 3) -> float | None:
    """Bytes -> GiB rounded to ``ndigits`` (None stays None)."""
    return None if n is None else round(n / GIB, ndigits)


def _fmt(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def _pct(fraction: float) -> str:
    return f"{fraction * 100:g}%"


def is_generator(component: str) -> bool:
    """True for the DiT component(s) that layerwise swap streams and tiering moves."""
    return component.startswith(GENERATOR_PREFIX)


# -- probes -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MemoryInfo:
    free_bytes: int
    total_bytes: int

    @property
    def free_gib(self) -> float:
        return gib(self.free_bytes)

    @property
    def total_gib(self) -> float:
        return gib(self.total_bytes)

    @classmethod
    def from_gib(cls, free: float, total: float) -> MemoryInfo:
        return cls(int(free * GIB), int(total * GIB))

    def to_json(self) -> dict[str, Any]:
        return {
            "free_gib": self.free_gib,
            "total_gib": self.total_gib,
            "free_bytes": self.free_bytes,
            "total_bytes": self.total_bytes,
        }


class MemoryProbe(Protocol):
    def gpu(self) -> MemoryInfo | None:
        """Free/total VRAM of the worker's device; None when the device is not CUDA."""
        ...

    def ram(self) -> MemoryInfo:
        """Available/total host memory."""
        ...


def _parse_device(device: str) -> tuple[str, int | None]:
    kind, _, index = str(device).partition(":")
    return kind, (int(index) if index else None)


class LiveProbe:
    """The real machine: ``torch.cuda.mem_get_info(index)`` and ``psutil.virtual_memory()``."""

    def __init__(self, device: str):
        self.device = str(device)
        self.kind, self.index = _parse_device(self.device)

    @property
    def is_cuda(self) -> bool:
        return self.kind == "cuda"

    def gpu(self) -> MemoryInfo | None:
        if not self.is_cuda:
            return None
        import torch

        index = self.index if self.index is not None else torch.cuda.current_device()
        free, total = torch.cuda.mem_get_info(index)
        return MemoryInfo(int(free), int(total))

    def ram(self) -> MemoryInfo:
        import psutil

        vm = psutil.virtual_memory()
        return MemoryInfo(int(vm.available), int(vm.total))

    def __repr__(self) -> str:
        return f"LiveProbe({self.device!r})"


@dataclass
class GroupProbe:
    """A device group's devices: a job fits when it fits on each (every rank holds the DiT and a
    part of the activations), so GPU memory is the least free of them; RAM is the host's."""

    probes: list[LiveProbe]

    @classmethod
    def of(cls, device: str, ranks: int) -> GroupProbe:
        kind, _ = _parse_device(str(device))
        if kind != "cuda":  # CPU ranks share the host's RAM: one probe says it
            return cls([LiveProbe(device)])
        return cls([LiveProbe(f"cuda:{i}") for i in range(ranks)])

    @property
    def device(self) -> str:
        return self.probes[0].device

    @property
    def is_cuda(self) -> bool:
        return self.probes[0].is_cuda

    def gpu(self) -> MemoryInfo | None:
        infos = [info for p in self.probes if (info := p.gpu()) is not None]
        return min(infos, key=lambda i: i.free_bytes) if infos else None

    def ram(self) -> MemoryInfo:
        return self.probes[0].ram()


@dataclass
class FakeProbe:
    """Hand-set memory figures (tests; simulating a CUDA device). ``gpu_info=None`` means a CPU device."""

    gpu_info: MemoryInfo | None = None
    ram_info: MemoryInfo = field(default_factory=lambda: MemoryInfo(64 * GIB, 128 * GIB))

    @classmethod
    def from_gib(
        cls,
        gpu_free: float | None = None,
        gpu_total: float | None = None,
        ram_free: float = 64.0,
        ram_total: float = 128.0,
    ) -> FakeProbe:
        gpu = None if gpu_total is None else MemoryInfo.from_gib(gpu_free or 0.0, gpu_total)
        return cls(gpu, MemoryInfo.from_gib(ram_free, ram_total))

    def gpu(self) -> MemoryInfo | None:
        return self.gpu_info

    def ram(self) -> MemoryInfo:
        return self.ram_info

    def set_gpu(self, free_bytes: int, total_bytes: int | None = None) -> None:
        if total_bytes is None:
            total_bytes = self.gpu_info.total_bytes if self.gpu_info else 0
        total = total_bytes
        self.gpu_info = MemoryInfo(int(free_bytes), int(total))

    def set_ram(self, free_bytes: int, total_bytes: int | None = None) -> None:
        total = total_bytes if total_bytes is not None else self.ram_info.total_bytes
        self.ram_info = MemoryInfo(int(free_bytes), int(total))


# -- headroom ---------------------------------------------------------------------------------------
_HEADROOM_ENV = (("gpu_fraction", "GPU_HEADROOM_FRACTION"), ("ram_fraction", "RAM_HEADROOM_FRACTION"))


class Headroom(BaseModel):
    """Share of each *reported total* that admission never hands out (device-relative, not fixed GiB)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu_fraction: float = Field(default=0.05, ge=0, lt=1)
    ram_fraction: float = Field(default=0.10, ge=0, lt=1)

    @classmethod
    def from_env(cls, base: Headroom | None = None) -> Headroom:
        """``base`` (default: the defaults) with ``SHOTLOOM_``/``ECHO_`` ``{GPU,RAM}_HEADROOM_FRACTION``."""
        base = base or cls()
        values = {"gpu_fraction": base.gpu_fraction, "ram_fraction": base.ram_fraction}
        for key, name in _HEADROOM_ENV:
            raw = env(name)
            if raw is None or raw.strip() == "":
                continue
            try:
                values[key] = float(raw)
            except ValueError:
                raise ValueError(f"{name}: expected a fraction in [0, 1), got {raw!r}") from None
        try:
            return cls(**values)
        except ValidationError as exc:
            raise ValueError(f"headroom from environment: {values} is invalid: {exc}") from None

    def gpu_bytes(self, total_bytes: int) -> int:
        return int(self.gpu_fraction * total_bytes)

    def ram_bytes(self, total_bytes: int) -> int:
        return int(self.ram_fraction * total_bytes)


# -- footprints -------------------------------------------------------------------------------------
@dataclass
class WeightFootprint:
    """Per-component weight bytes and where each component sits ("cuda" / "cpu" / "released")."""

    components: dict[str, int]
    location: dict[str, str]
    source: Literal["checkpoint", "measured"]

    @property
    def total_bytes(self) -> int:
        return sum(self.components.values())

    def bytes_at(self, where: str) -> int:
        return sum(b for name, b in self.components.items() if self.location.get(name) == where)

    @property
    def gpu_bytes(self) -> int:
        return self.bytes_at("cuda")

    @property
    def cpu_bytes(self) -> int:
        return self.bytes_at("cpu")

    @property
    def released_bytes(self) -> int:
        return self.bytes_at("released")

    @property
    def generator_bytes(self) -> int:
        return sum(b for name, b in self.components.items() if is_generator(name))

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "total_gib": gib(self.total_bytes),
            "gpu_gib": gib(self.gpu_bytes),
            "cpu_gib": gib(self.cpu_bytes),
            "total_bytes": self.total_bytes,
            "gpu_bytes": self.gpu_bytes,
            "cpu_bytes": self.cpu_bytes,
            "components": {
                name: {"gib": gib(b), "bytes": b, "location": self.location.get(name, "released")}
                for name, b in sorted(self.components.items())
            },
        }


# Safetensors dtype -> bits per element. F8/F4 families are quantised storage: kept as stored.
_ST_BITS = {
    "F64": 64, "F32": 32, "F16": 16, "BF16": 16,
    "F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8, "F6_E2M3": 6, "F6_E3M2": 6, "F4": 4,
    "I64": 64, "I32": 32, "I16": 16, "I8": 8, "U64": 64, "U32": 32, "U16": 16, "U8": 8, "BOOL": 8,
    "C64": 64, "C128": 128,
}  # fmt: skip
_CASTABLE = {"F64", "F32", "F16", "BF16"}  # floating dtypes ``from_pretrained(dtype=...)`` converts
_LOAD_BITS = {"float32": 32, "bfloat16": 16, "float16": 16, "float64": 64}
_OTHER_WEIGHTS = (".bin", ".pt", ".pth", ".ckpt", ".gguf")
_SHARD = re.compile(r"-\d+-of-\d+$")
_MAX_HEADER = 100 * 1024 * 1024


def read_safetensors_header(path: str | Path) -> dict[str, dict[str, Any]]:
    """Tensor name -> {"dtype", "shape", "data_offsets"} from the file header (no tensor data read)."""
    with open(path, "rb") as fh:
        raw = fh.read(8)
        if len(raw) != 8:
            raise ValueError(f"{path}: not a safetensors file (short header)")
        (n,) = struct.unpack("<Q", raw)
        if n <= 0 or n > _MAX_HEADER:
            raise ValueError(f"{path}: not a safetensors file (header length {n})")
        header = json.loads(fh.read(n))
    header.pop("__metadata__", None)
    return header


def _cast_to_fp8(tensor_name: str, skip: tuple[str, ...]) -> bool:
    """Whether layerwise casting stores this tensor in float8: a layer's weight or bias whose
    module name matches none of the skip patterns (as diffusers matches them, ``re.search``)."""
    module, _, leaf = tensor_name.rpartition(".")
    return leaf in ("weight", "bias") and not any(re.search(p, module) for p in skip)


def _tensor_bytes(dtype: str, shape: list[int], load_bits: int) -> int:
    if dtype not in _ST_BITS:
        raise ValueError(f"unknown safetensors dtype {dtype!r}")
    bits = load_bits if dtype in _CASTABLE else _ST_BITS[dtype]
    return math.ceil(math.prod(shape) * bits / 8)


def _variant(path: Path, suffix: str) -> str | None:
    stem = _SHARD.sub("", path.name[: -len(suffix)])
    return stem.split(".", 1)[1] if "." in stem else None


def _pick_files(files: list[Path], suffix: str) -> list[Path]:
    """The files ``from_pretrained`` (no variant) reads: non-variant ones, else one variant group."""
    groups: dict[str | None, list[Path]] = {}
    for f in files:
        groups.setdefault(_variant(f, suffix), []).append(f)
    if None in groups:
        return groups[None]
    return groups[sorted(groups)[0]] if groups else []


def checkpoint_footprint(
    checkpoint_dir: str | Path,
    dtype: str,
    *,
    component_dtypes: Mapping[str, str] | None = None,
    fp8_skip: Mapping[str, tuple[str, ...]] | None = None,
) -> WeightFootprint:
    """Cold-load estimate of a diffusers checkpoint folder, from file headers only.

    Each subfolder holding weights is a component. For ``*.safetensors`` the header gives every
    tensor's shape and stored dtype; floating tensors (F64/F32/F16/BF16) count at the load dtype
    (``dtype``, or ``component_dtypes[name]`` for components a family pins, e.g. Wan's float32 VAE),
    everything else - integers, F8/F4 quantised storage - at its stored size. Without safetensors the
    component falls back to the size of its ``.bin``/``.pt``/``.pth``/``.ckpt``/``.gguf`` files.
    Variant files (``model.fp16.safetensors``) are ignored when plain ones exist, as ``from_pretrained``
    without a variant does. Every component is ``released``.

    ``fp8_skip`` names components stored in float8 (``performance.fp8``), each with the module-name
    patterns diffusers' layerwise casting skips: their layers' floating ``weight``/``bias`` count one
    byte an element unless the module matches a pattern; everything else counts as above.
    """
    root = Path(checkpoint_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"checkpoint folder not found: {root}")
    overrides = dict(component_dtypes or {})
    for name, d in [("dtype", dtype), *overrides.items()]:
        if d not in _LOAD_BITS:
            raise ValueError(f"{name}: unknown load dtype {d!r}; known: {sorted(_LOAD_BITS)}")
    components: dict[str, int] = {}
    for sub in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        st = _pick_files(sorted(sub.rglob("*.safetensors")), ".safetensors")
        if st:
            load_bits = _LOAD_BITS[overrides.get(sub.name, dtype)]
            skip = (fp8_skip or {}).get(sub.name)
            total = 0
            for f in st:
                for name, meta in read_safetensors_header(f).items():
                    fp8 = skip is not None and meta["dtype"] in _CASTABLE and _cast_to_fp8(name, skip)
                    total += _tensor_bytes(meta["dtype"], meta["shape"], 8 if fp8 else load_bits)
            components[sub.name] = total
            continue
        other = [f for f in sorted(sub.rglob("*")) if f.is_file() and f.name.endswith(_OTHER_WEIGHTS)]
        if other:
            components[sub.name] = sum(f.stat().st_size for f in other)
    if not components:
        raise FileNotFoundError(f"{root}: no weight files in any component subfolder")
    return WeightFootprint(components, {name: "released" for name in components}, "checkpoint")


def measured_footprint(modules: Mapping[str, Any]) -> WeightFootprint:
    """A warm runtime's real tensor storage per component (params + buffers) and where it sits.

    Bytes are untyped-storage sizes, each storage counted once (tied weights, views and storages
    shared between components are deduplicated; a shared storage counts for the first component).
    Meta tensors count nothing. A component's location is the device type holding most of its bytes
    ("cuda" or "cpu"); a component with no storage at all is "released".
    """
    seen: set[tuple[str, int | None, int]] = set()
    components: dict[str, int] = {}
    location: dict[str, str] = {}
    for name, module in modules.items():
        per_device: dict[str, int] = {}
        tensors = list(module.parameters()) + list(module.buffers())
        for t in tensors:
            if t.device.type == "meta":
                continue
            storage = t.untyped_storage()
            key = (t.device.type, t.device.index, storage.data_ptr())
            if key in seen:
                continue
            seen.add(key)
            per_device[t.device.type] = per_device.get(t.device.type, 0) + int(storage.nbytes())
        components[name] = sum(per_device.values())
        if not per_device:
            location[name] = "released"
        else:
            kind = max(per_device, key=lambda k: per_device[k])
            location[name] = "cuda" if kind == "cuda" else "cpu"
    return WeightFootprint(components, location, "measured")


# -- peaks ------------------------------------------------------------------------------------------
def estimate_peak_bytes(footprint: WeightFootprint, activation_factor: float) -> int:
    """Whole-device peak of a resident run without a measurement: weights × (1 + activation_factor)."""
    if activation_factor < 0:
        raise ValueError("activation_factor must be >= 0")
    return int(footprint.total_bytes * (1.0 + activation_factor))


_PEAK_LOCK = threading.Lock()


def _peak_file(cache_dir: str | Path, checkpoint_id: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", checkpoint_id).strip("._")[:80] or "checkpoint"
    digest = sha256(checkpoint_id.encode()).hexdigest()[:12]
    return Path(cache_dir) / "peaks" / f"{safe}-{digest}.json"


def _read_peaks(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def load_measured_peak(cache_dir: str | Path, checkpoint_id: str, mode: str = "resident") -> int | None:
    """The largest peak recorded for ``checkpoint_id`` in ``mode`` (resident by default), or None."""
    peak = _read_peaks(_peak_file(cache_dir, checkpoint_id)).get("peaks", {}).get(mode)
    return int(peak) if isinstance(peak, int | float) and peak > 0 else None


def save_measured_peak(
    cache_dir: str | Path, checkpoint_id: str, peak_bytes: int, mode: str = "resident"
) -> int:
    """Record a measured peak (``torch.cuda.max_memory_allocated()``); keeps the max. Returns the max.

    Peaks are kept per ``mode``: a swap run's peak is far below a resident one and must not feed
    ``plan_residency(auto)``, which compares against the resident peak.
    """
    path = _peak_file(cache_dir, checkpoint_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _PEAK_LOCK:
        lock = open(path.with_suffix(".lock"), "a")  # noqa: SIM115 - held for the read-modify-write
        try:
            try:
                import fcntl

                fcntl.flock(lock, fcntl.LOCK_EX)
            except ImportError:  # pragma: no cover - non-POSIX
                pass
            data = _read_peaks(path)
            peaks = data.get("peaks") if isinstance(data.get("peaks"), dict) else {}
            best = max(int(peak_bytes), int(peaks.get(mode) or 0))
            peaks[mode] = best
            record = {"checkpoint_id": checkpoint_id, "peaks": peaks}
            fd, tmp = tempfile.mkstemp(prefix=".peak-", dir=path.parent)
            with os.fdopen(fd, "w") as fh:
                json.dump(record, fh, indent=1, sort_keys=True)
            os.replace(tmp, path)
        finally:
            lock.close()
    return best


def resolve_peak_bytes(
    cache_dir: str | Path | None,
    checkpoint_id: str,
    footprint: WeightFootprint,
    activation_factor: float,
) -> tuple[int, Literal["measured", "estimated"]]:
    """The measured resident peak when one is recorded, else ``estimate_peak_bytes``."""
    measured = load_measured_peak(cache_dir, checkpoint_id) if cache_dir is not None else None
    if measured is not None:
        return measured, "measured"
    return estimate_peak_bytes(footprint, activation_factor), "estimated"


# -- DiT residency ----------------------------------------------------------------------------------
@dataclass
class ResidencyPlan:
    policy: str
    mode: Mode
    free_gib: float | None
    required_gib: float | None
    reserve_gib: float | None
    reason: str
    peak_bytes: int = 0
    free_bytes: int | None = None
    required_bytes: int | None = None
    reserve_bytes: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "mode": self.mode,
            "free_gib": self.free_gib,
            "required_gib": self.required_gib,
            "reserve_gib": self.reserve_gib,
            "peak_gib": gib(self.peak_bytes),
            "free_bytes": self.free_bytes,
            "required_bytes": self.required_bytes,
            "reserve_bytes": self.reserve_bytes,
            "peak_bytes": self.peak_bytes,
            "reason": self.reason,
        }


def plan_residency(
    policy: str, gpu: MemoryInfo | None, peak_bytes: int, reserve_fraction: float
) -> ResidencyPlan:
    """Resolve ``auto``/``resident``/``swap`` against live VRAM.

    CPU device (``gpu is None``): mode "cpu". ``resident``/``swap`` force that mode. ``auto``:
    resident when free VRAM >= peak + reserve, reserve = ``reserve_fraction`` × the GPU's total.
    """
    if policy not in RESIDENCY_POLICIES:
        raise ValueError(f"dit_residency: unknown policy {policy!r}; known: {list(RESIDENCY_POLICIES)}")
    if not 0 <= reserve_fraction < 1:
        raise ValueError("reserve_fraction must be in [0, 1)")
    if gpu is None:
        return ResidencyPlan(
            policy, "cpu", None, None, None, "device is not CUDA: weights stay in host RAM", int(peak_bytes)
        )
    reserve = int(reserve_fraction * gpu.total_bytes)
    required = int(peak_bytes) + reserve
    fits = gpu.free_bytes >= required
    figures = f"free {_fmt(gpu.free_bytes)} vs peak {_fmt(peak_bytes)} + reserve {_fmt(reserve)}"
    if policy == "auto":
        mode: Mode = "resident" if fits else "swap"
        reason = f"auto: {figures} -> {'fits, fully resident' if fits else 'does not fit, layerwise swap'}"
    else:
        mode = policy  # type: ignore[assignment]
        note = "" if policy == "swap" or fits else " (does not fit: may run out of memory)"
        reason = f"forced {policy}: {figures}{note}"
    return ResidencyPlan(
        policy=policy,
        mode=mode,
        free_gib=gib(gpu.free_bytes),
        required_gib=gib(required),
        reserve_gib=gib(reserve),
        reason=reason,
        peak_bytes=int(peak_bytes),
        free_bytes=gpu.free_bytes,
        required_bytes=required,
        reserve_bytes=reserve,
    )


# -- admission --------------------------------------------------------------------------------------
@dataclass
class Requirement:
    """Bytes a job must newly allocate on each side (what is already in place counts 0)."""

    gpu_bytes: int
    ram_bytes: int
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {
            "gpu_gib": gib(self.gpu_bytes),
            "ram_gib": gib(self.ram_bytes),
            "gpu_bytes": self.gpu_bytes,
            "ram_bytes": self.ram_bytes,
            "reason": self.reason,
        }


def requirement_for(
    footprint: WeightFootprint,
    mode: str,
    device_is_cuda: bool,
    activation_bytes: int,
    *,
    swap_fraction: float = 0.1,
    staging: Literal["all", "largest"] = "all",
) -> Requirement:
    """What a job must newly allocate, given where the weights sit now and where they will run.

    * ``cpu`` (or a non-CUDA device): RAM = every component not already on CPU + activations.
    * ``resident``: GPU = every component not already on CUDA + activations.
      RAM = staging for the ``released`` ones: with ``staging="all"`` (default, what
      ``DiffusionPipeline.from_pretrained`` followed by ``place_pipeline`` does) all of them sit in
      host RAM before the move; ``"largest"`` for a loader that stages one component at a time.
    * ``swap``: the generator (``transformer*``) lives in RAM and streams block groups to the GPU;
      the other components go to the GPU as in resident.
      GPU = non-generator components not on CUDA + ``swap_fraction`` × the largest generator
      component (active + prefetched block groups) + activations.
      RAM = generator components not already on CPU + staging of the released non-generator ones.
    """
    if activation_bytes < 0:
        raise ValueError("activation_bytes must be >= 0")
    if mode not in ("resident", "swap", "cpu"):
        raise ValueError(f"mode must be resident, swap or cpu; got {mode!r}")
    comps, loc = footprint.components, footprint.location
    where = {name: loc.get(name, "released") for name in comps}
    act = int(activation_bytes)

    def stage(names: list[str]) -> int:
        released = [comps[n] for n in names if where[n] == "released"]
        if not released:
            return 0
        return sum(released) if staging == "all" else max(released)

    if mode == "cpu" or not device_is_cuda:
        ram = sum(b for n, b in comps.items() if where[n] != "cpu") + act
        return Requirement(0, ram, f"cpu: weights not yet in RAM + activations {_fmt(act)}")
    if mode == "resident":
        gpu = sum(b for n, b in comps.items() if where[n] != "cuda") + act
        ram = stage(list(comps))
        return Requirement(
            gpu, ram, f"resident: weights not yet on GPU + activations {_fmt(act)}; RAM stages cold weights"
        )
    gen = [n for n in comps if is_generator(n)]
    rest = [n for n in comps if not is_generator(n)]
    window = int(swap_fraction * max((comps[n] for n in gen), default=0))
    gpu = sum(comps[n] for n in rest if where[n] != "cuda") + window + act
    ram = sum(comps[n] for n in gen if where[n] != "cpu") + stage(rest)
    return Requirement(
        gpu,
        ram,
        f"swap: DiT in RAM, {_pct(swap_fraction)} block window {_fmt(window)} + other weights + "
        f"activations {_fmt(act)} on GPU",
    )


@dataclass
class MemoryCheck:
    """One side (GPU or RAM) of an admission decision."""

    side: Literal["GPU", "RAM"]
    needed_bytes: int
    free_bytes: int
    total_bytes: int
    headroom_fraction: float
    headroom_bytes: int

    @property
    def available_bytes(self) -> int:
        """Free now, minus headroom (never below 0)."""
        return max(0, self.free_bytes - self.headroom_bytes)

    @property
    def capacity_bytes(self) -> int:
        """The most this side could ever offer: total minus headroom."""
        return max(0, self.total_bytes - self.headroom_bytes)

    @property
    def verdict(self) -> Verdict:
        if self.needed_bytes > self.capacity_bytes:
            return "never"
        if self.needed_bytes > self.available_bytes:
            return "wait"
        return "admit"

    def describe(self) -> str:
        if self.verdict == "never":
            return (
                f"needs {_fmt(self.needed_bytes)} {self.side}, {_fmt(self.capacity_bytes)} capacity "
                f"(headroom {_pct(self.headroom_fraction)})"
            )
        return (
            f"needs {_fmt(self.needed_bytes)} {self.side}, {_fmt(self.available_bytes)} available "
            f"(headroom {_pct(self.headroom_fraction)})"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "needed_gib": gib(self.needed_bytes),
            "available_gib": gib(self.available_bytes),
            "capacity_gib": gib(self.capacity_bytes),
            "free_gib": gib(self.free_bytes),
            "total_gib": gib(self.total_bytes),
            "headroom_gib": gib(self.headroom_bytes),
            "headroom_fraction": self.headroom_fraction,
            "needed_bytes": self.needed_bytes,
            "available_bytes": self.available_bytes,
            "capacity_bytes": self.capacity_bytes,
            "free_bytes": self.free_bytes,
            "total_bytes": self.total_bytes,
            "headroom_bytes": self.headroom_bytes,
        }


_OUTCOME = {
    "admit": "admitted",
    "wait": "waiting for memory",
    "never": "can never fit on this machine",
}


@dataclass
class AdmissionDecision:
    verdict: Verdict
    message: str
    gpu: MemoryCheck | None
    ram: MemoryCheck
    reason: str = ""

    @property
    def admitted(self) -> bool:
        return self.verdict == "admit"

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "message": self.message,
            "reason": self.reason,
            "gpu": self.gpu.to_json() if self.gpu is not None else None,
            "ram": self.ram.to_json(),
        }


def admit(req: Requirement, probe: MemoryProbe, headroom: Headroom) -> AdmissionDecision:
    """``never`` if the requirement exceeds total − headroom on either side, ``wait`` if it exceeds
    free − headroom, else ``admit``. The message states needed and available GiB per side."""
    ram_info = probe.ram()
    ram = MemoryCheck(
        "RAM",
        int(req.ram_bytes),
        ram_info.free_bytes,
        ram_info.total_bytes,
        headroom.ram_fraction,
        headroom.ram_bytes(ram_info.total_bytes),
    )
    gpu_info = probe.gpu()
    gpu: MemoryCheck | None = None
    if gpu_info is not None:
        gpu = MemoryCheck(
            "GPU",
            int(req.gpu_bytes),
            gpu_info.free_bytes,
            gpu_info.total_bytes,
            headroom.gpu_fraction,
            headroom.gpu_bytes(gpu_info.total_bytes),
        )
    elif req.gpu_bytes > 0:  # needs VRAM on a device that has none
        gpu = MemoryCheck("GPU", int(req.gpu_bytes), 0, 0, headroom.gpu_fraction, 0)
    checks = [c for c in (gpu, ram) if c is not None]
    verdicts = {c.verdict for c in checks}
    verdict: Verdict = "never" if "never" in verdicts else "wait" if "wait" in verdicts else "admit"
    message = "; ".join(c.describe() for c in checks) + f" — {_OUTCOME[verdict]}"
    return AdmissionDecision(verdict, message, gpu, ram, req.reason)


# -- tiering ----------------------------------------------------------------------------------------
def plan_tier(stack_bytes: int, generator_bytes: int, probe: MemoryProbe, headroom: Headroom) -> Tier:
    """Where the generator goes before loading a stack (conditioning encoders on a cache miss, or the
    VAE + its decode activations).

    Assumes the generator currently sits on the worker's device, so live free memory already
    excludes it. CUDA: ``keep`` when the stack fits in free VRAM − headroom beside it; else
    ``stage_on_cpu`` when free RAM − headroom holds the generator; else ``release``.
    CPU device (``probe.gpu()`` is None): the generator already lives in RAM, so ``keep`` when
    free RAM − headroom holds the stack beside it, else ``release``.
    """
    ram = probe.ram()
    ram_available = ram.free_bytes - headroom.ram_bytes(ram.total_bytes)
    gpu = probe.gpu()
    if gpu is None:
        return "keep" if stack_bytes <= ram_available else "release"
    if stack_bytes <= gpu.free_bytes - headroom.gpu_bytes(gpu.total_bytes):
        return "keep"
    if generator_bytes <= ram_available:
        return "stage_on_cpu"
    return "release"


# -- bundle -----------------------------------------------------------------------------------------
@dataclass
class AdmissionPlan:
    footprint: WeightFootprint
    residency: ResidencyPlan
    decision: AdmissionDecision
    requirement: Requirement | None = None

    @property
    def verdict(self) -> Verdict:
        return self.decision.verdict

    @property
    def message(self) -> str:
        """Needed vs available (or capacity) GiB per side, and the outcome."""
        return self.decision.message

    def to_json(self) -> dict[str, Any]:
        """Stable keys: verdict, message, gpu, ram, dit_residency, weights (+ requirement)."""
        decision = self.decision.to_json()
        return {
            "verdict": decision["verdict"],
            "message": decision["message"],
            "gpu": decision["gpu"],
            "ram": decision["ram"],
            "dit_residency": self.residency.to_json(),
            "weights": self.footprint.to_json(),
            "requirement": self.requirement.to_json() if self.requirement is not None else None,
        }


def plan_admission(
    footprint: WeightFootprint,
    probe: MemoryProbe,
    headroom: Headroom,
    *,
    policy: str = "auto",
    peak_bytes: int,
    reserve_fraction: float | None = None,
    swap_fraction: float = 0.1,
    staging: Literal["all", "largest"] = "all",
) -> AdmissionPlan:
    """Residency, requirement and admission in one go.

    ``peak_bytes`` is the whole-device resident peak (weights + activations; see
    ``resolve_peak_bytes``), so activations = peak − weight total. ``reserve_fraction`` defaults to
    the GPU headroom fraction.
    """
    gpu = probe.gpu()
    reserve = headroom.gpu_fraction if reserve_fraction is None else reserve_fraction
    residency = plan_residency(policy, gpu, peak_bytes, reserve)
    activations = max(0, int(peak_bytes) - footprint.total_bytes)
    req = requirement_for(
        footprint, residency.mode, gpu is not None, activations, swap_fraction=swap_fraction, staging=staging
    )
    return AdmissionPlan(footprint, residency, admit(req, probe, headroom), req)
