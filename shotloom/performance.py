"""The DiT's speed options (the inference YAML's ``performance``), each done by diffusers itself:
``set_attention_backend``, ``compile_repeated_blocks``, ``enable_cache`` with a step cache config,
``enable_layerwise_casting`` to float8 storage.

Every option is proven when the model loads, on its device: the attention backend runs one
attention call, each declared step cache is switched on and off, the compiled blocks run once at
the default shape (:meth:`shotloom.runtime.ModelRuntime.adapter`). What cannot work raises
:class:`PerformanceError` naming the YAML key, so a worker refuses to start rather than falling
back to something slower than what its operator chose.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from shotloom.config import NO_STEP_CACHE, Compile, FirstBlockCache, MagCache, Performance, StepCache

# Float8 weight storage: what diffusers' layerwise casting keeps; computed in the model's dtype.
FP8_STORAGE = "float8_e4m3fn"


class PerformanceError(ValueError):
    """A ``performance`` choice this device or install cannot do; ``key`` is its YAML path."""

    def __init__(self, key: str, message: str):
        self.key = f"performance.{key}"
        super().__init__(f"{self.key}: {message}")


# -- before anything loads (a worker's start) --------------------------------------------------------
def check_device(perf: Performance, device: str, dtype: str) -> None:
    """What can be proven without the model: the attention backend runs on ``device``, float8
    exists, torch.compile has its toolchain (a C++ compiler on CPU, Triton on CUDA)."""
    import shutil

    import torch

    compute = getattr(torch, dtype)
    if perf.attention_backend is not None:
        from diffusers.models.attention_dispatch import AttentionBackendName

        names = {b.value for b in AttentionBackendName}
        if perf.attention_backend.lower() not in names:
            raise PerformanceError(
                "attention_backend", f"unknown {perf.attention_backend!r}; diffusers has {sorted(names)}"
            )
        check_attention_backend(perf.attention_backend, device, compute)
    if perf.fp8 and getattr(torch, FP8_STORAGE, None) is None:
        raise PerformanceError("fp8", f"this torch ({torch.__version__}) has no {FP8_STORAGE}")
    if perf.compile.enabled:
        if torch.device(device).type == "cpu" and not any(shutil.which(c) for c in ("c++", "g++", "clang++")):
            raise PerformanceError("compile", "torch.compile on CPU needs a C++ compiler; none is on PATH")
        if torch.device(device).type == "cuda":
            try:
                import triton  # noqa: F401
            except ImportError as exc:
                raise PerformanceError(
                    "compile", "torch.compile on CUDA needs triton, not installed"
                ) from exc


# -- on load --------------------------------------------------------------------------------------
def prepare_generator(module: Any, perf: Performance, compute_dtype: Any, device: str) -> None:
    """FP8 storage and the attention backend on one DiT, before adapters and compilation."""
    import torch

    if perf.fp8:
        storage = getattr(torch, FP8_STORAGE, None)
        if storage is None:
            raise PerformanceError("fp8", f"this torch ({torch.__version__}) has no {FP8_STORAGE}")
        try:
            module.enable_layerwise_casting(storage_dtype=storage, compute_dtype=compute_dtype)
        except Exception as exc:  # diffusers refuses models it cannot cast
            raise PerformanceError("fp8", f"{type(module).__name__}: {exc}") from exc
    if perf.attention_backend is not None:
        name = perf.attention_backend
        try:
            module.set_attention_backend(name)  # checks the name and the package it needs
        except (ValueError, RuntimeError, ImportError) as exc:
            raise PerformanceError("attention_backend", str(exc)) from exc
        check_attention_backend(name, device, compute_dtype)


def check_attention_backend(name: str, device: str, dtype: Any) -> None:
    """Run one small attention call through ``name`` on ``device``: a backend this device cannot
    run (a CUDA kernel on a CPU, a dtype it does not take) fails here, not in a request."""
    import torch
    from diffusers.models.attention_dispatch import AttentionBackendName, dispatch_attention_fn

    try:
        q = torch.randn(1, 16, 2, 64, device=device, dtype=dtype)  # (batch, tokens, heads, head_dim)
        dispatch_attention_fn(q, q, q, backend=AttentionBackendName(name.lower()))
    except Exception as exc:
        raise PerformanceError(
            "attention_backend", f"{name!r} cannot run on {device} in {dtype}: {type(exc).__name__}: {exc}"
        ) from exc


def check_step_caches(modules: Iterable[Any], perf: Performance, steps: int) -> None:
    """Switch each declared step cache on and off on every DiT: a DiT whose blocks diffusers'
    cache cannot hook fails here, naming the cache."""
    modules = list(modules)
    before = {id(m): _hooks(m) for m in modules}
    for name, cache in perf.step_caches.items():
        try:
            with step_cache(modules, cache, steps):
                unhooked = [type(m).__name__ for m in modules if _hooks(m) <= before[id(m)]]
        except Exception as exc:
            raise PerformanceError(f"step_caches.{name}", f"{type(exc).__name__}: {exc}") from exc
        if unhooked:  # a cache that hooks nothing would run every step and claim to be a cache
            raise PerformanceError(
                f"step_caches.{name}", f"the {cache.kind} cache found no module to hook in {unhooked}"
            )


def _hooks(module: Any) -> int:
    """How many diffusers hooks sit on ``module`` and its children."""
    return sum(len(getattr(getattr(m, "_diffusers_hook", None), "hooks", ())) for m in module.modules())


def compile_generator(module: Any, compile_cfg: Compile) -> None:
    """Regional compilation: each repeated block compiled (lazily, on its first call)."""
    import torch._dynamo

    # Every new shape (size, frames) recompiles a block; past the limit dynamo runs it eagerly.
    torch._dynamo.config.recompile_limit = compile_cfg.recompile_limit
    options: dict[str, Any] = {"fullgraph": compile_cfg.fullgraph, "dynamic": compile_cfg.dynamic}
    if compile_cfg.mode is not None:
        options["mode"] = compile_cfg.mode
    try:
        module.compile_repeated_blocks(**options)
    except Exception as exc:
        raise PerformanceError("compile", f"{type(module).__name__}: {exc}") from exc


def fp8_skip_patterns(checkpoint: Path) -> dict[str, tuple[str, ...]]:
    """Each DiT folder of a checkpoint -> the module-name patterns diffusers' layerwise casting
    leaves in the model dtype (its defaults, the class's fp32 and skip lists): what the cold memory
    estimate needs to count float8 weights at their size."""
    import diffusers
    from diffusers.hooks.layerwise_casting import DEFAULT_SKIP_MODULES_PATTERN

    out: dict[str, tuple[str, ...]] = {}
    for folder in sorted(Path(checkpoint).glob("transformer*/config.json")):
        cls = getattr(diffusers, json.loads(folder.read_text()).get("_class_name", ""), None)
        extra = [
            *(getattr(cls, "_keep_in_fp32_modules", None) or ()),
            *(getattr(cls, "_skip_layerwise_casting_patterns", None) or ()),
        ]
        out[folder.parent.name] = tuple(DEFAULT_SKIP_MODULES_PATTERN) + tuple(extra)
    return out


# -- per request ----------------------------------------------------------------------------------
def diffusers_cache_config(cache: StepCache, steps: int) -> Any:
    """The diffusers config object for one request of ``steps`` steps (a fresh one each time:
    diffusers keeps state on it)."""
    from diffusers import FirstBlockCacheConfig, MagCacheConfig, TaylorSeerCacheConfig

    if isinstance(cache, FirstBlockCache):
        return FirstBlockCacheConfig(threshold=cache.threshold)
    if isinstance(cache, MagCache):
        return MagCacheConfig(
            threshold=cache.threshold,
            max_skip_steps=cache.max_skip_steps,
            retention_ratio=cache.retention_ratio,
            num_inference_steps=steps,
            mag_ratios=list(cache.mag_ratios),
        )
    return TaylorSeerCacheConfig(
        cache_interval=cache.cache_interval,
        disable_cache_before_step=cache.disable_cache_before_step,
        max_order=cache.max_order,
        cache_identifiers=cache.cache_identifiers,
    )


@contextmanager
def step_cache(modules: Iterable[Any], cache: StepCache | None, steps: int) -> Iterator[None]:
    """``cache`` on every DiT for one denoise (none: nothing), always off again after, with its
    state reset, so the next request (maybe without a cache) starts clean."""
    modules = list(modules)
    if cache is None:
        yield
        return
    enabled: list[Any] = []
    try:
        for module in modules:
            module.enable_cache(diffusers_cache_config(cache, steps))
            enabled.append(module)
        yield
    finally:
        for module in enabled:
            module._reset_stateful_cache()
            module.disable_cache()


def describe_step_cache(perf: Performance, name: str) -> dict[str, Any]:
    """What a job and its materialization record about the step cache it ran with."""
    if name == NO_STEP_CACHE:
        return {"name": NO_STEP_CACHE}
    return {"name": name, **perf.step_caches[name].model_dump()}
