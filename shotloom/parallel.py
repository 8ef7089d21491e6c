"""One denoise across a group of ranks: diffusers' context parallelism (Ulysses, ring).

Every rank of a group loads the same checkpoint, encodes nothing new and runs the *same* denoise
call on the *same* inputs; inside each DiT forward diffusers' hooks split the token sequence
across the ranks (after the patch embedding, ``_cp_plan``), all-to-all the attention heads
(Ulysses) or pass K/V around (ring), and all-gather the sequence again at ``proj_out``. So every
rank ends with the full output; rank 0 keeps it (:func:`run_on_group`).

Order, in each rank's process: :func:`init_group` -> ``Adapter.load(cfg, device)`` with the device
it returned -> attention backend set (``setup_generators``) -> :func:`enable_context_parallel` ->
compile, if any -> ``run_on_group(lambda: adapter.denoise(cond, req, group_progress(progress)))``
-> :func:`close_group`.

torch is imported inside the functions: ``ParallelConfig`` is part of the YAML schema, which
loads without torch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from shotloom.families.base import FamilyAdapter, Progress

T = TypeVar("T")

# Attention backends that return a log-sum-exp: ring attention merges its partial results with it
# (diffusers' ``native`` SDPA refuses ``return_lse``, and no backend doing so runs on CPU).
RING_BACKENDS = ("flash", "flash_hub", "_flash_3_hub", "_native_cudnn", "_native_flash", "sage", "sage_hub")


class ParallelConfig(BaseModel):
    """``parallel:`` of a device group: how many ranks one denoise is split over."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ulysses: int = Field(default=1, ge=1, description="Ulysses degree: must divide the DiT's head count.")
    ring: int = Field(default=1, ge=1, description="Ring degree (CUDA only: needs an LSE attention backend).")

    @property
    def degree(self) -> int:
        """Ranks in the group (the mesh is ring x ulysses)."""
        return self.ulysses * self.ring


def init_group(
    rank: int,
    world_size: int,
    device_type: str,
    master_addr: str = "127.0.0.1",
    master_port: int = 29500,
    device_id: int | None = None,
    timeout_s: float = 600.0,
) -> str:
    """Join this process to the group (every rank calls it, it returns once all have); returns the
    device this rank loads onto: ``cpu`` (gloo) or ``cuda:<id>`` (NCCL, one device per rank;
    ``device_id`` defaults to ``rank``, i.e. the group's devices are its CUDA_VISIBLE_DEVICES).

    On a CPU-only host diffusers 0.42.1 divides by ``torch.accelerator.device_count()`` (0) when it
    records a rank's device; :func:`enable_context_parallel` answers 1 for that call alone rather
    than here, so nothing else in the process ever sees a fake device count."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        raise RuntimeError("init_group: this process already belongs to a process group")
    if device_type == "cpu":
        backend, device, bound = "gloo", "cpu", None
    elif device_type == "cuda":
        index = rank if device_id is None else device_id
        torch.cuda.set_device(index)  # before NCCL: its communicator binds to the current device
        backend, device, bound = "nccl", f"cuda:{index}", torch.device("cuda", index)
    else:
        raise ValueError(f"device_type: {device_type!r} has no context-parallel backend (cpu or cuda)")
    dist.init_process_group(
        backend=backend,
        init_method=f"tcp://{master_addr}:{master_port}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
        device_id=bound,
    )
    return device


def close_group() -> None:
    """Leave the group (NCCL warns at exit otherwise)."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def _generators(target: FamilyAdapter | Sequence[Any]) -> dict[str, Any]:
    """The DiT(s) by name: an adapter's ``generator_names()`` (Wan 2.2 A14B: two), or modules."""
    if isinstance(target, Sequence):
        return {f"transformer[{i}]": m for i, m in enumerate(target)}
    return {name: getattr(target.pipe, name, None) for name in target.generator_names()}


def check_context_parallel(target: FamilyAdapter | Sequence[Any], cfg: ParallelConfig) -> None:
    """Refuse, naming the key, what cannot run on these DiTs, before any is touched. Needs no
    group: a worker can refuse at its start, before it waits for the other ranks."""
    from diffusers import __version__ as diffusers_version

    for name, module in _generators(target).items():
        if module is None:
            raise RuntimeError(f"enable_context_parallel: {name} is released; load it first")
        if getattr(module, "_cp_plan", None) is None:
            raise ValueError(
                f"parallel.ulysses: {name} ({type(module).__name__}) has no context-parallel plan in "
                f"diffusers {diffusers_version}; it runs on one device only"
            )
        heads = module.config.num_attention_heads
        if heads % cfg.ulysses:
            raise ValueError(
                f"parallel.ulysses: {cfg.ulysses} does not divide {name}'s {heads} attention heads "
                "(Ulysses gives each rank heads / ulysses of them)"
            )
        if cfg.ring > 1:
            device = next(module.parameters()).device.type
            if device != "cuda":
                raise ValueError(
                    f"parallel.ring: ring attention needs an attention backend returning log-sum-exp "
                    f"({', '.join(RING_BACKENDS)}); none runs on {device}: use parallel.ulysses"
                )
            backend = _attention_backend(module)
            if backend not in RING_BACKENDS:
                raise ValueError(
                    f"parallel.ring: attention backend {backend!r} returns no log-sum-exp; set "
                    f"performance.attention_backend to one of {list(RING_BACKENDS)}"
                )


def check_sequence(tokens: int, cfg: ParallelConfig) -> None:
    """diffusers splits the DiT's token sequence into ``degree`` equal parts (Wan: latent frames x
    latent height / patch x latent width / patch); a count it does not divide fails inside the
    first DiT call, on every rank. Refuse such a request before it starts."""
    if tokens % cfg.degree:
        raise ValueError(
            f"width/height/num_frames: {tokens} DiT tokens do not split into {cfg.degree} equal parts "
            f"(parallel: ulysses {cfg.ulysses} x ring {cfg.ring})"
        )


def _attention_backend(module: Any) -> str:
    """The backend the DiT's attention runs on: its processors' own, else diffusers' global one."""
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    for sub in module.modules():
        processor = getattr(sub, "processor", None)
        if processor is not None and hasattr(processor, "_attention_backend"):
            if processor._attention_backend is not None:
                return str(getattr(processor._attention_backend, "value", processor._attention_backend))
            break
    return _AttentionBackendRegistry.get_active_backend()[0].value


def enable_context_parallel(target: FamilyAdapter | Sequence[Any], cfg: ParallelConfig) -> None:
    """``enable_parallelism`` on every DiT of ``target`` (an adapter or the modules), every rank
    alike (building the mesh is collective). A degree of 1 changes nothing. Call it after the
    attention backend is set (diffusers checks the backend here) and before compilation."""
    if cfg.degree == 1:
        return
    check_context_parallel(target, cfg)
    import torch.distributed as dist
    from diffusers import ContextParallelConfig
    from torch.distributed.device_mesh import init_device_mesh

    if not dist.is_initialized():
        raise RuntimeError("enable_context_parallel: call init_group first (the mesh is built on it)")
    if dist.get_world_size() != cfg.degree:
        raise ValueError(
            f"parallel: ulysses x ring = {cfg.ulysses} x {cfg.ring} = {cfg.degree}, "
            f"but the group has {dist.get_world_size()} ranks"
        )
    # One mesh for all the DiTs (Wan 2.2's two experts share it), on the group's device type:
    # diffusers would build one per DiT on the host's accelerator type, wrong for a CPU (gloo)
    # group on a CUDA host.
    mesh = init_device_mesh(
        "cuda" if dist.get_backend() == "nccl" else "cpu",
        mesh_shape=(cfg.ring, cfg.ulysses),
        mesh_dim_names=("ring", "ulysses"),
    )
    with _cpu_device_count():
        for module in _generators(target).values():
            cp = ContextParallelConfig(ulysses_degree=cfg.ulysses, ring_degree=cfg.ring, mesh=mesh)
            module.enable_parallelism(config=cp)


@contextmanager
def _cpu_device_count() -> Iterator[None]:
    """``torch.accelerator.device_count()`` answers 1 on a CPU-only host, for one call only.

    diffusers 0.42.1 (``ModelMixin._resolve_parallel_config``) names each rank's device
    ``torch.device(accelerator, rank % torch.accelerator.device_count())``: 0 devices on a CPU-only
    host -> ZeroDivisionError. The name is only recorded (context parallelism never reads it),
    and every rank's CPU is "cpu:0", so 1 is the true answer for this purpose."""
    import torch

    if torch._C._get_accelerator().type != "cpu" or torch.accelerator.device_count() > 0:
        yield
        return
    original = torch.accelerator.device_count
    torch.accelerator.device_count = lambda: 1
    try:
        yield
    finally:
        torch.accelerator.device_count = original


def run_on_group(call: Callable[[], T]) -> T | None:
    """Run ``call`` on this rank as every rank of the group does (the DiTs' collectives pair up
    across ranks: a rank that skips it leaves the others waiting); rank 0's result, None elsewhere.
    Every rank holds the same full output (gathered at ``proj_out``); only rank 0 keeps it."""
    import torch.distributed as dist

    result = call()
    return result if not dist.is_initialized() or dist.get_rank() == 0 else None


def group_progress(progress: Progress | None) -> Progress:
    """Rank 0's progress callback, with its verdict shared after every step: a cancel (the
    callback raising) on rank 0 alone would leave the other ranks waiting forever in the next
    all-to-all, so all ranks raise together. One tiny broadcast a step."""
    import torch
    import torch.distributed as dist

    def step(done: int, total: int) -> None:
        error: BaseException | None = None
        if dist.get_rank() == 0 and progress is not None:
            try:
                progress(done, total)
            except BaseException as exc:  # re-raised below, once the other ranks know
                error = exc
        device = f"cuda:{torch.cuda.current_device()}" if dist.get_backend() == "nccl" else "cpu"
        flag = torch.tensor([error is not None], dtype=torch.int32, device=device)
        dist.broadcast(flag, src=0)
        if error is not None:
            raise error
        if flag.item():
            raise RuntimeError(f"rank 0 stopped the denoise at step {done}/{total}")

    return step
