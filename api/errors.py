"""The service's errors as HTTP answers, for the routes that answer ``{"error", "detail"}`` (the
R2V dialect, the operator's and the media routes; the OpenAI dialect has its own envelope): one
mechanism, each user with its own status table (:func:`status_table_errors`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from api.core.errors import QueueFull, ServiceError

StatusTable = tuple[tuple[type[ServiceError], int], ...]


class ApiError(Exception):
    """An answer other than 2xx: its status, message, the field it names, and how long a client
    should wait before trying again (``Retry-After``), when that is known."""

    def __init__(self, status: int, message: str, field: str | None = None, retry_after_s: int | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field
        self.retry_after_s = retry_after_s

    @classmethod
    def from_service(cls, exc: ServiceError, table: StatusTable) -> ApiError:
        status = next((code for kind, code in table if isinstance(exc, kind)), 500)
        retry = exc.retry_after_s if isinstance(exc, QueueFull) else None
        return cls(status, exc.message, exc.field, retry)

    def body(self) -> dict[str, Any]:
        error = f"{self.field}: {self.message}" if self.field else self.message
        detail = [{"field": self.field, "msg": self.message}] if self.field else self.message
        return {"error": error, "detail": detail}

    def headers(self) -> dict[str, str] | None:
        return {"Retry-After": str(self.retry_after_s)} if self.retry_after_s is not None else None


def status_table_errors(table: StatusTable) -> Callable[[], AbstractContextManager[None]]:
    """A context manager that answers the job service's errors by ``table`` (unknown: 500)."""

    @contextmanager
    def translate() -> Iterator[None]:
        try:
            yield
        except ServiceError as exc:
            raise ApiError.from_service(exc, table) from None

    return translate
