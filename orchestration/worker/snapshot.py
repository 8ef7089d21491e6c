"""What the worker reports about itself: ``GET /status`` and the registry heartbeat.

Read from the status thread, so nothing here imports torch or the model registry: both are
looked up in ``sys.modules`` and reported only once the main thread has loaded them.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import TYPE_CHECKING, Any

from contracts.worker import WorkerStatus

if TYPE_CHECKING:
    from orchestration.worker.process import Worker


def status(worker: Worker, config: str | None = None) -> WorkerStatus:
    """``config``: report only the runtimes of this inference YAML (a process holding several)."""
    with worker.lock:
        base = {
            "name": worker.name,
            "pool": worker.pool,
            "device": worker.device,
            "threads": worker.threads,
            "nice": os.getpriority(os.PRIO_PROCESS, 0),
            "pid": os.getpid(),
            "boot_id": worker.boot_id,
            "state": worker.state,
            "run_id": worker.run_id,
            "pending_run_id": worker.pending_run_id,
            "finished_run_ids": list(worker.finished),
            "runs_done": worker.runs_done,
            "admission_plan": worker.admission_plan,
            "dit_residency": worker.residency,
            "residency_policy": worker.runtime_cfg.dit_residency,
            "group": None
            if worker.group is None
            else {
                "ranks": worker.group.ranks,
                "parallel": worker.group.spec.parallel.model_dump(),
                "follower_pids": worker.group.pids(),
                "dead_ranks": worker.group.dead(),
            },
        }
    runtimes = runtimes_snapshot(config)
    return WorkerStatus.model_validate(
        {
            **base,
            "weights": runtimes,
            "weights_loaded": any(r["loaded"] for r in runtimes),
            "weight_location": next((r["location"] for r in runtimes), "released"),
            "capabilities": next((r["capabilities"] for r in runtimes if r["capabilities"]), None),
            "loads": sum(r["loads"] for r in runtimes),
            "resources": resource_snapshot(),
        }
    )


def resource_snapshot() -> dict[str, Any]:
    import psutil

    proc = psutil.Process()
    vm = psutil.virtual_memory()
    snap: dict[str, Any] = {
        "rss_bytes": proc.memory_info().rss,
        "cpu_percent": proc.cpu_percent(None),
        "ram_total_bytes": vm.total,
        "ram_available_bytes": vm.available,
    }
    torch = sys.modules.get("torch")  # never import torch from the status thread
    if torch is not None and torch.cuda.is_available():
        free, total = torch.cuda.mem_get_info()
        snap.update(gpu_free_bytes=free, gpu_total_bytes=total)
    return snap


_CAPABILITIES: dict[tuple, dict[str, Any]] = {}  # per runtime, kept when idle eviction releases it


def _capabilities(key: tuple, rt) -> dict[str, Any] | None:
    """What the model can do (the API refuses what it cannot before queueing); read once loaded."""
    if key not in _CAPABILITIES and rt.loaded:
        _CAPABILITIES[key] = dataclasses.asdict(rt.adapter.capabilities)
    return _CAPABILITIES.get(key)


def runtimes_snapshot(config: str | None = None) -> list[dict[str, Any]]:
    rt_module = sys.modules.get("shotloom.runtime")
    if rt_module is None:
        return []
    wanted = None if config is None else os.path.realpath(config)
    return [
        {
            "config": key[0],
            "device": key[1],
            "checkpoint": key[2],
            "loaded": rt.loaded,
            "loads": rt.loads,
            "generator_loads": rt.generator_loads,
            "location": rt.weight_location(),
            "capabilities": _capabilities(key, rt),
        }
        # While the warm-up thread still imports the module, RUNTIMES may not exist yet.
        for key, rt in list(getattr(rt_module, "RUNTIMES", {}).items())
        if wanted is None or os.path.realpath(key[0]) == wanted
    ]


def loads() -> int:
    return sum(r["loads"] for r in runtimes_snapshot())


def loaded_runtimes() -> list:
    rt_module = sys.modules.get("shotloom.runtime")
    return [rt for rt in rt_module.RUNTIMES.values() if rt.loaded] if rt_module else []
