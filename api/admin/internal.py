"""What the workers tell the API: a run ended. The follower reads unfinished runs every
``follow_interval_seconds``; told, it reads them at once, so a finished job reads as finished
without waiting for its next tick. A nudge only: nothing in the call is trusted or read, and a
missed one costs one tick. Callers hold the workers' shared token when one is set."""

from __future__ import annotations

import hmac
import os

from fastapi import APIRouter, Request, Response

from api.context import ApiContext
from orchestration.launcher import WORKER_TOKEN_ENV


def worker_calls_router(ctx: ApiContext) -> APIRouter:
    router = APIRouter(include_in_schema=False)

    @router.post("/internal/run-ended", status_code=204)
    def run_ended(request: Request) -> Response:
        token = os.environ.get(WORKER_TOKEN_ENV)
        given = request.headers.get("authorization", "")
        if token and not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            return Response(status_code=401)
        ctx.background.run_ended()
        return Response(status_code=204)

    return router
