"""A device group (``shotloom.parallel``): this worker is its rank 0, the other ranks its children.

They are started and joined before the worker offers itself, then watched: a rank that dies
takes the whole group down with exit status ``GROUP_LOST_EXIT``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import TYPE_CHECKING

from shotloom.parallel import GroupSpec, RankGroup

if TYPE_CHECKING:
    from orchestration.worker.process import Worker

log = logging.getLogger("shotloom.worker")
GROUP_LOST_EXIT = 75  # a rank of this worker's device group died: the whole group restarts


def start_group(worker: Worker, spec: GroupSpec) -> None:
    """Start the group's other ranks and join them (before this worker offers itself), and
    watch them: a rank that dies takes the whole group down (this process exits), so
    server.py restarts it whole and the run it was on resumes as after any worker's death."""

    def lost(dead: list[int]) -> None:
        log.error(
            "%s: rank(s) %s of its group died or fell out of step; restarting the group", worker.name, dead
        )
        os._exit(GROUP_LOST_EXIT)

    worker.group = RankGroup(spec, on_lost=lost)
    started = time.perf_counter()
    worker.group.start()
    log.info(
        "%s: joined a group of %d ranks in %.1fs",
        worker.name,
        worker.group.ranks,
        time.perf_counter() - started,
    )

    def watch() -> None:
        while not worker.stopping:
            dead = worker.group.dead() if worker.group is not None else []
            if dead:
                lost(dead)
            time.sleep(0.5)

    threading.Thread(target=watch, name="group-watch", daemon=True).start()
