"""Request bodies read under limits, before anything is parsed: a declared ``Content-Length`` past
``max_body_bytes`` is 413 before the first byte is read, and its room in the job store is held
before the first byte too (413 naming both figures when there is none); a body with no length
holds room chunk by chunk as it arrives; a body that sends nothing for ``body_idle_timeout_s`` is
408, and every hold is released when the request ends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.requests import Request
from starlette.types import Message

from api.core.errors import BodyTimeout, TooLarge
from api.core.retention import Retention
from settings.api import OpenAIConfig

CHUNK_HOLD = 64 * 1024 * 1024  # a body without a length takes room this much at a time


@asynccontextmanager
async def guarded_body(request: Request, cfg: OpenAIConfig, room: Retention) -> AsyncIterator[Request]:
    """The same request, whose body reads enforce the limits (raise TooLarge / BodyTimeout)."""
    limit = cfg.max_body_bytes
    raw = request.headers.get("content-length")
    declared = int(raw) if raw and raw.isdigit() else None
    if declared is not None and declared > limit:
        raise TooLarge(f"the body is {declared} bytes; this server takes at most {limit}")
    held = 0
    if declared:
        await asyncio.to_thread(room.reserve, declared, "the body")
        held = declared
    received = 0
    upstream = request.receive

    async def receive() -> Message:
        nonlocal received, held
        try:
            message = await asyncio.wait_for(upstream(), cfg.body_idle_timeout_s)
        except TimeoutError:
            raise BodyTimeout(
                f"the body sent nothing for {cfg.body_idle_timeout_s:g} s ({received} bytes received)"
            ) from None
        if message["type"] == "http.request":
            received += len(message.get("body", b""))
            if received > limit:
                raise TooLarge(f"the body passed {limit} bytes, the most this server takes")
            if declared is None and received > held:
                step = max(CHUNK_HOLD, received - held)
                room.reserve(step, "the body")
                held += step
        return message

    try:
        yield Request(request.scope, receive)
    finally:
        room.release(held)
