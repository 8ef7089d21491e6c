"""The queue: a queued job's position (higher priority first, then FIFO), every position at once,
one job's view (the job with its position and artifacts, in one read), priorities, and the queue's
counts and its oldest running job."""

from __future__ import annotations

import time

from sqlalchemy import and_, func, or_, select, tuple_
from sqlalchemy.orm import Session

from api.store.artifacts import ArtifactRecord, artifacts_of
from api.store.engine import StoreEngine
from api.store.jobs import STATUSES, JobKind, JobRecord, UnknownVersion, job_record, started_at
from api.store.tables import Job


class QueueStore(StoreEngine):
    @staticmethod
    def _position(s: Session, row: Job) -> int | None:
        if row.status != "queued":
            return None
        earlier = tuple_(Job.created_at, Job.version_id) < tuple_(row.created_at, row.version_id)
        priority = row.priority or 0
        ahead = s.scalar(
            select(func.count())
            .select_from(Job)
            .where(
                Job.kind == row.kind,
                Job.status == "queued",
                or_(Job.priority > priority, and_(Job.priority == priority, earlier)),
            )
        )
        return int(ahead or 0) + 1

    def queue_position(self, version_id: str) -> int | None:
        """1-based position among queued jobs of the same kind (higher priority first, then FIFO);
        None unless the job is queued."""
        with self._read() as s:
            row = s.get(Job, version_id)
            return self._position(s, row) if row is not None else None

    def version_view(self, version_id: str) -> tuple[JobRecord, int | None, list[ArtifactRecord]] | None:
        """The job, its queue position and its artifacts in one read."""
        with self._read() as s:
            row = s.get(Job, version_id)
            if row is None:
                return None
            return job_record(row), self._position(s, row), artifacts_of(s, version_id)

    def job_view(self, version_id: str) -> tuple[JobRecord, list[ArtifactRecord]] | None:
        """The job and its artifacts in one read (no queue position: see ``queue_positions``)."""
        with self._read() as s:
            row = s.get(Job, version_id)
            return (job_record(row), artifacts_of(s, version_id)) if row is not None else None

    def queue_positions(self) -> dict[str, int]:
        """Every queued version's 1-based FIFO position in its kind's queue, in one query."""
        with self._read() as s:
            rows = s.execute(
                select(Job.kind, Job.version_id)
                .where(Job.status == "queued")
                .order_by(Job.priority.desc(), Job.created_at, Job.version_id)
            ).all()
        counts: dict[str, int] = {}
        positions = {}
        for kind, version_id in rows:
            counts[kind] = positions[version_id] = counts.get(kind, 0) + 1
        return positions

    def set_priority(self, version_id: str, priority: int) -> JobRecord:
        """A queued job's priority (higher runs first). UnknownVersion / ValueError (not queued)."""
        with self._write() as s:
            row = s.get(Job, version_id)
            if row is None:
                raise UnknownVersion(version_id)
            if row.status != "queued":
                raise ValueError(f"version {version_id} is {row.status}, not queued")
            row.priority = priority
            row.updated_at = time.time()
            return job_record(row)

    def queued_of_work(self, work_id: str) -> list[JobRecord]:
        with self._read() as s:
            rows = s.scalars(
                select(Job).where(Job.work_id == work_id, Job.status == "queued").order_by(Job.created_at)
            ).all()
            return [job_record(r) for r in rows]

    def oldest_running_start(self) -> float | None:
        """When the longest-running shot started (claimed by a worker), if any runs."""
        with self._read() as s:
            rows = s.execute(
                select(Job.live, Job.submitted_at).where(Job.kind == "r2v", Job.status == "running")
            ).all()
        starts = [started_at(live) or submitted for live, submitted in rows]
        starts = [t for t in starts if t is not None]
        return min(starts) if starts else None

    def counts_by_status(self, kind: JobKind) -> dict[str, int]:
        """{queued, running, succeeded, failed: n} for one kind (zeros included)."""
        with self._read() as s:
            rows = s.execute(
                select(Job.status, func.count()).where(Job.kind == kind).group_by(Job.status)
            ).all()
        counts = dict.fromkeys(STATUSES, 0)
        counts.update({status: int(n) for status, n in rows})
        return counts
