"""Fencing a worker that was cut off: once its heartbeat has failed for longer than the heartbeat
timeout, the control plane may have declared it dead and resumed its run on another worker. Dagster's
storage takes any writer's events (no fencing token), so the worker fences itself: every new
connection it opens to the storage (:func:`orchestration.storage.wait_out_postgres_outages`) first
passes :meth:`Fence.check`, which, while the worker's beats are stale (and for one more timeout after
they resume, the time a takeover decided just before takes to rebind the run), reads who owns its
run now. Still this worker (the storage was away for everyone, and judges do not count that:
``orchestration.registry``): it goes on. Another worker: it exits at once, before the write, and
its supervisor starts it again as a fresh worker (a new boot id). Its late results are never
recorded: one outcome, one MP4 indexed, one callback per job.

Left open: a statement already in flight on a connection opened before the cut is not re-checked
(NullPool: a connection is one operation's, so that is one write at most)."""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestration.worker.process import Worker

log = logging.getLogger("shotloom.worker")
FENCED_EXIT = 75  # EX_TEMPFAIL: the supervisor restarts the worker (a fresh boot id)


class Fence:
    def __init__(self, worker: Worker):
        self.worker = worker
        self.last_beat = time.time()  # the last heartbeat the storage took
        self._watch_until = 0.0  # keep checking until then (one timeout after the beats resume)
        self._checking = threading.local()  # the check's own connection is not checked again

    def beat(self) -> None:
        self.last_beat = time.time()

    def check(self) -> None:
        """At each new storage connection: exit if the worker's run has gone to another worker."""
        timeout = self.worker.runtime_cfg.heartbeat_timeout_seconds
        now = time.time()
        if now - self.last_beat > timeout:
            self._watch_until = now + timeout
        if now > self._watch_until or getattr(self._checking, "on", False):
            return
        run_id = self.worker.run_id or self.worker.pending_run_id
        if run_id is None:
            return  # nothing to fence: it rejoins with its next beat
        self._checking.on = True
        try:
            owner = self._owner(run_id)
        finally:
            self._checking.on = False
        if owner is not None and owner != (self.worker.name, self.worker.boot_id):
            log.error(
                "%s: fenced: cut off for %.0f s, its run %s now belongs to %s (boot %s); exiting "
                "before writing anything more, to come back as a fresh worker",
                self.worker.name,
                now - self.last_beat,
                run_id,
                *owner,
            )
            logging.shutdown()
            os._exit(FENCED_EXIT)

    def _owner(self, run_id: str) -> tuple[str, str] | None:
        from contracts.tags import run_owner

        run = self.worker.instance.get_run_by_id(run_id)
        return None if run is None else run_owner(run.tags)
