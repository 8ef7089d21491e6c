"""The R2V scheduler dialect's serving layer: its requests into the job service, the service's
errors into the r2v spec's statuses and body shape (``{"error", "detail"}``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from api.core.errors import (
    BodyTimeout,
    Conflict,
    EncoderMissing,
    InvalidField,
    NotFound,
    NotReady,
    QueueFull,
    ServiceError,
    TooLarge,
    Unavailable,
)
from api.core.jobs import Accepted, JobService
from api.r2v.protocol import MergeRequest, R2VRequest

# The r2v spec's error table: invalid input 422, unknown 404, conflicts 409, not ready or full 503.
_STATUS: tuple[tuple[type[ServiceError], int], ...] = (
    (InvalidField, 422),
    (NotFound, 404),
    (Conflict, 409),
    (NotReady, 409),
    (QueueFull, 503),
    (Unavailable, 503),
    (EncoderMissing, 501),
    (TooLarge, 413),
    (BodyTimeout, 408),
)


class ApiError(Exception):
    """An answer other than 2xx, with the status code the r2v spec's error table gives."""

    def __init__(self, status: int, message: str, field: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field

    @classmethod
    def from_service(cls, exc: ServiceError) -> ApiError:
        status = next((code for kind, code in _STATUS if isinstance(exc, kind)), 500)
        return cls(status, exc.message, exc.field)

    def body(self) -> dict[str, Any]:
        error = f"{self.field}: {self.message}" if self.field else self.message
        detail = [{"field": self.field, "msg": self.message}] if self.field else self.message
        return {"error": error, "detail": detail}


@contextmanager
def r2v_errors() -> Iterator[None]:
    try:
        yield
    except ServiceError as exc:
        raise ApiError.from_service(exc) from None


class R2VServing:
    """POST /r2v and POST /merge on the job service."""

    def __init__(self, jobs: JobService):
        self.jobs = jobs

    def accept_r2v(
        self, req: R2VRequest, callback_header: str | None, submitter: str | None = None
    ) -> Accepted:
        with r2v_errors():
            return self.jobs.accept_shot(req.to_spec(callback_header, submitter))

    def accept_merge(
        self, req: MergeRequest, callback_header: str | None, submitter: str | None = None
    ) -> Accepted:
        with r2v_errors():
            return self.jobs.accept_merge(req.to_spec(callback_header, submitter))
