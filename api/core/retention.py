"""The bounds of the job store (the video job API's "job store"): a finished job lives
``job_ttl_s`` and then reads as 404; the outputs of finished jobs take at most ``store_max_bytes``,
oldest evicted first; uploads in flight hold room in the same budget.

A version still needed keeps its MP4 past its expiry or an eviction (it stops being listed, its
record stays): one a merge job names (it is in a film), or the newest successful version of a shot
the client named itself (``extra_params.shot_id``: a memory source by ``shot_id``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from api.core.errors import TooLarge
from api.core.jobs import JobService
from api.core.records import JobRecord
from api.store import Store
from settings.api import OpenAIConfig

log = logging.getLogger("shotloom.api.retention")
DIALECTS = ("openai", "images")  # whose jobs the store bounds (R2V versions are kept as lineage)


class Retention:
    def __init__(
        self, store: Store, jobs: JobService, cfg: OpenAIConfig, clock: Callable[[], float] = time.time
    ):
        self.store, self.jobs, self.cfg, self.clock = store, jobs, cfg, clock
        self._reserved = 0
        self._lock = threading.Lock()

    # -- expiry ---------------------------------------------------------------------------------
    def expires_at(self, job: JobRecord) -> float | None:
        return job.finished_at + self.cfg.job_ttl_s if job.finished_at is not None else None

    def expired(self, job: JobRecord) -> bool:
        at = self.expires_at(job)
        return at is not None and at <= self.clock()

    def cutoff(self) -> float:
        """Jobs that finished before this have expired."""
        return self.clock() - self.cfg.job_ttl_s

    def needed(self, job: JobRecord) -> bool:
        if self.store.merges_naming(job.version_id):
            return True
        if job.status == "succeeded" and job.shot_id and job.shot_id != f"video_{job.version_id}":
            newest = self.store.newest_succeeded_shot(job.work_id, job.shot_id)
            return newest is not None and newest.version_id == job.version_id
        return False

    def sweep(self) -> int:
        """Remove expired jobs, then evict the oldest finished outputs past the byte budget.
        Returns how many jobs were removed."""
        removed = 0
        for job in self._finished(finished_before=self.cutoff()):
            if not self.needed(job):
                self._remove(job)
                removed += 1
        used = self._used()
        if used > self.cfg.store_max_bytes:
            for job in self._finished():  # oldest first
                if used <= self.cfg.store_max_bytes:
                    break
                if self.needed(job):
                    continue
                used -= self.store.output_bytes(job.dialect, job.version_id)
                self._remove(job)
                removed += 1
        return removed

    def _finished(self, finished_before: float | None = None) -> list[JobRecord]:
        jobs = [j for d in DIALECTS for j in self.store.finished_jobs(d, finished_before=finished_before)]
        return sorted(jobs, key=lambda j: j.finished_at or 0.0)

    def _used(self) -> int:
        return sum(self.store.output_bytes(d) for d in DIALECTS)

    def _remove(self, job: JobRecord) -> None:
        try:
            self.jobs.delete(job.version_id)
            log.info(
                "job store: removed %s (finished %.0f s ago)", job.version_id, self.clock() - job.finished_at
            )
        except Exception as exc:  # removed meanwhile (a DELETE): nothing to do
            log.debug("job store: %s: %s", job.version_id, exc)

    # -- room for uploads -----------------------------------------------------------------------
    def free_bytes(self) -> int:
        return self.cfg.store_max_bytes - self._used() - self._reserved

    def reserve(self, size: int, what: str) -> None:
        """Hold ``size`` bytes for an upload arriving now (TooLarge when they do not fit)."""
        with self._lock:
            free = self.free_bytes()
            if size > free:
                raise TooLarge(
                    f"{what} needs {size} bytes and the job store has {max(0, free)} free "
                    f"({self._reserved} held by uploads arriving now, limit {self.cfg.store_max_bytes})"
                )
            self._reserved += size

    def release(self, size: int) -> None:
        with self._lock:
            self._reserved = max(0, self._reserved - size)
