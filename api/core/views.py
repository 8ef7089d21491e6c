"""Cached per-job views for pollers, shared by both dialects (GET /version, GET /v1/videos/{id}).

Pollers hit these hard (bench/api.py runs 50 in a loop) while the follower writes status, stage,
progress and worker figures of running jobs several times a second. A view depends on its own
job row and artifacts (the store's per-version stamp says when those changed), on its queue
position while queued (the store's queue generation says when any job entered or left a queue)
and, for fields that move with the clock (an ETA, an expiry), on time: ``max_age`` bounds how long
a rendered view stays good. Positions come from one query per queue change for all queues at
once, so a job leaving the queue does not send every queued poller to the database.
:class:`JobViews` runs on the event loop only: no locks.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from api.store import ArtifactRecord, JobRecord, Store

T = TypeVar("T")
# What a dialect makes of one job: its artifacts and queue position (None unless queued) given;
# None for a job the dialect does not show (another dialect's, an expired one).
Render = Callable[[JobRecord, list[ArtifactRecord], int | None], T | None]


@dataclass(frozen=True)
class _Read:
    stamp: int
    job: JobRecord
    artifacts: list[ArtifactRecord]


@dataclass(frozen=True)
class _Rendered(Generic[T]):
    stamp: int
    queue_generation: int | None  # None: the view shows no queue position
    fresh_until: float  # time.monotonic() past which it is rendered again
    value: T | None


class JobViews(Generic[T]):
    def __init__(
        self,
        store: Store,
        render: Render[T],
        max_entries: int = 10_000,
        max_age: Callable[[JobRecord], float | None] = lambda job: None,
    ):
        self.store, self.render, self.max_entries, self.max_age = store, render, max_entries, max_age
        self._reads: dict[str, _Read] = {}
        self._rendered: dict[str, _Rendered[T]] = {}
        self._positions: tuple[int, dict[str, int]] = (-1, {})

    def get(self, version_id: str) -> T | None:
        """The job's view; None for an unknown version (or one ``render`` does not show)."""
        # Stamps are read before the data: a write in between leaves a stale stamp on a fresh
        # view, which only costs one more render.
        stamp = self.store.version_stamp(version_id)
        queue_generation = self.store.queue_generation
        now = time.monotonic()
        cached = self._rendered.get(version_id)
        if (
            cached is not None
            and cached.stamp == stamp
            and cached.queue_generation in (None, queue_generation)
            and now < cached.fresh_until
        ):
            return cached.value
        read = self._reads.get(version_id)
        if read is None or read.stamp != stamp:
            got = self.store.job_view(version_id)
            if got is None:
                return None
            read = _Read(stamp, *got)
            self._remember(self._reads, version_id, read)
        job, position = read.job, None
        if job.status == "queued":
            position = self._position(version_id, queue_generation)
            if position is None:  # it left the queue between the two reads: one consistent read
                fresh = self.store.version_view(version_id)
                return self.render(fresh[0], fresh[2], fresh[1]) if fresh is not None else None
        value = self.render(job, read.artifacts, position)
        age = self.max_age(job)
        rendered = _Rendered(
            stamp,
            queue_generation if position is not None else None,
            now + age if age is not None else math.inf,
            value,
        )
        self._remember(self._rendered, version_id, rendered)
        return value

    def _position(self, version_id: str, queue_generation: int) -> int | None:
        if self._positions[0] != queue_generation:
            self._positions = (queue_generation, self.store.queue_positions())
        return self._positions[1].get(version_id)

    def _remember(self, table: dict, key: str, value) -> None:
        if len(table) >= self.max_entries and key not in table:
            table.clear()
        table[key] = value
