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
    collective_timeout_s: float = Field(
        default=600.0,
        gt=0,
        description="How long the ranks wait for each other (joining, and each collective of a denoise) "
        "before the group counts as lost and restarts; longer than a rank's slowest step.",
    )

    @property
    def degree(self) -> int:
        """Ranks in the group (the mesh is ring x ulysses)."""
        return self.ulysses * self.ring


# This process's group, once :func:`init_group` joined it: its config and its device mesh (built
# once, collectively, at the join: a DiT loaded later, or reloaded, is split without a collective).
_GROUP: dict[str, Any] = {}


def group_config() -> ParallelConfig | None:
    """The ``parallel`` config of the group this process belongs to (None: no group)."""
    return _GROUP.get("config")


def init_group(
    rank: int,
    cfg: ParallelConfig,
    device_type: str,
    master_addr: str = "127.0.0.1",
    master_port: int = 29500,
    device_id: int | None = None,
    timeout_s: float = 600.0,
) -> str:
    """Join this process to the group of ``cfg.degree`` ranks (every rank calls it, it returns once
    all have) and build the group's device mesh; returns the device this rank loads onto: ``cpu``
    (gloo) or ``cuda:<id>`` (NCCL, one device per rank; ``device_id`` defaults to ``rank``, i.e. the
    group's devices are its CUDA_VISIBLE_DEVICES).

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
        world_size=cfg.degree,
        timeout=timedelta(seconds=timeout_s),
        device_id=bound,
    )
    from torch.distributed.device_mesh import init_device_mesh

    # One mesh for all the DiTs (Wan 2.2's two experts share it), on the group's device type:
    # diffusers would build one per DiT on the host's accelerator type, wrong for a CPU (gloo)
    # group on a CUDA host. Building it is collective: every rank does it here, together.
    mesh = init_device_mesh(
        "cuda" if backend == "nccl" else "cpu",
        mesh_shape=(cfg.ring, cfg.ulysses),
        mesh_dim_names=("ring", "ulysses"),
    )
    _GROUP.update(config=cfg, mesh=mesh)
    return device


def close_group(settle_s: float = 10.0, meet: bool = True) -> None:
    """Leave the group (NCCL warns at exit otherwise). On gloo the ranks first meet at a barrier
    bounded by ``settle_s``: a rank that tears its pairs down while a peer still reads from them
    makes gloo abort that peer (SIGABRT) instead of letting it leave; a peer that never comes (it
    died) only costs the bound. ``meet=False``: no barrier (the peers are out of step, waiting in
    a collective of their own: none would come)."""
    from datetime import timedelta

    import torch.distributed as dist

    _GROUP.clear()
    if not dist.is_initialized():
        return
    if meet and dist.get_backend() == "gloo" and dist.get_world_size() > 1:
        try:
            dist.monitored_barrier(timeout=timedelta(seconds=settle_s))
        except RuntimeError:
            pass  # a peer is gone: nothing left to wait for
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

    if not dist.is_initialized() or "mesh" not in _GROUP:
        raise RuntimeError("enable_context_parallel: call init_group first (the mesh is built on it)")
    if _GROUP["config"] != cfg:
        raise ValueError(f"parallel: {cfg} is not the group's {_GROUP['config']}")
    mesh = _GROUP["mesh"]
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


@contextmanager
def held_interrupts() -> Iterator[Callable[[], None]]:
    """SIGINT (how a worker cancels the run in its main thread) held while the group denoises: an
    interrupt raised in the middle of a DiT call would leave rank 0 out of step with the others,
    which wait in the next collective forever. Yields ``deliver``: at a step boundary it runs the
    handler that was replaced (which raises the interrupt) if one came. Off the main thread, or
    without a Python handler, nothing is held."""
    import signal
    import threading

    original = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(original):
        yield lambda: None
        return
    held: list[Any] = []

    def hold(signo: int, frame: Any) -> None:
        held.append((signo, frame))

    def deliver() -> None:
        if held:
            signo, frame = held[-1]
            held.clear()
            original(signo, frame)  # raises (KeyboardInterrupt, Dagster's interrupted error)

    signal.signal(signal.SIGINT, hold)
    try:
        yield deliver
    finally:
        signal.signal(signal.SIGINT, original)
        if held:  # came after the last step: every rank has finished, the cancel is rank 0's alone
            try:
                signal.raise_signal(signal.SIGINT)
            except BaseException as exc:
                _mark_in_step(exc)
                raise


_IN_STEP = "_shotloom_group_in_step"  # set on an error every rank raised at the same step


def _mark_in_step(error: BaseException) -> None:
    try:
        setattr(error, _IN_STEP, True)
    except AttributeError:  # an exception type without a __dict__: treated as out of step
        pass


class StoppedByRankZero(RuntimeError):
    """On a follower rank: rank 0 ended the denoise at a step boundary (a cancel); the group is
    in step and goes on with the next one."""


def group_progress(progress: Progress | None, interrupts: Callable[[], None] | None = None) -> Progress:
    """Rank 0's progress callback, with its verdict shared after every step: a cancel (the
    callback raising, or a held interrupt delivered by ``interrupts``) on rank 0 alone would
    leave the other ranks waiting forever in the next all-to-all, so all ranks raise together.
    One tiny broadcast a step."""
    import torch
    import torch.distributed as dist

    def step(done: int, total: int) -> None:
        error: BaseException | None = None
        if dist.get_rank() == 0:
            try:
                if interrupts is not None:
                    interrupts()
                if progress is not None:
                    progress(done, total)
            except BaseException as exc:  # re-raised below, once the other ranks know
                error = exc
        device = f"cuda:{torch.cuda.current_device()}" if dist.get_backend() == "nccl" else "cpu"
        flag = torch.tensor([error is not None], dtype=torch.int32, device=device)
        dist.broadcast(flag, src=0)
        if error is not None:
            _mark_in_step(error)
            raise error
        if flag.item():
            raise StoppedByRankZero(f"rank 0 stopped the denoise at step {done}/{total}")

    return step


# -- a device group: rank 0 (the worker that takes runs) and its follower ranks ---------------------
class GroupSpec(BaseModel):
    """How a worker's group runs: its ``parallel`` config, device type, torch threads a rank."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    parallel: ParallelConfig
    device_type: str = Field(pattern="^(cpu|cuda)$")
    threads: int = Field(default=0, ge=0, description="torch CPU threads of each follower rank (0: torch's).")


class RankGroup:
    """Rank 0's side of a device group. Ranks 1..N-1 are child processes it starts (each loads the
    model on its own device and waits); a denoise on rank 0 first sends them the same conditioning
    and request over a pipe (an idle wait has no collective timeout), then every rank runs it
    (:func:`run_on_group` semantics: rank 0 keeps the output). A rank that dies leaves the group
    unusable: :meth:`dead` says so and the worker restarts the whole group."""

    def __init__(self, spec: GroupSpec, on_lost: Callable[[list[int]], None] | None = None):
        self.spec = spec
        self._procs: list[Any] = []
        self._pipes: list[Any] = []
        self.device: str | None = None
        # What the owner does when a rank is gone (a worker: exit, so the group restarts whole).
        self.on_lost = on_lost
        self._out_of_step = False  # reported lost: the followers cannot meet rank 0 any more

    def lost(self, grace_s: float = 3.0) -> bool:
        """After a failed denoise: whether a rank died (waiting ``grace_s`` for its exit to show,
        since its peers' collective fails first); if so, ``on_lost`` runs before this returns."""
        import time

        deadline = time.monotonic() + grace_s
        while not (dead := self.dead()) and time.monotonic() < deadline:
            time.sleep(0.05)
        if dead:
            self._report_lost(dead)
        return bool(dead)

    def _report_lost(self, dead: list[int]) -> None:
        self._out_of_step = True
        if self.on_lost is not None:
            self.on_lost(dead)

    @contextmanager
    def denoising(self, progress: Progress | None) -> Iterator[Progress]:
        """Around rank 0's denoise (after :meth:`send_denoise`): interrupts held to step
        boundaries, the step verdict shared; any other way out of the denoise (rank 0's own error,
        a rank that died, a failed collective) leaves the other ranks out of step, so it is
        reported to ``on_lost``."""
        try:
            with held_interrupts() as deliver:
                yield group_progress(progress, deliver)
        except BaseException as exc:
            if getattr(exc, _IN_STEP, False):  # every rank left at the same step: still in step
                raise
            # Rank 0 left on its own (its own error, a rank that died, a failed collective): the
            # others wait in a collective of this denoise, so the group restarts whole.
            if not self.lost():
                self._report_lost([])
            raise

    @property
    def ranks(self) -> int:
        return self.spec.parallel.degree

    def start(self) -> str:
        """Start the followers, join the group with them; returns rank 0's device."""
        import multiprocessing as mp
        import socket

        ctx = mp.get_context("spawn")  # a fresh interpreter: torch's threads do not survive fork
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        for rank in range(1, self.ranks):
            ours, theirs = ctx.Pipe()
            proc = ctx.Process(
                target=_follower_main, args=(rank, self.spec, port, theirs), name=f"rank-{rank}", daemon=True
            )
            proc.start()
            self._procs.append(proc)
            self._pipes.append(ours)
        self.device = init_group(
            0,
            self.spec.parallel,
            self.spec.device_type,
            master_port=port,
            timeout_s=self.spec.parallel.collective_timeout_s,
        )
        return self.device

    def dead(self) -> list[int]:
        """Ranks whose process has exited."""
        return [rank for rank, proc in enumerate(self._procs, start=1) if not proc.is_alive()]

    def pids(self) -> list[int]:
        return [proc.pid for proc in self._procs]

    def send_denoise(self, cond: Any, req: Any) -> None:
        """Tell every follower to run the denoise rank 0 is about to run."""
        message = ("denoise", dict(cond.tensors), dict(cond.meta), req.to_json())
        for pipe in self._pipes:
            pipe.send(message)

    def close(self) -> None:
        if self._out_of_step:  # they wait in a collective: neither "stop" nor the barrier reaches them
            for proc in self._procs:
                proc.kill()
            close_group(meet=False)
            for proc in self._procs:
                proc.join(timeout=5)
            return
        for pipe in self._pipes:
            try:
                pipe.send(("stop",))
            except OSError:
                pass
        close_group()  # meets the followers at their own close_group's barrier
        for proc in self._procs:
            proc.join(timeout=5)  # one stuck in a collective cannot read "stop"
            if proc.is_alive():
                proc.kill()


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when its parent (rank 0) dies, even by kill -9."""
    import ctypes
    import signal

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _follower_main(rank: int, spec: GroupSpec, port: int, pipe: Any) -> None:
    """A follower rank: join, load the model (split by the group), run each denoise rank 0 sends."""
    import logging

    import torch

    from shotloom.bundle import TensorBundle
    from shotloom.request import GenerationRequest
    from shotloom.runtime import get_runtime

    _die_with_parent()
    log = logging.getLogger(f"shotloom.rank{rank}")
    if spec.threads > 0:
        torch.set_num_threads(spec.threads)
    device = init_group(
        rank, spec.parallel, spec.device_type, master_port=port, timeout_s=spec.parallel.collective_timeout_s
    )
    runtime = get_runtime(None, device)
    runtime.adapter  # noqa: B018 - loads now: the first run does not wait for this rank
    try:
        while True:
            try:
                message = pipe.recv()
            except EOFError:  # rank 0 is gone
                return
            if message[0] == "stop":
                return
            _, tensors, meta, req = message
            try:
                runtime.denoise(TensorBundle(tensors, meta), GenerationRequest.from_json(req))
            except StoppedByRankZero as exc:  # a cancel: every rank left at the same step
                log.warning("rank %d: %s", rank, exc)
            except Exception:
                # This rank failed alone (e.g. out of memory on its device): rank 0 would wait in
                # the next collective until the group's timeout. Exiting closes this rank's
                # connections, so rank 0's collective fails now and the group restarts whole.
                log.exception("rank %d: denoise failed; leaving the group", rank)
                raise SystemExit(1) from None
    finally:
        close_group()
