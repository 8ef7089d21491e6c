"""The Dagster daemon (``dagster-daemon run``) with a run queue that dequeues when the queue changes.

Dagster's interval daemons run an iteration, then wait out their interval in 0.5 s slices: a run
submitted just after a dequeue waits up to a whole interval, and a slot freed by a finishing run
stays empty as long. Here the run queue's daemon waits in :data:`WAIT_SLICE_S` slices and, at each,
looks at the queue (the coordinator's ``queue_look``: one indexed query); when it moved and a run
could start (a run queued while its pool has a free slot, a run ended with runs waiting, an
operator's request) it dequeues at once. The interval (``dequeue_interval_seconds``) remains for
what the look does not see: a worker that came alive. The other daemons are Dagster's, unchanged;
so is the iteration itself.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import QueuedRunCoordinatorDaemon
from dagster._utils.error import serializable_error_info_from_exc_info

WAIT_SLICE_S = 0.05


def _moved(look: Callable[[], Any]) -> Callable[[], bool]:
    """A check that answers True once the queue moved since it was made and a dequeue could start
    something (``look`` returns a QueueLook; one that fails, e.g. the database busy, is no news:
    the interval still runs)."""

    def safe() -> Any:
        try:
            return look()
        except Exception:
            return None

    seen = safe()

    def check() -> bool:
        now = safe()
        return now is not None and seen is not None and now.key != seen.key and now.startable

    return check


def _patch_run_queue_daemon() -> None:
    def core_loop(self, workspace_process_context, shutdown_event) -> Iterator[Any]:
        from dagster._daemon.daemon import SpanMarker

        coordinator = workspace_process_context.instance.run_coordinator
        look = getattr(coordinator, "queue_look", None)
        while True:
            start = time.time()
            # Looked at before the dequeue: a run queued while it runs is not missed (what the
            # dequeue itself launched counts as a change too: one more, cheap, dequeue).
            moved = _moved(look) if look is not None else (lambda: False)
            yield SpanMarker.START_SPAN
            try:
                yield from self.run_iteration(workspace_process_context)
            except Exception:
                error_info = serializable_error_info_from_exc_info(sys.exc_info())
                self._logger.error("Caught error:\n%s", error_info)
                yield error_info
            yield SpanMarker.END_SPAN
            while time.time() - start < self.interval_seconds:
                shutdown_event.wait(WAIT_SLICE_S)
                if moved():
                    break
                yield None
            yield None

    QueuedRunCoordinatorDaemon.core_loop = core_loop  # type: ignore[method-assign]


def main() -> None:
    from dagster._daemon.cli import main as dagster_daemon

    _patch_run_queue_daemon()
    dagster_daemon()


if __name__ == "__main__":
    main()
