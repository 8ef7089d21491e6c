"""The R2V scheduler dialect's serving layer: its requests into the job service, the service's
errors into the r2v spec's statuses and body shape (``{"error", "detail"}``)."""

from __future__ import annotations

import math

from api.core.errors import (
    BodyTimeout,
    Conflict,
    EncoderMissing,
    InvalidField,
    NoRoom,
    NotFound,
    NotReady,
    QueueFull,
    TooLarge,
    Unavailable,
)
from api.core.jobs import Accepted, JobService
from api.errors import StatusTable, status_table_errors
from api.r2v.protocol import MergeRequest, R2VRequest

# The r2v spec's error table: invalid input 422, unknown 404, conflicts 409, not ready or full 503.
_STATUS: StatusTable = (
    (InvalidField, 422),
    (NotFound, 404),
    (Conflict, 409),
    (NotReady, 409),
    (QueueFull, 503),
    (Unavailable, 503),
    (EncoderMissing, 501),
    (NoRoom, 507),
    (TooLarge, 413),
    (BodyTimeout, 408),
)


# The r2v spec's errors, in its body shape (api.errors).
r2v_errors = status_table_errors(_STATUS)


class R2VServing:
    """POST /r2v and POST /merge on the job service."""

    def __init__(self, jobs: JobService):
        self.jobs = jobs

    def accept_r2v(
        self, req: R2VRequest, callback_header: str | None, submitter: str | None = None
    ) -> Accepted:
        with r2v_errors():
            self._check_limits(req)
            return self.jobs.accept_shot(req.to_spec(callback_header, submitter))

    def _check_limits(self, req: R2VRequest) -> None:
        """This server's own bounds on what a shot may ask (``api.openai``'s ``max_width``,
        ``max_height`` and ``max_seconds``, as /v1 checks them): a 16384 x 16384 shot of 1025
        frames would hold a device for hours. Frames: at the model's default fps (R2V sets none)."""
        limits = self.jobs.api.openai
        for name, most in (("width", limits.max_width), ("height", limits.max_height)):
            value = getattr(req, name)
            if value is not None and value > most:
                raise InvalidField(f"at most {most} on this server, got {value}", name)
        fps = self.jobs.rules.defaults.fps
        most = math.floor(limits.max_seconds * fps) + 1
        if req.num_frames is not None and req.num_frames > most:
            seconds = f"{limits.max_seconds:g} s"
            raise InvalidField(
                f"at most {most} at {fps} fps on this server ({seconds}), got {req.num_frames}", "num_frames"
            )

    def accept_merge(
        self, req: MergeRequest, callback_header: str | None, submitter: str | None = None
    ) -> Accepted:
        with r2v_errors():
            return self.jobs.accept_merge(req.to_spec(callback_header, submitter))
