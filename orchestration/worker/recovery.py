"""Runs nobody will start (orphans), taken back by an idle worker: scanned for at boot and then
every ``orphan_scan_seconds`` of an idle main loop.
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING

from orchestration.worker.execute import execute

if TYPE_CHECKING:
    from orchestration.worker.process import Worker

log = logging.getLogger("shotloom.worker")


def scan_for_orphans(worker: Worker) -> None:
    try:
        _recover_orphans(worker)
    except Exception:  # storage busy, a run deleted meanwhile...: the next scan tries again
        log.exception("%s: scanning for orphaned runs failed", worker.name)


def _recover_orphans(worker: Worker) -> None:
    """Take back runs that nobody will start: run monitoring only times STARTING runs out
    (after start_timeout_seconds), so an idle worker does it, oldest first, with stage
    ``recovered``. Four ways a run ends up so: this worker's earlier boot died between
    claiming and starting it; the daemon died between binding it to this worker (tags first)
    and handing it over; the daemon died after marking it STARTING but before binding it to
    any worker; or the worker (or its whole host) it was bound to is dead in the registry.
    The last two may be taken by any idle worker of the pool, on any host: an exclusive claim
    in the shared storage decides. A STARTED run is left to run monitoring, which resumes it.
    """
    from dagster import DagsterRunStatus, RunsFilter

    from contracts import events
    from contracts.tags import POOL_TAGS, binding_tags
    from orchestration.registry import WorkerRegistry
    from resources import run_state
    from shotloom import stages

    records = worker.instance.get_run_records(
        RunsFilter(statuses=[DagsterRunStatus.STARTING], tags={POOL_TAGS[worker.pool]: "1"})
    )
    now = time.time()
    registry = WorkerRegistry(worker.instance.run_storage, worker.runtime_cfg.heartbeat_timeout_seconds)

    bound = registry.owners([r.dagster_run for r in records])

    def owner_dead(name: str, boot_id: str) -> bool:
        owner = registry.get(name)
        return owner is None or owner.boot_id != boot_id or not registry.alive(owner)

    def orphaned(record) -> bool:
        run = record.dagster_run
        # Counted from the end of this worker's own blindness to the storage: the launcher waits a
        # storage outage out mid-launch, and takes the run once the storage is back (the two would
        # both take it).
        quiet = registry.quiet_for(record.update_timestamp.timestamp(), now)
        stale = quiet > worker.runtime_cfg.handover_grace_seconds
        name, boot_id = bound[run.run_id]
        if not name:
            return stale
        if name != worker.name:
            return stale and owner_dead(name, boot_id)
        return boot_id != worker.boot_id or (stale and run.run_id not in worker.finished)

    for record in sorted(filter(orphaned, records), key=lambda r: r.create_timestamp):
        run_id = record.dagster_run.run_id
        with worker.lock:
            if worker.stopping or worker.state not in ("idle", "warming"):
                return
            before, worker.state = worker.state, "busy"  # the launcher now gets 409
        mine = bound[run_id][0] == worker.name
        if not mine and not registry.claim(run_id, worker.name):
            with worker.lock:
                worker.state = before  # another worker took it
            continue
        log.info("%s: recovering run %s that was never started", worker.name, run_id)
        registry.bind(run_id, worker.name, worker.boot_id)
        run_state.record(
            worker.instance,
            run_id,
            {
                **binding_tags(worker.name, worker.boot_id, os.getpid()),
                **events.stage_tags(stages.RECOVERED),
            },
        )
        execute(worker, run_id, resume=False)
        with worker.lock:
            if not worker.stopping:
                worker.state = "idle"
