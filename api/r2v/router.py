"""The R2V scheduler dialect's routes (r2v spec "HTTP API"): POST /r2v, POST /merge,
GET /version/{id}, GET /artifact/{id}. Reads answer from the service store (fast, and the same
after a restart); writes go through the job service."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Header, Request
from fastapi.responses import Response

from api.context import ApiContext
from api.core.events import SSE_RESPONSES, job_events
from api.core.records import JobRecord
from api.deps import submitter_dependency
from api.errors import ApiError
from api.polls import PollRoutes
from api.r2v.protocol import (
    CALLBACK_HEADER,
    AcceptedResponse,
    ArtifactResponse,
    MergeRequest,
    R2VRequest,
    VersionResponse,
)
from api.r2v.serving import R2VServing
from api.r2v.views import artifact_response, task_fields, version_views

VERSION_CACHE_SIZE = 10_000  # cached GET /version bodies; cleared when full
_ERRORS = {401: {"description": "A missing or unknown API key."}, 404: {"description": "Unknown id."}}
_WRITE_ERRORS = {
    409: {"description": "Conflicting reuse of a job_id, or a referenced shot that is unavailable."},
    422: {"description": "Invalid field, resource URL/path, or media; the message names the field."},
    501: {"description": "The H.264/AAC encoder the MP4 writer needs is missing."},
    503: {
        "description": "Not ready, the queue past its configured maximum, or the service's database "
        "away (with Retry-After; nothing was changed)."
    },
    507: {"description": "A disk the service writes to is below api.min_free_mb: send again later."},
}
_REPLAY = {200: {"description": "Replay of an earlier job_id: the original task."}}


def r2v_router(ctx: ApiContext, polls: PollRoutes) -> APIRouter:
    submitter = submitter_dependency(ctx.keys, lambda message: ApiError(401, message))
    router = APIRouter(tags=["r2v"], dependencies=[Depends(submitter)])
    serving = R2VServing(ctx.jobs)
    base = ctx.api.base_url()

    def accepted(job: JobRecord, created: bool) -> Response:
        job, position, artifacts = ctx.store.version_view(job.version_id)
        body = AcceptedResponse(**task_fields(job, position, artifacts, base)).model_dump_json()
        return Response(body, status_code=202 if created else 200, media_type="application/json")

    def ready_or_503() -> None:
        if not ctx.background.started:
            raise ApiError(503, "the service is starting")

    @router.post(
        "/r2v", response_model=AcceptedResponse, status_code=202, responses={**_REPLAY, **_WRITE_ERRORS}
    )
    def post_r2v(
        req: R2VRequest,
        who: str = Depends(submitter),  # noqa: B008 - FastAPI resolves it per request
        callback_header: Annotated[str | None, Header(alias=CALLBACK_HEADER)] = None,
    ) -> Response:
        """Queue one reference-to-video job; poll ``status_url``."""
        ready_or_503()
        result = serving.accept_r2v(req, callback_header, who)
        return accepted(result.job, result.created)

    @router.post(
        "/merge", response_model=AcceptedResponse, status_code=202, responses={**_REPLAY, **_WRITE_ERRORS}
    )
    def post_merge(
        req: MergeRequest,
        who: str = Depends(submitter),  # noqa: B008 - FastAPI resolves it per request
        callback_header: Annotated[str | None, Header(alias=CALLBACK_HEADER)] = None,
    ) -> Response:
        """Queue an ordered concatenation of shots (by ``version_id`` or ``video_url``)."""
        ready_or_503()
        result = serving.accept_merge(req, callback_header, who)
        return accepted(result.job, result.created)

    # Pollers hit this hard: cached bodies, served on the event loop (no threadpool hop) and,
    # with the caller's key checked, ahead of FastAPI's routing (api.polls).
    views = version_views(ctx.store, base, VERSION_CACHE_SIZE, ctx.jobs.sampling)

    def version_answer(version_id: str) -> Response | None:
        body = views.get(version_id)
        return Response(body, media_type="application/json") if body is not None else None

    polls.add("/version/{version_id}", version_answer)

    @router.get("/version/{version_id}", response_model=VersionResponse, responses=_ERRORS)
    async def get_version(version_id: str) -> Response:
        answer = version_answer(version_id)
        if answer is None:
            raise ApiError(404, f"unknown version {version_id!r}")
        return answer

    @router.get("/version/{version_id}/events", responses={**_ERRORS, **SSE_RESPONSES})
    async def version_events(version_id: str, request: Request) -> Response:
        """Server-Sent Events: the version (as ``GET /version/{id}`` answers it) each time it changes,
        ``event: update`` until ``event: done``; reconnect with ``Last-Event-ID`` to resume."""
        if views.get(version_id) is None:
            raise ApiError(404, f"unknown version {version_id!r}")

        def render() -> str | None:
            body = views.get(version_id)
            return body.decode() if body is not None else None

        return job_events(request, ctx.store, version_id, render)

    @router.get("/artifact/{artifact_id}", response_model=ArtifactResponse, responses=_ERRORS)
    async def get_artifact(artifact_id: str) -> Response:
        art = ctx.store.get_artifact(artifact_id)
        if art is None:
            raise ApiError(404, f"unknown artifact {artifact_id!r}")
        return Response(artifact_response(art, base).model_dump_json(), media_type="application/json")

    return router
