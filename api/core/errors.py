"""What can go wrong when a job is accepted, read or changed, without any HTTP status.

Each dialect (``api.r2v``, ``api.openai``) maps these types to its own statuses and body shape in
one place; the job service never chooses a status code.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def error_field(loc: Iterable[Any]) -> str:
    """A validation error's location as a client names the field, in both dialects:
    ``('body', 'memory_slots', 1, 'audio_url')`` -> ``memory_slots[1].audio_url``."""
    parts = list(loc)
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:]
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "body"


class ServiceError(Exception):
    """Base: ``message`` for people, ``field`` names the request field (dialect spelling) if any,
    ``code`` is a stable machine-readable reason."""

    code = "error"

    def __init__(self, message: str, field: str | None = None, code: str | None = None):
        super().__init__(f"{field}: {message}" if field else message)
        self.message = message
        self.field = field
        if code is not None:
            self.code = code


class InvalidField(ServiceError):
    """The request (a field, a resource, its media) cannot be served; nothing was queued."""

    code = "invalid_request"


class NotFound(ServiceError):
    """Unknown (or expired, or deleted) job, artifact, model."""

    code = "not_found"


class Conflict(ServiceError):
    """The request clashes with state: a reused idempotency key, an unfinished source."""

    code = "conflict"


class NotReady(ServiceError):
    """The job exists but has no such output yet (content of an unfinished job)."""

    code = "not_ready"


class QueueFull(ServiceError):
    """More jobs queued than configured; ``retry_after_s`` is the client's best wait."""

    code = "queue_full"

    def __init__(self, message: str, retry_after_s: int):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Unavailable(ServiceError):
    """The service is starting or a part it needs is gone (workers, the model not loaded yet)."""

    code = "unavailable"


class EncoderMissing(ServiceError):
    """The bundled FFmpeg lacks an encoder the MP4 writer needs."""

    code = "encoder_missing"


class NoRoom(ServiceError):
    """A disk the service writes to is (nearly) full: new work waits until space is freed."""

    code = "insufficient_storage"


class TooLarge(ServiceError):
    """A body or upload larger than allowed, or than the room left in the job store."""

    code = "payload_too_large"


class BodyTimeout(ServiceError):
    """A request body that stopped arriving."""

    code = "request_timeout"
