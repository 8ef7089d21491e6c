"""The FastAPI app of the R2V scheduler contract (r2v spec "HTTP API").

Reads answer from the service store (fast, and the same after a restart); writes go through
:class:`api.service.Intake`; Dagster is reached only by :class:`api.follower.Follower` and the
health check, over GraphQL. Built by :func:`create_app`; ``python -m api`` serves it.
"""

from __future__ import annotations

import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from fastapi import FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from api.dagster_client import DagsterGateway
from api.follower import Follower
from api.media_routes import media_router
from api.schemas import (
    CALLBACK_HEADER,
    AcceptedResponse,
    ArtifactResponse,
    HealthResponse,
    MergeRequest,
    R2VRequest,
    VersionResponse,
    validation_error_body,
)
from api.service import ApiError, Intake
from api.settings import ApiConfig
from api.store import JobRecord, Store
from api.views import VersionViews, artifact_response, task_fields

_ERRORS = {404: {"description": "Unknown id."}}
_WRITE_ERRORS = {
    409: {"description": "Conflicting reuse of a job_id, or a referenced shot that is unavailable."},
    422: {"description": "Invalid field, resource URL/path, or media; the message names the field."},
    503: {"description": "Not ready, or the queue is past its configured maximum."},
}
HEALTH_CACHE_S = 1.0  # /health is polled by admission loops: ask Dagster at most once a second
VERSION_CACHE_SIZE = 10_000  # cached GET /version bodies; cleared when full


@dataclass
class ApiContext:
    """Everything the routes need (built by ``python -m api`` or by tests)."""

    api: ApiConfig
    store: Store
    gateway: DagsterGateway
    follower: Follower
    intake: Intake
    media_root: Path
    worker_names: list[str]
    inference_config: str
    residency_policy: str
    _health: tuple[float, dict[str, Any]] | None = field(default=None, repr=False)


def create_app(ctx: ApiContext) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        ctx.follower.start()  # also reconciles jobs accepted before a crash but never submitted
        try:
            yield
        finally:
            ctx.follower.stop()

    app = FastAPI(
        title="shotloom R2V scheduler",
        version="0.1.0",
        description="Reference-to-video generation and merging, queued on Dagster device workers.",
        lifespan=lifespan,
    )
    base = ctx.api.base_url()

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(validation_error_body(exc.errors()), status_code=422)

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    def accepted(job: JobRecord, created: bool) -> Response:
        job, position, artifacts = ctx.store.version_view(job.version_id)
        body = AcceptedResponse(**task_fields(job, position, artifacts, base)).model_dump_json()
        return Response(body, status_code=202 if created else 200, media_type="application/json")

    def ready_or_503() -> None:
        if not ctx.follower.started:
            raise ApiError(503, "the service is starting")

    @app.post(
        "/r2v",
        response_model=AcceptedResponse,
        status_code=202,
        responses={200: {"description": "Replay of an earlier job_id: the original task."}, **_WRITE_ERRORS},
    )
    def post_r2v(
        req: R2VRequest,
        callback_header: Annotated[str | None, Header(alias=CALLBACK_HEADER)] = None,
    ) -> Response:
        """Queue one reference-to-video job; poll ``status_url``."""
        ready_or_503()
        result = ctx.intake.accept_r2v(req, callback_header)
        return accepted(result.job, result.created)

    @app.post(
        "/merge",
        response_model=AcceptedResponse,
        status_code=202,
        responses={200: {"description": "Replay of an earlier job_id: the original task."}, **_WRITE_ERRORS},
    )
    def post_merge(
        req: MergeRequest,
        callback_header: Annotated[str | None, Header(alias=CALLBACK_HEADER)] = None,
    ) -> Response:
        """Queue an ordered concatenation of shots (by ``version_id`` or ``video_url``)."""
        ready_or_503()
        result = ctx.intake.accept_merge(req, callback_header)
        return accepted(result.job, result.created)

    # Pollers hit this hard: served on the event loop (no threadpool hop) from cached bodies.
    views = VersionViews(ctx.store, base, VERSION_CACHE_SIZE)

    @app.get("/version/{version_id}", response_model=VersionResponse, responses=_ERRORS)
    async def get_version(version_id: str) -> Response:
        body = views.body(version_id)
        if body is None:
            raise ApiError(404, f"unknown version {version_id!r}")
        return Response(body, media_type="application/json")

    @app.get("/artifact/{artifact_id}", response_model=ArtifactResponse, responses=_ERRORS)
    async def get_artifact(artifact_id: str) -> Response:
        art = ctx.store.get_artifact(artifact_id)
        if art is None:
            raise ApiError(404, f"unknown artifact {artifact_id!r}")
        return Response(artifact_response(art, base).model_dump_json(), media_type="application/json")

    @app.get("/health", response_model=HealthResponse, responses={503: {"description": "Not ready."}})
    def get_health() -> JSONResponse:
        body = health(ctx)
        return JSONResponse(body, status_code=200 if body["status"] == "ok" else 503)

    app.include_router(media_router(ctx.media_root))
    return app


def ffmpeg_available() -> bool:
    """The encoders the MP4 writer needs, in the FFmpeg that PyAV bundles."""
    import av

    try:
        for name in ("libx264", "aac"):
            av.codec.Codec(name, "w")
    except Exception:
        return False
    return True


def health(ctx: ApiContext) -> dict[str, Any]:
    now = time.monotonic()
    if ctx._health is not None and now - ctx._health[0] < HEALTH_CACHE_S:
        return ctx._health[1]
    try:
        webserver = ctx.gateway.ping()
        daemon = ctx.gateway.daemon_healthy() if webserver else None
    except Exception:
        webserver, daemon = False, None
    snaps = ctx.follower.workers
    workers = []
    for name in ctx.worker_names:
        s = snaps.get(name, {"state": "unregistered"})
        run_id = s.get("run_id")
        job = ctx.store.by_run_id(run_id) if run_id else None
        workers.append(
            {
                "name": name,
                "device": s.get("device"),
                "state": s.get("state"),
                "ready": s.get("state") in ("idle", "busy"),
                "task": {"version_id": job.version_id, "kind": job.kind, "stage": job.stage} if job else None,
                "run_id": run_id,
                "weight_location": s.get("weight_location"),
                "weights_loaded": s.get("weights_loaded"),
                "loads": s.get("loads"),
                "resources": s.get("resources"),
                "admission_plan": s.get("admission_plan"),
                "dit_residency": s.get("dit_residency"),
            }
        )
    ready = {
        "api": ctx.follower.started,
        "webserver": bool(webserver),
        "daemon": bool(daemon),
        "workers": bool(workers) and all(w["ready"] for w in workers),
    }
    queues = {kind: ctx.store.counts_by_status(kind) for kind in ("r2v", "merge")}
    busy = sum(1 for w in workers if w["state"] == "busy")
    body = HealthResponse(
        status="ok" if all(ready.values()) else "starting",
        inference={
            "enabled": bool(ctx.worker_names),
            "workers": workers,
            "config": ctx.inference_config,
            "residency": ctx.residency_policy,
        },
        queues=queues,
        scheduler={
            "workers_total": len(workers),
            "workers_ready": sum(1 for w in workers if w["ready"]),
            "workers_busy": busy,
            "workers_idle": sum(1 for w in workers if w["state"] == "idle"),
            "pending_tasks": queues["r2v"]["queued"] + queues["merge"]["queued"],
            "running_tasks": queues["r2v"]["running"] + queues["merge"]["running"],
            "max_queue": ctx.api.max_queue,
            **ctx.follower.counters,
        },
        ffmpeg_available=ffmpeg_available(),
        ready=ready,
    ).model_dump(mode="json")
    ctx._health = (now, body)
    return body
