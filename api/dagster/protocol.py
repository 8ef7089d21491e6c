"""``Gateway``: what the API asks of Dagster, and nothing more (the methods its background work,
references and health check call). :class:`api.dagster.DagsterGateway` answers it over GraphQL;
the serving tests answer it in process (``tests/inprocess_dagster.py``), on a real Dagster
instance, so most of the API is tested without a running stack.

Errors are the gateway's (:class:`~api.dagster.types.DagsterGatewayError`, and
:class:`~api.dagster.types.DagsterUnavailable` for "try again later") in either implementation.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from api.dagster.types import (
    DagsterGatewayError,
    EngineEvent,
    Materialization,
    RunInfo,
    RunSubmission,
)


class Gateway(Protocol):
    # -- health ----------------------------------------------------------------------------------
    def ping(self) -> bool:
        """Dagster answers and the code location is loaded."""
        ...

    def daemon_healthy(self, daemon_types: Iterable[str] | None = None) -> bool | None:
        """Every required daemon is alive (True), one is not (False), or no one can tell (None)."""
        ...

    # -- submitting --------------------------------------------------------------------------------
    def submit(self, job_name: str, run_config: Mapping[str, Any], tags: Mapping[str, str]) -> str:
        """Queue one run; its run id. A job's step (its version and step tags) submitted again
        answers the run that has it; after a timeout, look the step up by tag before again."""
        ...

    def submit_many(self, submissions: Sequence[RunSubmission]) -> list[str | DagsterGatewayError]:
        """Queue runs in the order given: a run id or the refusal, per submission."""
        ...

    def terminate(self, run_id: str, force: bool = False, wait_starting_s: float = 5.0) -> bool:
        """Cancel a queued run, interrupt a started one (``force``: marked canceled at once).
        False when the run is unknown, finished, or not cancelable."""
        ...

    # -- reading runs ------------------------------------------------------------------------------
    def run(self, run_id: str) -> RunInfo | None: ...

    def runs(
        self, run_ids: Iterable[str], failures: bool = True, statuses: Iterable[str] | None = None
    ) -> dict[str, RunInfo]:
        """The runs among ``run_ids`` that exist (in one of ``statuses``, when given), with a failed
        run's failure details when ``failures``."""
        ...

    def find_runs_by_tag(self, key: str, value: str, limit: int | None = None) -> list[RunInfo]:
        """Runs carrying tag ``key=value``, newest first."""
        ...

    def retries_of(self, root_run_id: str) -> list[RunInfo]:
        """Re-executions of ``root_run_id`` (not the root itself), oldest first."""
        ...

    def materializations(self, run_id: str) -> list[Materialization]:
        """The asset materializations the run recorded, in order, metadata as plain values."""
        ...

    def engine_events(self, run_id: str, cursor: str | None = None) -> tuple[list[EngineEvent], str | None]:
        """The run's engine events after ``cursor`` (oldest first), and the cursor to read on from."""
        ...
