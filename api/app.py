"""The HTTP app: one router per dialect (R2V scheduler, OpenAI-compatible), media and health.

Dagster is reached only by :class:`api.background.Background` and the health check, over GraphQL.
Each dialect maps errors to its own status codes and body shape; request validation errors are
sent to the dialect that owns the path. Built by :func:`create_app`; ``python -m api`` serves it.
"""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.telemetry import TelemetryConfig
from starlette.exceptions import HTTPException

from api.admin.health import health_router
from api.admin.internal import worker_calls_router
from api.admin.media import media_router
from api.admin.metrics import ServiceMetrics, metrics_router
from api.admin.queue import operator_router
from api.context import ApiContext
from api.deps import submitter_dependency
from api.errors import ApiError
from api.gate import BodyRefused, RequestGate
from api.openai.errors import (
    OpenAIError,
    http_error,
    is_openai_path,
    openai_error_response,
    validation_error_response,
)
from api.openai.router import openai_router, openai_submitter
from api.openai.serving import VideoServing
from api.openapi import install as install_openapi
from api.polls import PollFastPath, PollRoutes
from api.r2v.protocol import validation_error_body
from api.r2v.router import r2v_router
from api.store import StoreUnavailable
from settings.api import ApiConfig


def fastapi_telemetry(api: ApiConfig) -> TelemetryConfig | None:
    """FastAPI's OpenTelemetry instrumentation: its own defaults (on when a provider is configured)
    where ``api.opentelemetry`` asks for it, else off (no per-request look for a provider)."""
    return None if api.opentelemetry else {"tracing": False, "metrics": False, "logs": False}


def create_app(ctx: ApiContext) -> FastAPI:
    metrics = ServiceMetrics(
        ctx.store,
        lambda: ctx.background.workers,
        lambda: {"device": ctx.worker_names, "media": ctx.media_worker_names},
    )

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        ctx.background.start()  # also reconciles jobs accepted before a crash but never submitted
        try:
            yield
        finally:
            ctx.background.stop()
            metrics.close()

    app = FastAPI(
        title="shotloom",
        version="0.1.0",
        description="Video generation queued on Dagster device workers: the R2V scheduler API and "
        "the OpenAI-compatible video API (/v1).",
        lifespan=lifespan,
        # /openapi.json and /docs are served by api.openapi (behind the key when keys are set).
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
        telemetry=fastapi_telemetry(ctx.api),
    )

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        if is_openai_path(request.url.path):
            return validation_error_response(exc.errors())
        return JSONResponse(validation_error_body(exc.errors()), status_code=422)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> Response:
        """No such route (404), a wrong method (405): the envelope under /v1; elsewhere Starlette's
        own ``{"detail"}`` (which /media's 404 matches on purpose)."""
        if isinstance(exc, BodyRefused):  # the gate's 413 / 408, in the R2V dialect's shape
            return JSONResponse(exc.error.body(), status_code=exc.error.status)
        if is_openai_path(request.url.path):
            err = http_error(exc.status_code, request.method, request.url.path, exc.detail, exc.headers)
            return openai_error_response(err)
        return await http_exception_handler(request, exc)

    @app.exception_handler(ApiError)
    async def _r2v_error(_request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers())

    @app.exception_handler(OpenAIError)
    async def _openai_error(_request: Request, exc: OpenAIError) -> JSONResponse:
        return openai_error_response(exc)

    @app.exception_handler(StoreUnavailable)
    async def _store_away(request: Request, _exc: StoreUnavailable) -> JSONResponse:
        """The database is away (any route, either dialect): 503 and when to try again, never 500.
        Nothing was changed, so the same request (its idempotency key too) can simply be sent again."""
        message = (
            "the service's database is unavailable; nothing was changed: retry after Retry-After seconds"
        )
        retry = ctx.api.store_retry_after_seconds
        if is_openai_path(request.url.path):
            headers = {"Retry-After": str(retry)}
            return openai_error_response(OpenAIError(503, message, code="store_unavailable", headers=headers))
        error = ApiError(503, message, retry_after_s=retry)
        return JSONResponse(error.body(), status_code=503, headers=error.headers())

    polls = PollRoutes()
    app.include_router(r2v_router(ctx, polls))
    videos = VideoServing(ctx)
    app.include_router(openai_router(ctx, videos, polls))
    app.add_middleware(RequestGate, api=ctx.api, keys=ctx.keys)  # before a body is read: key and size
    app.add_middleware(PollFastPath, polls=polls, keys=ctx.keys, requests=metrics)  # times every request
    app.include_router(health_router(ctx))
    app.include_router(operator_router(ctx))
    app.include_router(worker_calls_router(ctx))
    submitter = submitter_dependency(ctx.keys, lambda message: ApiError(401, message))
    app.include_router(media_router(ctx.media_root), dependencies=[Depends(submitter)])
    app.include_router(metrics_router(metrics, submitter))
    install_openapi(
        app, videos.served_or_none, submitter, openai_submitter(ctx.keys), browsable=not ctx.keys.enabled
    )
    return app
