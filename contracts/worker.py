"""A worker's HTTP protocol (served by :mod:`orchestration.worker.http`; called by the launcher,
the API's background work and ``server.py``): what ``GET /status`` answers, the run offer
``POST /runs`` takes and what it and ``POST /runs/<id>/terminate`` answer."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

STATUS_PATH = "/status"
RUNS_PATH = "/runs"

WorkerState = Literal["starting", "warming", "idle", "busy", "stopping"]


def terminate_path(run_id: str) -> str:
    return f"{RUNS_PATH}/{run_id}/terminate"


class _Answer(BaseModel):
    # A worker of a later release may say more; a reader takes what it knows.
    model_config = ConfigDict(extra="ignore", frozen=True)


class GroupStatus(_Answer):
    """A device group's ranks as rank 0 sees them."""

    ranks: int
    parallel: dict[str, Any]
    follower_pids: list[int] = Field(default_factory=list)
    dead_ranks: list[int] = Field(default_factory=list)


class WorkerStatus(_Answer):
    """``GET /status``: who the worker is, what it runs and has run, where its weights are, and
    what its device and process have left."""

    name: str
    pool: str
    device: str
    threads: int | None = None
    nice: int = 0
    pid: int
    boot_id: str
    state: WorkerState
    run_id: str | None = None
    pending_run_id: str | None = None  # offered and accepted, not started yet
    finished_run_ids: list[str] = Field(default_factory=list)  # recent ones, for run monitoring

    def holds(self, run_id: str) -> bool:
        """Running ``run_id``, or accepted it and about to."""
        return run_id in (self.run_id, self.pending_run_id)

    runs_done: int = 0
    admission_plan: dict[str, Any] | None = None
    dit_residency: dict[str, Any] | None = None
    residency_policy: str | None = None
    group: GroupStatus | None = None
    weights: list[dict[str, Any]] = Field(default_factory=list)  # one entry per loaded runtime
    weights_loaded: bool = False
    weight_location: str = "released"
    capabilities: dict[str, Any] | None = None  # what the loaded model can do (the rule book's)
    loads: int = 0
    resources: dict[str, Any] = Field(default_factory=dict)


class RunOffer(BaseModel):
    """``POST /runs``: the launcher offers a run (``resume``: after its worker died mid-run)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: str = Field(min_length=1)
    resume: bool = False


class OfferAnswer(_Answer):
    """202 accepted, or 409 (busy: offer it elsewhere)."""

    accepted: bool
    pid: int | None = None
    boot_id: str | None = None


class TerminateAnswer(_Answer):
    terminated: bool
