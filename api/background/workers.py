"""What each registered worker says of itself (its ``GET /status``), refreshed in the background:
``/health``, the job views (a running job's worker) and the models' capabilities read it."""

from __future__ import annotations

from typing import Any

from orchestration.launcher import WorkerError, worker_status
from orchestration.registry import WorkerRegistry

STATUS_TIMEOUT_S = 2.0  # a worker busy denoising still answers /status from its own thread
READY_STATES = frozenset({"idle", "busy"})  # a worker that takes runs (/health's ready, /metrics' up)


def expected_workers(snapshots: dict[str, dict[str, Any]], pool: str, configured: list[str]) -> list[str]:
    """This host's configured workers of ``pool`` and every worker of the pool registered on any
    host (one that stopped cleanly withdrew; one that vanished is missing until it is back)."""
    registered = (n for n, s in snapshots.items() if s.get("pool") == pool and s.get("state") != "stopped")
    return list(dict.fromkeys([*configured, *registered]))


class WorkerStatuses:
    def __init__(self, registry: WorkerRegistry | None):
        self.registry = registry  # the workers, as they registered in Dagster's storage
        self.snapshots: dict[str, dict[str, Any]] = {}  # worker name -> its latest /status

    def refresh(self) -> None:
        snaps = {}
        for rec in self.registry.records():
            known = {"name": rec.name, "pool": rec.pool, "device": rec.device, "host": rec.host}
            if rec.heartbeat <= 0:  # withdrawn: it stopped cleanly
                snaps[rec.name] = {**known, "state": "stopped"}
                continue
            try:
                status = worker_status(rec.url, timeout=STATUS_TIMEOUT_S)
                snaps[rec.name] = {**known, **status.model_dump(mode="json")}
            except WorkerError:
                snaps[rec.name] = {**known, "state": "unreachable"}
        self.snapshots = snaps

    def get(self, name: str) -> dict[str, Any]:
        return self.snapshots.get(name, {})

    def capabilities(self) -> dict[str, Any] | None:
        """What the loaded model can do, as the first worker that loaded it publishes it."""
        return next((w["capabilities"] for w in self.snapshots.values() if w.get("capabilities")), None)
