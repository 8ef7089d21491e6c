"""Cached per-job views for pollers, shared by both dialects (GET /version, GET /v1/videos/{id}).

Pollers hit these hard (bench/api.py runs 50 in a loop) while the follower writes status, stage,
progress and worker figures of running jobs several times a second. A view depends on its own
job row and artifacts (the version's change counter says when those changed), on its queue
position while queued (the queues' counter says when any job entered or left a queue or moved in
it) and, for fields that move with the clock (an ETA, an expiry), on time: ``max_age`` bounds how
long a rendered view stays good. The counters live in the database (:mod:`api.store.changes`),
bumped by every write whichever process makes it, and a ``get`` reads them (one indexed query),
so a view cached here is never older than the last write another API process or a schedule made.
Where the store can tell cheaply whether anything was committed at all (SQLite's commit mark), a
turn of the event loop asks it once for every request it answers, and reads counters only after
a commit: the answers of a turn are to requests that arrived before it began, so each still
shows every write committed before its request.
Positions come from one query per queue change for all queues at once, so a job leaving the queue
does not send every queued poller to the database. :class:`JobViews` runs on the event loop only:
no locks.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
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
    commits: int | None  # the store's commit mark it is known current at (None: none known)
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
        self._turn_commits: tuple[int | None] | None = None  # this loop turn's commit mark, once read

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
        # The commit mark, then the counters are read before the data: a write in between leaves
        # a stale stamp on a fresh view, which only costs one more render.
        commits = self._commits()
        now = time.monotonic()
        cached = self._rendered.get(version_id)
        if (
            cached is not None
            and commits is not None
            and cached.commits == commits
            and now < cached.fresh_until
        ):
            return cached.value  # nothing was committed since it was known current
        stamp, queue_generation = self.store.changes(version_id)
        if stamp is None:  # no such version (or one no counter covers): nothing to cache
            return self._uncached(version_id)
        if (
            cached is not None
            and cached.stamp == stamp
            and cached.queue_generation in (None, queue_generation)
            and now < cached.fresh_until
        ):
            if commits is not None:
                self._rendered[version_id] = replace(cached, commits=commits)
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
            commits,
            now + age if age is not None else math.inf,
            value,
        )
        self._remember(self._rendered, version_id, rendered)
        return value

    def _commits(self) -> int | None:
        """The store's commit mark (None: it has none), read once a turn of the event loop."""
        if self._turn_commits is not None:
            return self._turn_commits[0]
        commits = self.store.commit_mark()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not on an event loop (a test, a script): read at every call
            return commits
        # Forgotten before the next turn answers anything: callbacks run in the order scheduled,
        # and the requests that turn reads from its sockets run after this one.
        self._turn_commits = (commits,)
        loop.call_soon(self._end_turn)
        return commits

    def _end_turn(self) -> None:
        self._turn_commits = None

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
