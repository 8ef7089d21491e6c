"""``GET /health``: the service is ready when the API, the Dagster webserver and daemon, every
configured device and media worker, and the service's database are up (503 otherwise, with what
is missing); both dialects share it. ``status``: ``ok`` (200); ``starting`` (503) while parts
are still coming up; ``degraded`` (503) once a part is gone: a worker that vanished, stopped or
is stopping, or any part down after the service had been ``ok``."""

from __future__ import annotations

import time
from typing import Any, Literal

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from api.background.workers import READY_STATES, expected_workers
from api.context import ApiContext
from api.store import STATUSES, StoreUnavailable

HEALTH_CACHE_S = 1.0  # /health is polled by admission loops: ask Dagster at most once a second
# Worker states that mean it is gone (the follower's ``unreachable``/``stopped``, the worker's own
# ``stopping``), as opposed to not up yet (``unregistered``, ``starting``, ``warming``).
GONE = frozenset({"unreachable", "stopped", "stopping"})


class InferenceHealth(BaseModel):
    model_config = ConfigDict(extra="allow")
    enabled: bool
    workers: list[dict[str, Any]] = Field(default_factory=list)
    config: str | None = None
    residency: str | None = None


class HealthResponse(BaseModel):
    model_config = ConfigDict(extra="allow")
    status: Literal["ok", "starting", "degraded"]
    inference: InferenceHealth
    queues: dict[str, dict[str, int]] = Field(description="{'r2v': {status: n}, 'merge': {status: n}}")
    scheduler: dict[str, Any] = Field(
        default_factory=dict,
        description="Worker and pending-task counters; gpu_busy, total_queued and "
        "queues.inference.workers are what the Echo Director's admission reads.",
    )
    media_workers: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Workers that run the media work (merges, stills, frames taken from videos): "
        "name, state, ready, run_id. None on any host: not ready (no shot could finish).",
    )
    ffmpeg_available: bool


def ffmpeg_available() -> bool:
    """The encoders the MP4 writer needs, in the FFmpeg that PyAV bundles."""
    return not missing_encoders()


def missing_encoders() -> list[str]:
    import av

    missing = []
    for name in ("libx264", "aac"):
        try:
            av.codec.Codec(name, "w")
        except Exception:
            missing.append(name)
    return missing


def health_status(ready: dict[str, bool], workers: list[dict[str, Any]], was_ok: bool) -> str:
    """``ok`` when every part is ready; else ``degraded`` when a part is gone (a worker in
    :data:`GONE`, or anything down once the service has been ``ok``), ``starting`` otherwise (the
    API, Dagster or workers still coming up)."""
    if all(ready.values()):
        return "ok"
    if ready.get("api") and (was_ok or any(w.get("state") in GONE for w in workers)):
        return "degraded"
    return "starting"


def health_router(ctx: ApiContext) -> APIRouter:
    router = APIRouter(tags=["health"])

    @router.get("/health", response_model=HealthResponse, responses={503: {"description": "Not ready."}})
    def get_health() -> JSONResponse:
        body = health(ctx)
        return JSONResponse(body, status_code=200 if body["status"] == "ok" else 503)

    return router


def health(ctx: ApiContext) -> dict[str, Any]:
    now = time.monotonic()
    if ctx.health_cache is not None and now - ctx.health_cache[0] < HEALTH_CACHE_S:
        return ctx.health_cache[1]
    try:
        webserver = ctx.gateway.ping()
        daemon = ctx.gateway.daemon_healthy() if webserver else None
    except Exception:
        webserver, daemon = False, None
    snaps = ctx.background.workers
    names = expected_workers(snaps, "device", ctx.worker_names)
    try:  # the database away: /health still answers (503, what the store would say left out)
        queues = {kind: ctx.store.counts_by_status(kind) for kind in ("r2v", "merge")}
        run_ids = [run_id for name in names if (run_id := snaps.get(name, {}).get("run_id"))]
        jobs = {run_id: ctx.store.by_run_id(run_id) for run_id in run_ids}
        store_ok = True
    except StoreUnavailable:
        queues = {kind: dict.fromkeys(STATUSES, 0) for kind in ("r2v", "merge")}
        jobs, store_ok = {}, False

    disks = ctx.jobs.volumes()

    workers = []
    for name in names:
        s = snaps.get(name, {"state": "unregistered"})
        run_id = s.get("run_id")
        job = jobs.get(run_id) if run_id else None
        workers.append(
            {
                "name": name,
                "host": s.get("host"),
                "device": s.get("device"),
                "state": s.get("state"),
                "ready": s.get("state") in READY_STATES,
                "task": {"version_id": job.version_id, "kind": job.kind, "stage": job.stage} if job else None,
                "run_id": run_id,
                "weight_location": s.get("weight_location"),
                "weights_loaded": s.get("weights_loaded"),
                "loads": s.get("loads"),
                "resources": s.get("resources"),
                "admission_plan": s.get("admission_plan"),
                "dit_residency": s.get("dit_residency"),
                "group": s.get("group"),  # a device group: its ranks, split and followers
            }
        )
    media = [
        {"name": name, "state": (s := snaps.get(name, {"state": "unregistered"})).get("state"),
         "ready": s.get("state") in READY_STATES, "run_id": s.get("run_id")}
        for name in expected_workers(snaps, "media", ctx.media_worker_names)
    ]  # fmt: skip
    ready = {
        "api": ctx.background.started,
        "webserver": bool(webserver),
        "daemon": bool(daemon),
        "workers": bool(workers) and all(w["ready"] for w in workers),  # one device at least
        "media_workers": bool(media) and all(w["ready"] for w in media),  # shots end on one
        "store": store_ok,  # the service's database answers
        "disk": all(v.ok for v in disks),  # room on the media root's and state dir's disks
    }
    busy = sum(1 for w in workers if w["state"] == "busy")
    status = health_status(ready, [*workers, *media], ctx.health_was_ok)
    ctx.health_was_ok = ctx.health_was_ok or status == "ok"
    body = HealthResponse(
        status=status,
        inference={
            "enabled": bool(workers),
            "workers": workers,
            "config": ctx.inference_config,
            "residency": ctx.residency_policy,
        },
        queues=queues,
        media_workers=media,
        scheduler={
            "workers_total": len(workers),
            "workers_ready": sum(1 for w in workers if w["ready"]),
            "workers_busy": busy,
            "workers_idle": sum(1 for w in workers if w["state"] == "idle"),
            "pending_tasks": queues["r2v"]["queued"] + queues["merge"]["queued"],
            "running_tasks": queues["r2v"]["running"] + queues["merge"]["running"],
            "max_queue": ctx.api.max_queue,
            **ctx.background.counters,
            # What the Echo Director's admission reads (it holds new generations back while
            # gpu_busy + total_queued >= queues.inference.workers): the device workers, those
            # generating, and the shots waiting for one (merges wait for media workers instead).
            "queues": {"inference": {"workers": len(workers)}},
            "gpu_busy": busy,
            "total_queued": queues["r2v"]["queued"],
        },
        ffmpeg_available=ffmpeg_available(),
        ready=ready,
        disk=[
            {"name": v.name, "free_bytes": v.free_bytes, "min_free_bytes": v.min_free_bytes, "ok": v.ok}
            for v in disks
        ],
    ).model_dump(mode="json")
    ctx.health_cache = (now, body)
    return body
