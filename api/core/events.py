"""Pushed progress: one job's Server-Sent Events, shared by both dialects
(``GET /version/{id}/events``, ``GET /v1/videos/{id}/events``).

Each event carries the dialect's view of the job, exactly what its GET answers, every time that view
changes (stage, progress, queue position, worker figures, the result), so a client needs nothing
else; ``event: update`` while the job runs, ``event: done`` once with the final view, then the stream
ends. The view holds the times of every stage reached so far, so a client that reconnects misses no
information even if it missed intermediate events.

Event ids are the job's last write time in milliseconds (stored, so they survive an API restart).
A client that reconnects with ``Last-Event-ID`` gets the view again only when the job has changed
since; one that already saw ``done`` gets ``204 No Content``, which tells an ``EventSource`` to stop
reconnecting. The stream reads the cached views the pollers use and the store's change counters:
an idle stream costs one indexed read per tick.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable

import anyio
from fastapi import Request, Response
from fastapi.responses import StreamingResponse

from api.store import FINISHED, JobRecord, Store

# One event of the stream (before OpenAPI 3.2 and its ``itemSchema``, an event stream's ``schema``
# describes each event): its ``data`` is the job's view as the dialect's GET answers it.
SSE_EVENT_SCHEMA = {
    "type": "object",
    "required": ["event", "data"],
    "properties": {
        "event": {"enum": ["update", "done"]},
        "data": {
            "type": "string",
            "contentMediaType": "application/json",
            "description": "The job's view, as the dialect's GET of the job answers it.",
        },
        "id": {"type": "string", "pattern": "^[0-9]+$", "description": "The job's last write, in ms."},
        "retry": {"type": "integer", "description": "Reconnect after this many ms."},
    },
}
SSE_RESPONSES = {
    200: {
        "description": "text/event-stream: `event: update` per change of the job's view, then `event: done`",
        "content": {"text/event-stream": {"schema": SSE_EVENT_SCHEMA}},
    },
    204: {"description": "The client's Last-Event-ID is the job's final event: nothing more to send."},
}
TICK_S = 0.25
KEEPALIVE_S = 15.0  # a comment line now and then keeps proxies from closing an idle stream


def _event_id(job: JobRecord) -> int:
    return int(job.updated_at * 1000)


def _last_seen(header: str | None) -> int | None:
    try:
        return int(header) if header else None
    except ValueError:
        return None  # not one of ours: start from the current view


def job_events(
    request: Request,
    store: Store,
    version_id: str,
    render: Callable[[], str | None],
) -> Response:
    """The SSE response for ``version_id`` (known: the caller checked); ``render`` answers the
    dialect's current view as JSON text."""
    job = store.get(version_id)
    last_seen = _last_seen(request.headers.get("last-event-id"))
    if job is not None and job.status in FINISHED and last_seen is not None and last_seen >= _event_id(job):
        return Response(status_code=204)  # it saw the end already
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    stream = _stream(request, store, version_id, render, last_seen)
    return StreamingResponse(stream, media_type="text/event-stream", headers=headers)


async def _stream(
    request: Request,
    store: Store,
    version_id: str,
    render: Callable[[], str | None],
    last_seen: int | None,
) -> AsyncIterator[str]:
    seen: tuple[int | None, int] | None = None  # (version's, queues' change counters) last rendered
    sent: str | None = None
    quiet_since = time.monotonic()
    yield "retry: 1000\n\n"
    while not await request.is_disconnected():
        changed = store.changes(version_id)
        if changed != seen:
            seen = changed
            job = store.get(version_id)
            body = render()
            if job is None or body is None:
                return  # deleted meanwhile
            event_id = _event_id(job)
            done = job.status in FINISHED
            fresh = last_seen is None or event_id > last_seen or sent is not None
            if body != sent and (fresh or done):
                yield f"id: {event_id}\nevent: {'done' if done else 'update'}\ndata: {body}\n\n"
                sent, quiet_since = body, time.monotonic()
            if done:
                return
        if time.monotonic() - quiet_since > KEEPALIVE_S:
            yield ": keepalive\n\n"
            quiet_since = time.monotonic()
        await anyio.sleep(TICK_S)
