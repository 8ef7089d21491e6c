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
# Where a fast answer leaves its route's template in the request's scope (as FastAPI leaves its
# route there), for what labels requests by route (api.admin.metrics).
POLL_ROUTE_KEY = "shotloom.route"


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
                response = answer(key) if key and "/" not in key else None
                return None if response is None else (template, response)
        return None


class PollFastPath:
    """ASGI middleware serving :class:`PollRoutes` to authorised ``GET`` requests."""

    def __init__(self, app: ASGIApp, polls: PollRoutes, keys: KeyRing):
        self.app, self.polls, self.keys = app, polls, keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "GET" and self._authorised(scope):
            answered = self.polls.answer(scope["path"])
            if answered is not None:
                scope[POLL_ROUTE_KEY], response = answered
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _authorised(self, scope: Scope) -> bool:
        if not self.keys.enabled:
            return True
        header = next((v for k, v in scope["headers"] if k == b"authorization"), None)
        return self.keys.name_of(header.decode("latin-1") if header is not None else None) is not None
