"""The OpenAI dialect's one error envelope, ``{"error": {"message", "type", "param", "code"}}``.

Every ``/v1`` refusal is built here: service errors, request validation, malformed JSON and
malformed multipart all map to a status through one table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from http import HTTPStatus
from typing import Any

from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, ValidationError

from api.core.errors import (
    BodyTimeout,
    Conflict,
    EncoderMissing,
    InvalidField,
    NoRoom,
    NotFound,
    NotReady,
    QueueFull,
    ServiceError,
    TooLarge,
    Unavailable,
    error_field,
)

PREFIX = "/v1/"

# Service error type -> (HTTP status, OpenAI error type). First match wins (subclasses first).
_MAP: tuple[tuple[type[ServiceError], int, str], ...] = (
    (InvalidField, 400, "invalid_request_error"),
    (NotFound, 404, "invalid_request_error"),
    (NotReady, 409, "invalid_request_error"),
    (Conflict, 409, "invalid_request_error"),
    (QueueFull, 429, "rate_limit_error"),
    (Unavailable, 503, "server_error"),
    (EncoderMissing, 501, "server_error"),
    (NoRoom, 507, "server_error"),
    (TooLarge, 413, "invalid_request_error"),
    (BodyTimeout, 408, "invalid_request_error"),
)


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorBody(BaseModel):
    """What every non-2xx ``/v1`` answer carries."""

    error: ErrorDetail = Field(description="message, type, param (the request field) and code")


class OpenAIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type: str | None = None,  # noqa: A002 - the envelope's name
        headers: Mapping[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or ("invalid_request_error" if status < 500 else "server_error")
        self.headers = dict(headers or {})

    @classmethod
    def from_service(cls, exc: ServiceError) -> OpenAIError:
        status, kind = next(((s, t) for k, s, t in _MAP if isinstance(exc, k)), (500, "server_error"))
        headers = {"Retry-After": str(exc.retry_after_s)} if isinstance(exc, QueueFull) else None
        return cls(status, exc.message, param=exc.field, code=exc.code, type=kind, headers=headers)

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def is_openai_path(path: str) -> bool:
    return path.startswith(PREFIX) or path == PREFIX.rstrip("/")


def http_error(
    status: int, method: str, path: str, detail: Any = None, headers: Mapping[str, str] | None = None
) -> OpenAIError:
    """An HTTP error the router raised itself (no such route 404, wrong method 405, ...) in the
    envelope; headers such as ``Allow`` are kept."""
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "Error"
    code = {404: "not_found", 405: "method_not_allowed"}.get(status, phrase.lower().replace(" ", "_"))
    if status == 404:
        message = f"no route {method} {path}"
    elif status == 405:
        allowed = (headers or {}).get("Allow") or (headers or {}).get("allow")
        message = f"{method} is not allowed on {path}" + (f" (allowed: {allowed})" if allowed else "")
    else:
        message = str(detail) if detail else phrase
    return OpenAIError(status, message, code=code, headers=headers)


def openai_error_response(exc: OpenAIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


def validation_error(errors: ValidationError | Sequence[Mapping[str, Any]]) -> OpenAIError:
    """A pydantic/FastAPI validation failure as a 400 naming the first offending field."""
    raw = errors.errors(include_url=False) if isinstance(errors, ValidationError) else list(errors)
    if not raw:
        return OpenAIError(400, "invalid request", code="invalid_request")

    def field_path(err: Mapping[str, Any]) -> list[str | int]:
        loc = [p for p in err.get("loc", ()) if isinstance(p, str | int)]
        # Union members add their type name to the location ("str", "ReferenceObject"): not a field.
        return [p for p in loc if not (isinstance(p, str) and (p[:1].isupper() or p in _TYPE_TAGS))]

    # Of the errors about the first bad field, the deepest (a union's object member says which key).
    head = field_path(raw[0])[:1]
    first = max((e for e in raw if field_path(e)[:1] == head), key=lambda e: len(field_path(e)))
    loc = field_path(first)
    param = error_field(loc) if loc else None
    kind = str(first.get("type", "value_error"))
    message = str(first.get("msg", "invalid value"))
    for prefix in ("Value error, ", "Assertion failed, "):
        message = message.removeprefix(prefix)
    if kind == "extra_forbidden":
        message = "unknown field"
        code = "unknown_parameter"
    elif kind == "json_invalid":
        param, message, code = (
            None,
            f"the body is not valid JSON: {first.get('ctx', {}).get('error', message)}",
            "invalid_json",
        )
    elif kind == "missing":
        code = "missing_required_parameter"
    else:
        code = "invalid_value"
    return OpenAIError(400, f"{param}: {message}" if param else message, param=param, code=code)


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "function-after", "function-before", "union"}


def validation_error_response(errors: Sequence[Mapping[str, Any]]) -> JSONResponse:
    return openai_error_response(validation_error(errors))
