"""The Dagster daemon (``dagster-daemon run``) with a shorter wait between the run queue's dequeues.

Dagster's interval daemons wait for their next iteration in 0.5 s slices, so a run submitted just
after a dequeue waits up to a whole slice whatever ``dequeue_interval_seconds`` says. Here the run
queue's daemon waits in :data:`WAIT_SLICE_S` slices instead (the other daemons are unchanged), so
the dequeue interval is what decides how soon a queued run starts. The loop itself is Dagster's:
only the event it waits on is given a shorter timeout.
"""

from __future__ import annotations

import threading
from typing import Any

from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import QueuedRunCoordinatorDaemon

WAIT_SLICE_S = 0.05


class _ShortWaits:
    """A shutdown event whose timed waits last at most ``slice_s`` (the loop re-checks its clock)."""

    def __init__(self, event: threading.Event, slice_s: float):
        self._event = event
        self._slice_s = slice_s

    def wait(self, timeout: float | None = None) -> bool:
        return self._event.wait(self._slice_s if timeout is None else min(timeout, self._slice_s))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._event, name)


def _patch_run_queue_daemon() -> None:
    stock = QueuedRunCoordinatorDaemon.core_loop

    def core_loop(self, workspace_process_context, shutdown_event):
        return stock(self, workspace_process_context, _ShortWaits(shutdown_event, WAIT_SLICE_S))

    QueuedRunCoordinatorDaemon.core_loop = core_loop  # type: ignore[method-assign]


def main() -> None:
    from dagster._daemon.cli import main as dagster_daemon

    _patch_run_queue_daemon()
    dagster_daemon()


if __name__ == "__main__":
    main()
