"""Fencing a worker that was cut off or stopped: once its heartbeat has failed for longer than the
heartbeat timeout, the control plane may have declared it dead and resumed its run on another
worker. Dagster's storage takes any writer's events (no fencing token), so the worker fences itself:
every write of a run it makes (:func:`orchestration.storage.retry_run_writes`) first passes
:meth:`Fence.check`. Once the worker's beats were silent for long (half the timeout: see
:data:`WATCH_AFTER`), the check reads who owns its run now, at every write until the first one more
than a timeout after the silence ended (a takeover decided just before takes a moment to revoke the
run; a run computing all that time is checked at its first write after). A takeover revokes the
dead worker's binding as soon as it is decided (``DeviceRunLauncher.resume_run``), before it looks
for an idle worker. Still this worker (the storage was away for everyone, and judges do not count
that: ``orchestration.registry``): it goes on. Anyone else, or no worker: it exits at once, before
the write, and its supervisor starts it again as a fresh worker (a new boot id). Its late results
are never recorded: one outcome, one MP4 indexed, one callback per job. Who owns a run is read from
the registry's binding row (:meth:`WorkerRegistry.bind`), never from the run's tags, which a write
of this very worker in flight at its stop can rewrite when it wakes.

Left open: a write already past its check when the run is revoked is made (one write at most)."""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestration.worker.process import Worker

log = logging.getLogger("shotloom.worker")
FENCED_EXIT = 75  # EX_TEMPFAIL: the supervisor restarts the worker (a fresh boot id)
# A silence longer than this part of the heartbeat timeout opens the watch. Not the whole timeout:
# the judge measures from the beat's stamp, taken before its write, and on another host's clock; a
# worker that wakes just after being judged dead can see a gap slightly under the timeout.
WATCH_AFTER = 0.5


class Fence:
    def __init__(self, worker: Worker):
        self.worker = worker
        self.last_beat = time.time()  # the last heartbeat the storage took
        self._watching = False  # a silence was seen: every write checks, until one past _watch_until
        self._watch_until = 0.0  # one timeout after the beats resumed

    def beat(self, stamp: float) -> None:
        """A heartbeat the storage took, stamped ``stamp`` (what judges go by). One after a long
        silence (the process was stopped, or cut off) opens the watch too: the next write may be
        the first since."""
        self._note_gap(time.time())
        self.last_beat = stamp

    def _note_gap(self, now: float) -> None:
        timeout = self.worker.runtime_cfg.heartbeat_timeout_seconds
        if now - self.last_beat > timeout * WATCH_AFTER:
            self._watching = True
            self._watch_until = max(self._watch_until, now + timeout)

    def check(self) -> None:
        """Before each write of a run: exit if the worker's run is no longer its own."""
        now = time.time()
        self._note_gap(now)
        if not self._watching:
            return
        run_id = self.worker.run_id or self.worker.pending_run_id
        if run_id is None:
            return  # nothing to fence: it rejoins with its next beat
        try:
            owner = self._owner(run_id)
        except Exception as exc:  # the storage busy or away: the write meets it too; the next one checks
            log.warning(
                "%s: could not read who owns run %s (checked at the next write): %s",
                self.worker.name,
                run_id,
                exc,
            )
            return
        # Watched until a write past the window found the run still its own: a run computing for
        # longer than the window after the wake (no write meanwhile) is checked at its next write.
        self._watching = now <= self._watch_until
        if owner is not None and owner != (self.worker.name, self.worker.boot_id):
            name, boot = owner
            log.error(
                "%s: fenced: silent past its heartbeat timeout, its run %s now belongs to %s; exiting "
                "before writing anything more, to come back as a fresh worker",
                self.worker.name,
                run_id,
                f"{name} (boot {boot})" if name else "a takeover looking for an idle worker",
            )
            logging.shutdown()
            os._exit(FENCED_EXIT)

    def _owner(self, run_id: str) -> tuple[str, str] | None:
        """Who the run is bound to, as the registry's binding row says (never its tags: a write of
        this worker's in flight at the stop can have put its old binding back in them)."""
        from orchestration.registry import WorkerRegistry

        run = self.worker.instance.get_run_by_id(run_id)
        return None if run is None else WorkerRegistry(self.worker.instance.run_storage).owner(run)


def sign_stage_writes(worker: Worker) -> None:
    """Each stage this worker writes on the run it runs also names it as the run's worker. Dagster
    writes tags read-modify-write: a worker stopped inside such a write (past its fence) finishes
    it when it wakes and puts its old binding back over the next worker's. Judges read the binding
    from the registry (:meth:`WorkerRegistry.owner`), but the UI and the API show the tags: the
    next stage of the worker that owns the run puts them right again."""
    from contracts.tags import STAGE_TAG, binding_tags

    storage = worker.instance.run_storage
    write = storage.add_run_tags

    def add_run_tags(run_id: str, new_tags: dict[str, str]) -> None:
        if run_id == worker.run_id and STAGE_TAG in new_tags:
            new_tags = {**new_tags, **binding_tags(worker.name, worker.boot_id, os.getpid())}
        write(run_id, new_tags)

    storage.add_run_tags = add_run_tags
