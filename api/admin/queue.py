"""Operator routes: queue control over HTTP (behind the API key when keys are set).

    GET  /queue                             paused or not, queued and running jobs (in queue order)
    POST /queue/pause, /queue/resume        intake to the devices (queued jobs wait; nothing is lost)
    POST /queue/jobs/{version_id}/priority  {"priority": int}: higher runs first
    POST /queue/works/{work_id}/cancel      every queued job of a work

The daemon's run coordinator applies pause and priorities at its next dequeue and records each as
an event on the runs it affects (:mod:`orchestration.coordinator`).
"""

from __future__ import annotations

import uuid
from typing import Any, Literal

from fastapi import APIRouter, Depends
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field

from api.context import ApiContext
from api.core.errors import (
    BodyTimeout,
    Conflict,
    InvalidField,
    NotFound,
    NotReady,
    QueueFull,
    Unavailable,
)
from api.deps import submitter_dependency
from api.errors import ApiError, StatusTable, status_table_errors

# The r2v table but for a full queue: 429 with Retry-After (a batch trigger waits and tries again;
# the server is not at fault).
_STATUS: StatusTable = (
    (InvalidField, 422),
    (NotFound, 404),
    (Conflict, 409),
    (NotReady, 409),
    (QueueFull, 429),
    (Unavailable, 503),
    (BodyTimeout, 408),
)
queue_errors = status_table_errors(_STATUS)


class PriorityRequest(BaseModel):
    priority: int = Field(ge=-1000, le=1000, description="Higher runs first; 0 is the default.")


class RerenderRequest(BaseModel):
    works: list[str] | None = Field(default=None, description="Works to re-render (default: all).")
    shots: list[str] | None = Field(default=None, description="Shot ids (default: every shot).")
    match: dict[Literal["shotloom/kind", "user"], str] | None = Field(
        default=None, description='Only shots whose runs carry these tags, e.g. {"user": "studio-a"}.'
    )
    seed: Literal["keep", "new"] = "keep"
    priority: int = Field(default=-10, ge=-1000, le=1000, description="Below interactive requests (0).")
    reason: str = Field(default="manual", min_length=1, max_length=63, pattern=r"^[A-Za-z0-9_.-]+$")
    requested_by: str | None = Field(
        default=None,
        max_length=127,
        pattern=r"^[A-Za-z0-9_.:-]+$",
        description='Who asked: the runs\' "launched by" (e.g. "schedule:nightly"); default: the key name.',
    )
    key: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        description="Idempotency: the same key queues nothing twice.",
    )


class QueueState(BaseModel):
    paused: bool
    paused_by: str | None = None
    paused_at: float | None = None
    queued: list[dict[str, Any]] = Field(description="Queued jobs in the order they will start.")
    running: int


def operator_router(ctx: ApiContext) -> APIRouter:
    submitter = submitter_dependency(ctx.keys, lambda message: ApiError(401, message))
    router = APIRouter(prefix="/queue", tags=["operator"], dependencies=[Depends(submitter)])
    control = ctx.jobs.queue

    def state() -> QueueState:
        paused = control.paused()
        positions = ctx.store.queue_positions()
        queued = []
        for version_id, position in sorted(positions.items(), key=lambda kv: kv[1]):
            job = ctx.store.get(version_id)
            if job is not None:
                fields = ("version_id", "kind", "work_id", "shot_id", "priority")
                queued.append({**{k: getattr(job, k) for k in fields}, "position": position})
        running = sum(ctx.store.counts_by_status(k)["running"] for k in ("r2v", "merge"))
        return QueueState(
            paused=paused is not None,
            paused_by=(paused or {}).get("by"),
            paused_at=(paused or {}).get("at"),
            queued=queued,
            running=running,
        )

    @router.get("", response_model=QueueState)
    def get_queue() -> QueueState:
        return state()

    @router.post("/pause", response_model=QueueState)
    def pause(who: str = Depends(submitter)) -> QueueState:  # noqa: B008 - FastAPI resolves it per request
        """Stop starting device runs: queued jobs wait (merges still run); nothing is lost."""
        control.pause(who)
        return state()

    @router.post("/resume", response_model=QueueState)
    def resume() -> QueueState:
        control.resume()
        return state()

    @router.post("/jobs/{version_id}/priority", responses={404: {}, 409: {"description": "Not queued."}})
    async def set_priority(
        version_id: str,
        body: PriorityRequest,
        who: str = Depends(submitter),  # noqa: B008 - FastAPI resolves it per request
    ) -> dict[str, Any]:
        with queue_errors():
            job = await run_in_threadpool(ctx.jobs.set_priority, version_id, body.priority, who)
        return {
            "version_id": job.version_id,
            "priority": job.priority,
            "position": ctx.store.queue_position(version_id),
        }

    @router.post(
        "/rerender",
        responses={
            401: {"description": "A missing or unknown API key."},
            429: {
                "description": "The r2v queue is full: send the same key again after Retry-After seconds "
                "(the shots it already queued are not queued twice).",
                "headers": {
                    "Retry-After": {"description": "Seconds to wait.", "schema": {"type": "integer"}}
                },
            },
        },
    )
    async def rerender(
        body: RerenderRequest,
        who: str = Depends(submitter),  # noqa: B008 - FastAPI resolves it per request
    ) -> dict[str, Any]:
        """A new version of every matching shot, from the same request and inputs (its newest
        success), queued below interactive work; the runs carry ``shotloom/rerender: <reason>``."""
        key = body.key or uuid.uuid4().hex
        with queue_errors():
            accepted = await run_in_threadpool(
                ctx.jobs.rerender,
                body.works,
                body.shots,
                body.seed,
                body.priority,
                body.reason,
                key,
                body.requested_by or who,
                body.match,
            )
        return {
            "key": key,
            "accepted": [
                {"version_id": a.job.version_id, "work_id": a.job.work_id, "shot_id": a.job.shot_id,
                 "rerender_of": a.job.request.rerender.of, "created": a.created}
                for a in accepted
            ],
        }  # fmt: skip

    @router.post("/works/{work_id}/cancel")
    async def cancel_work(
        work_id: str,
        who: str = Depends(submitter),  # noqa: B008 - FastAPI resolves it per request
    ) -> dict[str, Any]:
        jobs = await run_in_threadpool(ctx.jobs.cancel_work, work_id, who)
        return {"work_id": work_id, "cancelled": [j.version_id for j in jobs]}

    return router
