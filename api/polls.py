"""The pollers' fast path: a job's cached view answered ahead of FastAPI's routing.

``GET /version/{id}`` and ``GET /v1/videos/{id}`` are what clients hit in a loop. Their answer is a
cached body (:mod:`api.core.views`), yet FastAPI's middleware, route matching and dependency
solving cost about twice the answer itself (py-spy under ``bench/api.py``), and on a busy host
that is the pollers' tail latency. Each dialect registers the function its own route answers
with under its path prefix; this middleware calls the same function first. What it is not sure
of (an unknown id, a missing or wrong key, a path with more segments) goes on to FastAPI, which
owns every error, so the two paths cannot answer differently.

The same layer times every request for the metrics (:class:`RequestObserver`), labelled by the
template of the route that answered: one ASGI layer rather than two, since on the pollers' path
each layer's own cost shows (a separate timing middleware cost ~12% of GET /version's throughput).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.auth import KeyRing
from api.store import StoreUnavailable

# A job's cached answer for an id taken from the path; None: let the route say why not.
Answer = Callable[[str], Response | None]
UNMATCHED_ROUTE = "unmatched"  # no route answered: the label stays bounded whatever paths clients try


class RequestObserver(Protocol):
    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None: ...


class PollRoutes:
    """The fast answers, by the template of the route they stand in for (``/version/{version_id}``:
    the id is what follows ``/version/``)."""

    def __init__(self) -> None:
        self._answers: dict[str, tuple[str, Answer]] = {}  # prefix -> (template, answer)

    def add(self, template: str, answer: Answer) -> None:
        prefix = template.split("{", 1)[0]
        self._answers[prefix] = (template, answer)

    def answer(self, path: str) -> tuple[str, Response] | None:
        """The route's template and its answer, or None: FastAPI answers."""
        for prefix, (template, answer) in self._answers.items():
            if path.startswith(prefix):
                key = path[len(prefix) :]
                try:
                    response = answer(key) if key and "/" not in key else None
                except StoreUnavailable:  # the route answers it (503 in its dialect's shape)
                    return None
                return None if response is None else (template, response)
        return None


class PollFastPath:
    """ASGI middleware serving :class:`PollRoutes` to authorised ``GET`` requests, and timing
    every HTTP request for ``requests`` (when given)."""

    def __init__(
        self, app: ASGIApp, polls: PollRoutes, keys: KeyRing, requests: RequestObserver | None = None
    ):
        self.app, self.polls, self.keys, self.requests = app, polls, keys, requests

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        route, status = None, 500  # 500: the app raised before it answered
        try:
            if scope["method"] == "GET" and self._authorised(scope):
                answered = self.polls.answer(scope["path"])
                if answered is not None:
                    route, response = answered
                    status = response.status_code
                    await response(scope, receive, send)
                    return
            if self.requests is None:
                await self.app(scope, receive, send)
                return

            async def sent(message: Message) -> None:
                nonlocal status
                if message["type"] == "http.response.start":
                    status = message["status"]
                await send(message)

            await self.app(scope, receive, sent)
        finally:
            if self.requests is not None:
                self.requests.observe_request(
                    scope["method"], route or route_template(scope), status, time.perf_counter() - start
                )

    def _authorised(self, scope: Scope) -> bool:
        if not self.keys.enabled:
            return True
        header = next((v for k, v in scope["headers"] if k == b"authorization"), None)
        return self.keys.name_of(header.decode("latin-1") if header is not None else None) is not None


def route_template(scope: Scope) -> str:
    """The template of the FastAPI route that answered (``/version/{version_id}``), never the path."""
    path = getattr(scope.get("route"), "path", None)
    return path if isinstance(path, str) else UNMATCHED_ROUTE
