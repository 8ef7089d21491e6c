"""The pollers' fast path: a job's cached view answered ahead of FastAPI's routing.

``GET /version/{id}`` and ``GET /v1/videos/{id}`` are what clients hit in a loop. Their answer is a
cached body (:mod:`api.core.views`), yet FastAPI's middleware, route matching and dependency
solving cost about twice the answer itself (py-spy under ``bench/api.py``), and on a busy host
that is the pollers' tail latency. Each dialect registers the function its own route answers
with under its path prefix; this middleware calls the same function first. What it is not sure
of (an unknown id, a missing or wrong key, a path with more segments) goes on to FastAPI, which
owns every error, so the two paths cannot answer differently.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from api.auth import KeyRing

# A job's cached answer for an id taken from the path; None: let the route say why not.
Answer = Callable[[str], Response | None]


class PollRoutes:
    """The fast answers, by path prefix (``/version/`` -> the id that follows it)."""

    def __init__(self) -> None:
        self._answers: dict[str, Answer] = {}

    def add(self, prefix: str, answer: Answer) -> None:
        self._answers[prefix] = answer

    def answer(self, path: str) -> Response | None:
        for prefix, answer in self._answers.items():
            if path.startswith(prefix):
                key = path[len(prefix) :]
                return answer(key) if key and "/" not in key else None
        return None


class PollFastPath:
    """ASGI middleware serving :class:`PollRoutes` to authorised ``GET`` requests."""

    def __init__(self, app: ASGIApp, polls: PollRoutes, keys: KeyRing):
        self.app, self.polls, self.keys = app, polls, keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "GET" and self._authorised(scope):
            response = self.polls.answer(scope["path"])
            if response is not None:
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _authorised(self, scope: Scope) -> bool:
        if not self.keys.enabled:
            return True
        header = next((v for k, v in scope["headers"] if k == b"authorization"), None)
        return self.keys.name_of(header.decode("latin-1") if header is not None else None) is not None
