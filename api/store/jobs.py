"""Jobs: the record of one requested version, from accept (with its idempotency key) through
submission, the runs it follows, its status and a cancel request, to its deletion."""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from api.core.records import JobLive, JobRecord, JobResult, UnknownVersion, stored
from api.store.engine import StoreEngine
from api.store.outbox import add_delivery
from api.store.tables import Artifact, CallbackOutbox, IdempotencyKey, Job

JobKind = Literal["r2v", "merge"]
JobStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]
STATUSES: tuple[str, ...] = ("queued", "running", "succeeded", "failed", "cancelled")
FINISHED: tuple[str, ...] = ("succeeded", "failed", "cancelled")


def payload_hash(normalized: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of a normalized request (sorted keys, no whitespace)."""
    canonical = json.dumps(normalized, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


class IdempotencyConflict(Exception):
    """The ``job_id`` is already bound to a different payload (HTTP 409)."""

    def __init__(self, job_id: str, version_id: str):
        super().__init__(f"job_id {job_id!r} was already used for a different request (version {version_id})")
        self.job_id = job_id
        self.version_id = version_id


@dataclass(frozen=True)
class NewJob:
    kind: JobKind
    work_id: str
    request: dict[str, Any]  # normalized request, incl. resolved input asset paths
    payload_hash: str  # see payload_hash(); decides idempotent replay vs 409
    shot_id: str | None = None
    job_id: str | None = None
    callback_url: str | None = None
    callback_context: dict[str, Any] | None = None
    version_id: str | None = None  # default: a fresh uuid4 hex
    dialect: str = "r2v"  # the HTTP dialect that created the job: 'r2v' or 'openai'
    submitter: str | None = None  # the submitting API key's name
    priority: int = 0  # higher runs first (re-renders go below interactive requests)


@dataclass(frozen=True)
class AcceptResult:
    version_id: str
    created: bool  # False: an idempotent replay of an earlier request with the same job_id
    job: JobRecord


def job_record(row: Job) -> JobRecord:
    return JobRecord(
        version_id=row.version_id,
        kind=row.kind,
        work_id=row.work_id,
        shot_id=row.shot_id,
        job_id=row.job_id,
        payload_hash=row.payload_hash,
        request=row.request,
        callback_url=row.callback_url,
        callback_context=row.callback_context,
        status=row.status,
        stage=row.stage,
        error=row.error,
        run_id=row.run_id,
        root_run_id=row.root_run_id,
        submitted_at=row.submitted_at,
        created_at=row.created_at,
        updated_at=row.updated_at,
        finished_at=row.finished_at,
        result=row.result,
        live=row.live,
        dialect=row.dialect,
        submitter=row.submitter,
        cancel_requested_at=row.cancel_requested_at,
        priority=row.priority or 0,
    )


class _Unset:
    pass


def started_at(live: dict[str, Any] | None) -> float | None:
    """The first stage a worker stamped (claimed...), from the follower's live snapshot."""
    times = (live or {}).get("stage_times") or {}
    stamps = [t for stage, t in times.items() if stage != "queued" and isinstance(t, int | float)]
    return min(stamps) if stamps else None


_UNSET: Any = _Unset()


class JobsStore(StoreEngine):
    def accept(self, job: NewJob) -> AcceptResult:
        """Insert the job (and its idempotency key) atomically.

        Same ``job_id`` and same ``payload_hash``: returns the existing version with ``created=False``.
        Same ``job_id``, different hash (or kind): raises :class:`IdempotencyConflict`. Two racing
        requests with one ``job_id``: the key's primary key lets exactly one insert win; the other
        re-reads the winner.
        """
        now = time.time()
        version_id = job.version_id or uuid.uuid4().hex
        try:
            with self._write() as s:
                row = Job(
                    version_id=version_id,
                    kind=job.kind,
                    work_id=job.work_id,
                    shot_id=job.shot_id,
                    job_id=job.job_id,
                    payload_hash=job.payload_hash,
                    request=job.request,
                    callback_url=job.callback_url,
                    callback_context=job.callback_context,
                    status="queued",
                    stage="queued",
                    created_at=now,
                    updated_at=now,
                    dialect=job.dialect,
                    submitter=job.submitter,
                    priority=job.priority,
                )
                s.add(row)
                s.flush()  # the job first: the key's foreign key points at it
                if job.job_id is not None:
                    s.add(
                        IdempotencyKey(
                            job_id=job.job_id, version_id=version_id, payload_hash=job.payload_hash
                        )
                    )
                    s.flush()
                record = job_record(row)
            self.events.job_accepted(record)
            return AcceptResult(version_id=version_id, created=True, job=record)
        except IntegrityError:
            if job.job_id is None:
                raise
        with self._read() as s:
            key = s.get(IdempotencyKey, job.job_id)
            if key is None:  # the integrity error was something else (e.g. an explicit version_id reused)
                raise RuntimeError(f"could not insert job {version_id}") from None
            existing = s.get(Job, key.version_id)
            assert existing is not None
            if key.payload_hash != job.payload_hash or existing.kind != job.kind:
                raise IdempotencyConflict(job.job_id, key.version_id)
            return AcceptResult(version_id=key.version_id, created=False, job=job_record(existing))

    def idempotent_version(self, job_id: str) -> tuple[str, str, str] | None:
        """``(version_id, payload_hash, kind)`` already stored under ``job_id``, if any: lets a route
        answer a replay (or a 409) before fetching any input."""
        with self._read() as s:
            key = s.get(IdempotencyKey, job_id)
            if key is None:
                return None
            job = s.get(Job, key.version_id)
            return key.version_id, key.payload_hash, job.kind if job is not None else ""

    def get(self, version_id: str) -> JobRecord | None:
        with self._read() as s:
            row = s.get(Job, version_id)
            return job_record(row) if row is not None else None

    def by_run_id(self, run_id: str) -> JobRecord | None:
        """The job whose current or root run is ``run_id``."""
        with self._read() as s:
            row = s.scalars(
                select(Job).where((Job.run_id == run_id) | (Job.root_run_id == run_id)).limit(1)
            ).first()
            return job_record(row) if row is not None else None

    def _job_for_update(self, s: Session, version_id: str) -> Job:
        row = s.get(Job, version_id, with_for_update=True)
        if row is None:
            raise UnknownVersion(version_id)
        return row

    def mark_submitted(self, version_id: str, run_id: str) -> bool:
        """Record the Dagster run a job was submitted as. False if it was already submitted (kept)."""
        with self._write() as s:
            row = self._job_for_update(s, version_id)
            if row.submitted_at is not None:
                return False
            now = time.time()
            row.run_id = run_id
            row.root_run_id = row.root_run_id or run_id
            row.submitted_at = now
            row.updated_at = now
            return True

    def unsubmitted(self, per_kind: int | None = None) -> list[JobRecord]:
        """Accepted jobs never handed to Dagster (e.g. the process died in between), oldest first;
        ``per_kind``: only the oldest so many of each kind (one query, however many wait)."""
        pending = Job.submitted_at.is_(None), Job.status.in_(("queued", "running"))
        order = (Job.created_at, Job.version_id)
        with self._read() as s:
            if per_kind is None:
                rows = s.scalars(select(Job).where(*pending).order_by(*order)).all()
                return [job_record(r) for r in rows]
            rank = func.row_number().over(partition_by=Job.kind, order_by=order).label("rank")
            ranked = select(Job.version_id, rank).where(*pending).subquery()
            rows = s.scalars(
                select(Job)
                .join(ranked, ranked.c.version_id == Job.version_id)
                .where(ranked.c.rank <= per_kind)
                .order_by(*order)
            ).all()
            return [job_record(r) for r in rows]

    def unfinished(self, kind: JobKind | None = None) -> list[JobRecord]:
        """Submitted jobs still queued or running (what a status follower polls), oldest first."""
        with self._read() as s:
            q = select(Job).where(Job.submitted_at.is_not(None), Job.status.in_(("queued", "running")))
            if kind is not None:
                q = q.where(Job.kind == kind)
            rows = s.scalars(q.order_by(Job.created_at, Job.version_id)).all()
            return [job_record(r) for r in rows]

    def unfinished_runs(self) -> dict[str, str]:
        """run id -> version id of the submitted jobs still queued or running: the follower's tick,
        without loading (and decoding) every job row of a long queue."""
        with self._read() as s:
            q = select(Job.run_id, Job.version_id).where(
                Job.run_id.is_not(None), Job.status.in_(("queued", "running"))
            )
            return {run_id: version_id for run_id, version_id in s.execute(q)}

    def update_status(
        self,
        version_id: str,
        *,
        status: JobStatus | None = None,
        stage: str | None = None,
        error: str | None = _UNSET,
        result: JobResult | dict[str, Any] | None = _UNSET,
        live: JobLive | dict[str, Any] | None = _UNSET,
        callback: Callable[[JobRecord], dict[str, Any]] | None = None,
    ) -> JobRecord:
        """Change status/stage/error/result (arguments left out are kept). Entering succeeded or failed
        stamps ``finished_at``. An update saying queued or running that reaches a finished job
        changes nothing: it was seen before the job finished (the tracker saw the run queued, and a
        cancel landed before its write), and its stage or progress would contradict the
        outcome. ``callback``: the
        payload of the job's callback, queued in the outbox in the same transaction as the change
        that finishes the job (when it asked for one): the outcome and its callback are recorded
        together or not at all, whatever happens to the database or the process in between."""
        if status is not None and status not in STATUSES:
            raise ValueError(f"unknown status {status!r}")
        with self._write() as s:
            row = self._job_for_update(s, version_id)
            now = time.time()
            finishing = status in FINISHED and row.status not in FINISHED  # once: under the row lock
            if status is not None and status not in FINISHED and row.status in FINISHED:
                return job_record(row)  # seen before it finished: not written
            if status is not None:
                if status in FINISHED and row.status != status:
                    row.finished_at = now
                row.status = status
            if stage is not None:
                row.stage = stage
            if error is not _UNSET:
                row.error = error
            if result is not _UNSET:
                row.result = stored(result)
            if live is not _UNSET:
                row.live = stored(live)
            row.updated_at = now
            record = job_record(row)
            if finishing and callback is not None and row.callback_url:
                add_delivery(s, version_id, row.callback_url, callback(record), now)
        if finishing:
            self.events.job_finished(record)
        return record

    def start_step(self, version_id: str, run_id: str) -> JobRecord:
        """Point the version at the run of its next step (its retries have it as their root)."""
        with self._write() as s:
            row = self._job_for_update(s, version_id)
            row.run_id = row.root_run_id = run_id
            row.updated_at = time.time()
            return job_record(row)

    def follow_run(self, version_id: str, new_run_id: str) -> JobRecord:
        """Point the version at a retry's run (a retry gets a new run id; the root run id is kept)."""
        with self._write() as s:
            row = self._job_for_update(s, version_id)
            now = time.time()
            row.root_run_id = row.root_run_id or row.run_id or new_run_id
            row.run_id = new_run_id
            if row.submitted_at is None:
                row.submitted_at = now
            row.updated_at = now
            return job_record(row)

    def request_cancel(self, version_id: str) -> JobRecord:
        """Record that a client asked to stop the job (durable: the follower acts on it)."""
        with self._write() as s:
            row = self._job_for_update(s, version_id)
            if row.cancel_requested_at is None:
                row.cancel_requested_at = row.updated_at = time.time()
            return job_record(row)

    def cancel_requested(self) -> list[JobRecord]:
        """Unfinished jobs a client asked to stop."""
        with self._read() as s:
            rows = s.scalars(
                select(Job).where(Job.cancel_requested_at.is_not(None), Job.status.in_(("queued", "running")))
            ).all()
            return [job_record(r) for r in rows]

    def delete_job(self, version_id: str) -> list[str]:
        """Remove a job with its idempotency keys, artifacts and callback; returns the artifact
        paths (relative to media_root) for the caller to remove from disk."""
        with self._write() as s:
            row = self._job_for_update(s, version_id)
            arts = s.scalars(select(Artifact).where(Artifact.version_id == version_id)).all()
            paths = [a.path for a in arts]
            for art in arts:
                s.delete(art)
            for key in s.scalars(select(IdempotencyKey).where(IdempotencyKey.version_id == version_id)).all():
                s.delete(key)
            for out in s.scalars(select(CallbackOutbox).where(CallbackOutbox.version_id == version_id)).all():
                s.delete(out)
            s.flush()
            s.delete(row)
            return paths
