"""Cached per-job views for pollers, shared by both dialects (GET /version, GET /v1/videos/{id}).

Pollers hit these hard (bench/api.py runs 50 in a loop) while the follower writes status, stage,
progress and worker figures of running jobs several times a second. A view depends on its own
job row and artifacts (the version's change counter says when those changed), on its queue
position while queued (the queues' counter says when any job entered or left a queue or moved in
it) and, for fields that move with the clock (an ETA, an expiry), on time: ``max_age`` bounds how
long a rendered view stays good. The counters live in the database (:mod:`api.store.changes`),
bumped by every write whichever process makes it, so a view cached here is never older than the
last write another API process or a schedule made.

The counters of the jobs cached here are kept in memory and brought up to date once a turn of the
event loop, by one indexed query for what moved since the last look (the change sequence; usually
nothing, a few rows after a commit). The answers of a turn are to requests that arrived before it
began, so each still shows every write committed before its request, and a turn's many requests
cost the database one look, not one each (measured: a look after another process's commit costs
SQLite several times a look before it, so one per request was a quarter of the pollers' CPU). A
job seen for the first time has its counter read alone.
Positions come from one query per queue change for all queues at once, so a job leaving the queue
does not send every queued poller to the database. :class:`JobViews` runs on the event loop only:
no locks.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from api.store import ArtifactRecord, JobRecord, Store, StoreUnavailable

# The store the views read, as a dialect names it: the dialects reach the store through the job
# service's package, never api.store itself (an import contract).
ViewStore = Store

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


_UNSEEN = -1  # a job whose counter this process has not read yet (counters start at 1)


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
        # The counters of the jobs seen here (None: deleted), current as of change number _seq.
        self._stamps: dict[str, int | None] = {}
        self._queue_generation = -1
        self._seq: int | None = None  # None: not looked yet
        self._synced_this_turn = False

    def get(self, version_id: str) -> T | None:
        """The job's view; None for an unknown version (or one ``render`` does not show). While the
        database is away, the last view rendered here (else :class:`StoreUnavailable`)."""
        try:
            return self._get(version_id)
        except StoreUnavailable:
            cached = self._rendered.get(version_id)
            if cached is None:
                raise
            return cached.value

    def _get(self, version_id: str) -> T | None:
        # The counters are brought up to date before the data is read: a write in between leaves
        # a stale stamp on a fresh view, which only costs one more render.
        self._sync()
        stamp = self._stamps.get(version_id, _UNSEEN)
        if stamp == _UNSEEN:
            stamp, queue_generation = self.store.changes(version_id)
            self._queue_generation = max(self._queue_generation, queue_generation)
            if stamp is not None:
                self._remember(self._stamps, version_id, stamp)
        if stamp is None:  # no such version, or deleted: nothing to cache
            return self._uncached(version_id)
        now, queue_generation = time.monotonic(), self._queue_generation
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
                return self._uncached(version_id)
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

    def _sync(self) -> None:
        """Bring the counters of the jobs seen here up to date: once a turn of the event loop (at
        every call off a loop)."""
        if self._synced_this_turn:
            return
        moved = self.store.changes_since(self._seq)
        for version_id, counter in moved.versions.items():
            if version_id in self._stamps:
                self._stamps[version_id] = counter
        if moved.queue is not None:
            self._queue_generation = max(self._queue_generation, moved.queue)
        self._seq = moved.seq
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not on an event loop (a test, a script): look at every call
            return
        # Forgotten before the next turn answers anything: callbacks run in the order scheduled,
        # and the requests that turn reads from its sockets run after this one.
        self._synced_this_turn = True
        loop.call_soon(self._end_turn)

    def _end_turn(self) -> None:
        self._synced_this_turn = False

    def _uncached(self, version_id: str) -> T | None:
        """The view from one consistent read of the job, its position and artifacts."""
        fresh = self.store.version_view(version_id)
        return self.render(fresh[0], fresh[2], fresh[1]) if fresh is not None else None

    def _position(self, version_id: str, queue_generation: int) -> int | None:
        if self._positions[0] != queue_generation:
            self._positions = (queue_generation, self.store.queue_positions())
        return self._positions[1].get(version_id)

    def _remember(self, table: dict, key: str, value) -> None:
        if len(table) >= self.max_entries and key not in table:
            table.clear()
        table[key] = value
