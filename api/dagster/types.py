"""What the gateway answers: plain dataclasses of runs, events and materializations, and its errors."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from contracts.tags import (
    AUTO_RETRY_RUN_ID_TAG,
    FAILURE_REASON_TAG,
    RETRY_NUMBER_TAG,
    WILL_RETRY_TAG,
)

RUN_STATUSES = (
    "QUEUED",
    "NOT_STARTED",
    "MANAGED",
    "STARTING",
    "STARTED",
    "SUSPENDED",
    "SUCCESS",
    "FAILURE",
    "CANCELING",
    "CANCELED",
)
FINISHED_STATUSES = frozenset({"SUCCESS", "FAILURE", "CANCELED"})

# --------------------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True)
class CodeLocation:
    location_name: str
    repository_name: str
    jobs: tuple[str, ...]


@dataclass(frozen=True)
class DaemonStatus:
    daemon_type: str
    required: bool
    healthy: bool | None  # None: the webserver does not know (e.g. not required)


@dataclass(frozen=True)
class StepFailure:
    step_key: str | None
    message: str  # the step's error, e.g. "dagster._core.definitions.events.Failure: <description>"
    class_name: str | None  # e.g. "Failure", "DagsterExecutionStepExecutionError"
    description: str | None  # ``Failure(description=...)`` when the op raised a dagster Failure
    error_source: str | None  # USER_CODE_ERROR, FRAMEWORK_ERROR, INTERRUPT, UNEXPECTED_ERROR
    # The op's own error under Dagster's wrappers, "<Class>: <message>" (see :func:`own_error`).
    cause: str | None = None


# A failed run's details: its RUN_FAILURE message, that event's own error, its step failures.
RunFailure = tuple[str | None, str | None, tuple[StepFailure, ...]]


@dataclass(frozen=True)
class RunInfo:
    run_id: str
    job_name: str
    status: str  # a DagsterRunStatus value: QUEUED, STARTING, STARTED, SUCCESS, FAILURE, CANCELED, ...
    tags: dict[str, str]
    creation_time: float  # epoch seconds
    start_time: float | None
    end_time: float | None
    update_time: float | None
    root_run_id: str | None  # None for an original run
    parent_run_id: str | None
    failure_message: str | None = None  # the RUN_FAILURE event's message (FAILURE runs only)
    step_failures: tuple[StepFailure, ...] = field(default_factory=tuple)
    failure_error: str | None = None  # the RUN_FAILURE event's own error (an exception outside steps)

    @property
    def finished(self) -> bool:
        return self.status in FINISHED_STATUSES

    @property
    def create_time(self) -> float:
        """Alias of ``creation_time`` (the background tracker reads this name)."""
        return self.creation_time

    @property
    def retry_number(self) -> int:
        try:
            return int(self.tags.get(RETRY_NUMBER_TAG, "0"))
        except ValueError:
            return 0

    @property
    def will_retry(self) -> bool:
        """Dagster's retry daemon decided to re-execute this failed run (a new run id will appear)."""
        return self.tags.get(WILL_RETRY_TAG) == "true"

    @property
    def auto_retry_run_id(self) -> str | None:
        """The run the retry daemon created from this one, once it has."""
        return self.tags.get(AUTO_RETRY_RUN_ID_TAG)

    @property
    def failure_reason(self) -> str | None:
        """Dagster's classification tag, e.g. STEP_FAILURE, RUN_EXCEPTION, START_TIMEOUT, RUN_WORKER_CRASH."""
        return self.tags.get(FAILURE_REASON_TAG)

    def error_summary(self) -> str | None:
        """What a client is told of a failed run: the first failing step's ``Failure`` description
        or the op's own error (never Dagster's wrapper around it), prefixed with the step; else
        the run's own error, else its failure message."""
        for failure in self.step_failures:
            text = failure.description or failure.cause or failure.message
            if text:
                prefix = f"{failure.step_key}: " if failure.step_key else ""
                return prefix + text.strip()
        return self.failure_error or self.failure_message


@dataclass(frozen=True)
class EngineEvent:
    message: str
    metadata: dict[str, Any]


@dataclass(frozen=True)
class Materialization:
    asset_key: tuple[str, ...]
    partition: str | None  # multi-partition keys read "a|b" (dimensions in name order)
    metadata: dict[str, Any]  # label -> python value (str, int, float, bool, parsed JSON, None)
    step_key: str | None
    timestamp: float  # epoch seconds
    description: str | None
    tags: dict[str, str]


# --------------------------------------------------------------------------------------------------
# Errors


@dataclass(frozen=True)
class RunSubmission:
    """One run to submit: a job of the code location, its run config and tags."""

    job_name: str
    run_config: Mapping[str, Any]
    tags: Mapping[str, str]


class DagsterGatewayError(RuntimeError):
    """A definite failure. ``kind`` is the GraphQL error type (e.g. ``RunConfigValidationInvalid``,
    ``PipelineNotFoundError``, ``PythonError``) when there is one."""

    def __init__(self, message: str, kind: str | None = None):
        super().__init__(message)
        self.kind = kind


class DagsterUnavailable(DagsterGatewayError):
    """The webserver cannot answer now (down, timed out, 5xx, code location not loaded): retry later."""
