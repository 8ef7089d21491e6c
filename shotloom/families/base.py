"""The adapter interface every model family implements.

A generation is four stages, each a Dagster op in the service and a plain call in
``inference.py``: ``encode`` (text/image/audio -> TensorBundle), ``denoise``
(bundle -> latents TensorBundle), ``decode`` (latents -> frames + audio) and the
writer (``shotloom.media``). Stages exchange only TensorBundles and DecodedMedia,
so each can run in a different process from files on disk.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from shotloom.bundle import TensorBundle
from shotloom.capabilities import Capabilities, check_sampling, check_step_cache
from shotloom.config import InferenceConfig
from shotloom.parallel import enable_context_parallel, group_config
from shotloom.request import GenerationRequest

# progress(done, total) -> None; raising from it (e.g. on cancel) aborts the stage.
Progress = Callable[[int, int], None]


def fit_image(im, width: int, height: int):
    """Scale a PIL image to cover width x height, then centre-crop: exact size, aspect kept."""
    from PIL import Image

    im = im.convert("RGB")
    scale = max(width / im.width, height / im.height)
    w, h = max(width, round(im.width * scale)), max(height, round(im.height * scale))
    im = im.resize((w, h), Image.Resampling.BICUBIC)
    left, top = (w - width) // 2, (h - height) // 2
    return im.crop((left, top, left + width, top + height))


def source_frames(path: Path, num_frames: int, width: int, height: int) -> np.ndarray:
    """A source video's first ``num_frames`` frames (the last one repeated past its end), each
    fitted to width x height: float32 (F, H, W, 3) in [0, 1]. Unreadable: CapabilityError."""
    from PIL import Image

    from shotloom.capabilities import CapabilityError
    from shotloom.media import iter_frames

    frames: list[np.ndarray] = []
    try:
        for frame in iter_frames(path):
            frames.append(np.asarray(fit_image(Image.fromarray(frame), width, height), dtype=np.float32))
            if len(frames) == num_frames:
                break
    except Exception as exc:  # PyAV/FFmpeg errors of any kind: the input is what is wrong
        raise CapabilityError("source_video", f"cannot read {path}: {exc}") from exc
    if not frames:
        raise CapabilityError("source_video", f"{path} has no decodable video frames")
    frames += [frames[-1]] * (num_frames - len(frames))
    return np.stack(frames) / 255.0


@dataclass
class DecodedMedia:
    frames: np.ndarray  # (F, H, W, 3) uint8
    audio: np.ndarray | None = None  # (channels, samples) float32 in [-1, 1]
    sample_rate: int | None = None


@dataclass
class EncoderCounter:
    """Counts encoder forward passes (text, image, VAE-encode, audio) — a cache hit must add none."""

    calls: dict[str, int] = field(default_factory=dict)

    def hit(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    @property
    def total(self) -> int:
        return sum(self.calls.values())


class FamilyAdapter(ABC):
    """One model family. Instances hold loaded weights; construct with ``load``."""

    family: str
    # Components loaded in float32 whatever the YAML's dtype (admission counts them that way).
    pinned_dtypes: dict[str, str] = {}

    def __init__(self, cfg: InferenceConfig, pipe, device: str):
        self.cfg = cfg
        self.pipe = pipe
        self.device = device
        self.encoder_counter = EncoderCounter()
        self.generator_loads = 0  # DiT reloads after a release (the first load is not counted)
        self.adapter_loads = 0  # LoRA files read (once per adapter, again only after a DiT reload)
        self._generator_classes: dict[str, type] = {}
        self._generator_configs: dict[str, object] = {}  # configs stay readable while released

    # -- checkpoint ---------------------------------------------------------
    @classmethod
    @abstractmethod
    def build_tiny_checkpoint(cls, out_dir: Path, seed: int = 0) -> Path:
        """Write a tiny, randomly initialised checkpoint in the real diffusers folder format."""

    @classmethod
    @abstractmethod
    def load(cls, cfg: InferenceConfig, device: str = "cpu") -> FamilyAdapter:
        """``from_pretrained(cfg.paths.checkpoint, local_files_only=True)`` and wrap it."""

    # -- capabilities -------------------------------------------------------
    @property
    @abstractmethod
    def capabilities(self) -> Capabilities: ...

    def check(self, req: GenerationRequest) -> None:
        """Raise CapabilityError before any work. Families may add rules."""
        self.capabilities.check(req)
        check_sampling(self.cfg.sampler_for(req.lora), req)
        check_step_cache(self.cfg.performance, req.step_cache)

    # -- device groups (shotloom.parallel) ---------------------------------------------------------
    # Families whose DiT runs split over a group's ranks (diffusers' context parallel plan, tested).
    context_parallel = False

    def check_group(self, parallel) -> None:
        """Refuse, naming the key, what a device group cannot run (before any rank splits a DiT)."""
        from shotloom.config import FirstBlockCache, MagCache
        from shotloom.parallel import check_context_parallel
        from shotloom.performance import PerformanceError

        if not self.context_parallel:
            raise ValueError(f"parallel: the {self.family} family runs on one device (no tested split)")
        check_context_parallel(self, parallel)
        perf = self.cfg.performance
        for name, cache in perf.step_caches.items():
            # Each rank would decide from its own part of the sequence: ranks that disagree hang.
            if isinstance(cache, FirstBlockCache | MagCache):
                raise PerformanceError(
                    f"step_caches.{name}",
                    f"a {cache.kind} cache decides per rank; a device group cannot use it",
                )
        if perf.compile.enabled:
            raise PerformanceError("compile", "not with a device group in this release (untested)")

    def dit_tokens(self, req: GenerationRequest) -> int:
        """The DiT's sequence length for ``req`` (what a device group splits)."""
        raise NotImplementedError

    def check_split(self, req: GenerationRequest, parallel) -> None:
        """CapabilityError when ``req``'s DiT sequence does not split evenly over the group."""
        from shotloom.capabilities import CapabilityError

        tokens = self.dit_tokens(req)
        if tokens % parallel.degree:
            raise CapabilityError(
                "num_frames",
                f"{req.width}x{req.height}, {req.num_frames} frames make {tokens} DiT tokens, which do not "
                f"split over this worker group's {parallel.degree} ranks: choose a size or frame count "
                f"giving a multiple of {parallel.degree}",
            )

    # -- performance (shotloom.performance) -------------------------------------------------------
    def setup_generators(self, names: list[str] | None = None) -> None:
        """After the DiT(s) ``names`` (default: all) came from the checkpoint: the LoRA adapters,
        then FP8 storage and the attention backend (after the adapters, whose layers diffusers'
        casting skips), each step cache proven, regional compilation last (it wraps what runs)."""
        from shotloom.performance import check_step_caches, compile_generator, prepare_generator

        names = self.generator_names() if names is None else names
        perf = self.cfg.performance
        self.load_adapters()
        modules = [getattr(self.pipe, n) for n in names]
        for module in modules:
            prepare_generator(module, perf, self.generator_dtype(), self.device)
        check_step_caches(modules, perf, self.cfg.sampler.steps or 1)
        if (parallel := group_config()) is not None:  # a rank of a device group: split every DiT
            self.check_group(parallel)
            enable_context_parallel(modules, parallel)
        if perf.compile.enabled:
            for module in modules:
                compile_generator(module, perf.compile)

    # -- sampling ---------------------------------------------------------------------------------
    def keep_checkpoint_scheduler(self, scheduler, name: str = "scheduler") -> None:
        """Remember the scheduler the checkpoint ships (its class and config): native samplers are
        fresh copies of it, DMD ones are built from its config."""
        self._checkpoint_schedulers = {**getattr(self, "_checkpoint_schedulers", {}), name: scheduler}
        self._schedulers: dict[tuple[str, str], object] = {}

    def scheduler_for(self, sampler, name: str = "scheduler"):
        """The scheduler ``sampler`` runs on (one per sampler, kept: adapters switch without reloads)."""
        from shotloom.sampler import make_dmd_scheduler, native_scheduler

        key = (name, sampler.model_dump_json())
        if key not in self._schedulers:
            base = self._checkpoint_schedulers[name]
            self._schedulers[key] = (
                native_scheduler(base, sampler.flow_shift)
                if sampler.mode == "native"
                else make_dmd_scheduler(base.config, sampler.sigmas, sampler.shift)
            )
        return self._schedulers[key]

    def sampling_record(self, sampler, req: GenerationRequest, sigmas: list[float], **extra) -> dict:
        """How a generation was sampled, for its latents' meta, the job and the materialization."""
        from shotloom.performance import describe_step_cache

        return {
            "mode": sampler.mode,
            "scheduler": type(self.pipe.scheduler).__name__,
            "steps": len(sigmas),
            "guidance_scale": req.guidance_scale,
            "dit_calls_per_step": sampler.step_calls(req.guidance_scale).evaluations,
            "sigmas": [round(s, 6) for s in sigmas],
            "step_cache": describe_step_cache(self.cfg.performance, self.step_cache_name(req)),
            **{k: v for k, v in extra.items() if v is not None},
        }

    def uses_negative(self, req: GenerationRequest) -> bool:
        """Whether ``req`` samples with classifier-free guidance (its sampler's
        :meth:`~shotloom.config.Sampler.step_calls`), so its conditioning holds the negative prompt's."""
        return self.cfg.sampler_for(req.lora).step_calls(req.guidance_scale).cfg

    def sampling(self, req: GenerationRequest):
        """The sampler that runs ``req`` (its adapter's, or the model's) and its step count."""
        sampler = self.cfg.sampler_for(req.lora)
        return sampler, req.num_inference_steps or sampler.steps

    def step_cache_name(self, req: GenerationRequest) -> str:
        """The step cache ``req`` runs with (a name of ``performance.step_caches``, or ``none``)."""
        from shotloom.request import resolve_step_cache

        return resolve_step_cache(self.cfg.performance, req.step_cache)

    def step_cache(self, req: GenerationRequest, steps: int) -> AbstractContextManager:
        """The request's step cache on every DiT for one denoise (nothing for ``none``)."""
        from shotloom.performance import step_cache

        perf = self.cfg.performance
        cache = perf.step_caches.get(self.step_cache_name(req))
        return step_cache([getattr(self.pipe, n) for n in self.generator_names()], cache, steps)

    def adapter_names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.cfg.adapters)

    # -- adapters (LoRA) ------------------------------------------------------------------------
    def load_adapters(self) -> None:
        """Load every configured LoRA into the DiT once (diffusers' adapter API), all switched off;
        a request switches one on by name (``using_adapter``) without touching the base weights.
        Tiny random LoRAs are built first where missing and the YAML allows it."""
        from shotloom.families.weights import build_tiny_lora

        for i, adapter in enumerate(self.cfg.adapters):
            if not adapter.path.exists():
                if not self.cfg.tiny.build_if_missing:
                    raise FileNotFoundError(f"adapters[{i}].path: {adapter.path} does not exist")
                build_tiny_lora(self.cfg.paths.checkpoint, adapter.path, seed=self.cfg.tiny.seed + i + 1)
            self.pipe.load_lora_weights(str(adapter.path), adapter_name=adapter.name)
            self.adapter_loads += 1
        if self.cfg.adapters:
            self.pipe.disable_lora()

    @contextmanager
    def using_adapter(self, name: str | None, scale: float | None) -> Iterator[None]:
        """The named adapter on at ``scale`` (its configured scale by default) for one stage; none:
        the base weights alone. Always switched off again after."""
        if not self.cfg.adapters:
            yield
            return
        if name is None:
            self.pipe.disable_lora()
        else:
            default = next(a.scale for a in self.cfg.adapters if a.name == name)
            self.pipe.enable_lora()
            self.pipe.set_adapters([name], [default if scale is None else scale])
        try:
            yield
        finally:
            self.pipe.disable_lora()

    def encoder_identity(self) -> str:
        """Identity of the encoder stack, part of every conditioning cache key."""
        return f"{self.family}:{self.cfg.paths.checkpoint.name}:{self.cfg.dtype}"

    # -- stages -------------------------------------------------------------
    @abstractmethod
    def encode(self, req: GenerationRequest) -> TensorBundle:
        """Run every encoder (text, images, audio). Count each forward in encoder_counter."""

    @abstractmethod
    def denoise(
        self, cond: TensorBundle, req: GenerationRequest, progress: Progress | None = None
    ) -> TensorBundle:
        """Few-step DMD from cond alone (no encoder forwards). Returns latents (video, maybe audio)."""

    @abstractmethod
    def decode(
        self, latents: TensorBundle, req: GenerationRequest, progress: Progress | None = None
    ) -> DecodedMedia:
        """VAE decode (tiled per cfg.tiling) and, if the family makes audio, the vocoder."""

    # -- weights ------------------------------------------------------------
    def modules(self) -> dict:
        """Named torch modules of the pipeline (for residency and memory accounting)."""
        import torch

        return {k: v for k, v in self.pipe.components.items() if isinstance(v, torch.nn.Module)}

    def tensor_bytes(self) -> int:
        return sum(
            p.numel() * p.element_size()
            for m in self.modules().values()
            for p in list(m.parameters()) + list(m.buffers())
        )

    # -- generator tiers (device -> CPU -> released), see shotloom.admission.plan_tier ----------
    def generator_names(self) -> list[str]:
        """The DiT(s) this checkpoint has: the only weights moved between tiers."""
        import torch

        return [
            n
            for n, m in self.pipe.components.items()
            if n.startswith("transformer")
            and (isinstance(m, torch.nn.Module) or n in self._generator_classes)
        ]

    def generator_config(self):
        """The (first) DiT's config, also while the DiT itself is released."""
        name = self.generator_names()[0]
        module = getattr(self.pipe, name, None)
        return module.config if module is not None else self._generator_configs[name]

    def generator_location(self) -> str:
        """'released', 'offloaded' (group offload streams blocks in), or the device type it sits on."""
        import torch

        modules = [getattr(self.pipe, n, None) for n in self.generator_names()]
        if not modules or any(m is None for m in modules):
            return "released"
        if self.cfg.offload and torch.device(self.device).type == "cuda":
            return "offloaded"
        return next(modules[0].parameters()).device.type

    def generator_bytes(self) -> int:
        import torch

        mods = [getattr(self.pipe, n, None) for n in self.generator_names()]
        return sum(
            t.numel() * t.element_size()
            for m in mods
            if isinstance(m, torch.nn.Module)
            for t in list(m.parameters()) + list(m.buffers())
        )

    def stage_generator_on_cpu(self) -> None:
        """Make room on the device for another stack; the DiT comes back with ensure_generator."""
        if self.cfg.offload:
            return  # group offload already keeps the DiT on CPU between blocks
        for name in self.generator_names():
            if (module := getattr(self.pipe, name, None)) is not None:
                module.to("cpu")
        _empty_device_cache()

    def release_generator(self) -> None:
        """Drop the DiT from memory (the last tier); ensure_generator reloads it from the checkpoint."""
        for name in self.generator_names():
            module = getattr(self.pipe, name, None)
            if module is not None:
                self._generator_classes[name] = type(module)
                self._generator_configs[name] = module.config
                setattr(self.pipe, name, None)
        import gc

        gc.collect()
        _empty_device_cache()

    def ensure_generator(self) -> bool:
        """Bring the DiT back onto the device; True when it had to be loaded or moved."""
        import torch

        from shotloom.families.weights import place_module

        changed = False
        reloaded: list[str] = []
        for name in self.generator_names():
            module = getattr(self.pipe, name, None)
            if module is None and name in self._generator_classes:
                module = self._generator_classes[name].from_pretrained(
                    str(self.cfg.paths.checkpoint / name), local_files_only=True, dtype=self.generator_dtype()
                )
                setattr(self.pipe, name, module)
                place_module(name, module, self.device, self.cfg.offload)
                self.generator_loads += 1
                changed = True
                reloaded.append(name)
            elif isinstance(module, torch.nn.Module) and not self.cfg.offload:
                if next(module.parameters()).device != torch.device(self.device):
                    module.to(self.device)
                    changed = True
        if reloaded:  # a DiT read back from the checkpoint has no adapters nor speed options yet
            self.setup_generators(reloaded)
        return changed

    def generator_dtype(self):
        import torch

        return getattr(torch, self.cfg.dtype)


def _empty_device_cache() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()
