"""The door before the routers, for the routes outside ``/v1`` (whose upload path guards its own
body, :mod:`api.openai.uploads`): a request that carries a body is refused before a byte of it is
read when it holds no valid API key (keys set) or declares more than ``api.max_body_bytes``; one
sent without a length is cut at that size, or once it sends nothing for ``api.body_idle_timeout_s``.
FastAPI parses a JSON body before its dependencies run, so without this door a client with no key
could make the API hold any body it cares to send."""

from __future__ import annotations

import asyncio
import json

from fastapi import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.auth import KEY_REQUIRED, KeyRing
from api.errors import ApiError
from api.openai.errors import is_openai_path
from settings.api import ApiConfig

BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# Routes with their own credentials: the workers' nudge holds the workers' token, not a client key.
OWN_CREDENTIALS = frozenset({"/internal/run-ended"})


class BodyRefused(HTTPException):
    """Raised from the body's reads (a body past the limit, or stalled): an HTTPException, which
    FastAPI lets through its body parsing (any other error there becomes a 400), carrying the
    R2V dialect's error, which the app's handler answers."""

    def __init__(self, error: ApiError):
        super().__init__(error.status, error.message)
        self.error = error


class RequestGate:
    def __init__(self, app: ASGIApp, api: ApiConfig, keys: KeyRing):
        self.app, self.api, self.keys = app, api, keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in BODY_METHODS or is_openai_path(scope["path"]):
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        if self.keys.enabled and scope["path"] not in OWN_CREDENTIALS:
            given = headers.get(b"authorization")
            if self.keys.name_of(given.decode("latin-1") if given is not None else None) is None:
                await _answer(send, ApiError(401, KEY_REQUIRED))
                return
        limit = self.api.max_body_bytes
        raw = headers.get(b"content-length", b"")
        if raw.isdigit() and int(raw) > limit:
            await _answer(
                send, ApiError(413, f"the body is {int(raw)} bytes; this server takes at most {limit}")
            )
            return
        await self.app(scope, self._guarded(receive), send)

    def _guarded(self, receive: Receive) -> Receive:
        """``receive``, raising 413 past the limit or 408 when the body stalls (:class:`BodyRefused`)."""
        limit, idle = self.api.max_body_bytes, self.api.body_idle_timeout_s
        received, whole = 0, False

        async def guarded() -> Message:
            nonlocal received, whole
            if whole:  # after the body: what follows (a disconnect) is waited for as the app likes
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), idle)
            except TimeoutError:
                stalled = f"the body sent nothing for {idle:g} s ({received} bytes received)"
                raise BodyRefused(ApiError(408, stalled)) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    passed = f"the body passed {limit} bytes, the most this server takes"
                    raise BodyRefused(ApiError(413, passed))
                whole = not message.get("more_body", False)
            return message

        return guarded


async def _answer(send: Send, error: ApiError) -> None:
    """The error as the routers answer it (the R2V dialect's body), the body never read."""
    body = json.dumps(error.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
