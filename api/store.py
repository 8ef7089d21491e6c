"""The API's service store: versions (jobs), idempotency keys, artifact index, input assets, callback outbox.

SQLAlchemy 2.x ORM over any SQLAlchemy URL: SQLite by default (WAL, busy timeout, ``BEGIN IMMEDIATE`` for
writes so concurrent writers queue up instead of failing), PostgreSQL works with the same code.
Every public method is its own short transaction and returns plain frozen dataclasses (no ORM object
escapes a session). Times are unix seconds (float).

Dagster's run storage stays the source of truth for runs; this store maps the service's ids onto runs
(``version_id`` -> current ``run_id``, following retries) and keeps what Dagster does not: idempotency,
the artifact index the HTTP routes answer from, stored input resources and pending callbacks.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from sqlalchemy import (
    JSON,
    BigInteger,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    and_,
    create_engine,
    event,
    func,
    inspect,
    or_,
    select,
    text,
    tuple_,
)
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

JobKind = Literal["r2v", "merge"]
JobStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]
STATUSES: tuple[str, ...] = ("queued", "running", "succeeded", "failed", "cancelled")
FINISHED: tuple[str, ...] = ("succeeded", "failed", "cancelled")
DeliveryStatus = Literal["pending", "delivered", "gave_up"]

__all__ = [
    "AcceptResult",
    "ArtifactRecord",
    "CallbackDelivery",
    "IdempotencyConflict",
    "InputAssetRecord",
    "JobRecord",
    "NewJob",
    "Store",
    "UnknownVersion",
    "backoff_delay",
    "payload_hash",
]


def payload_hash(normalized: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of a normalized request (sorted keys, no whitespace)."""
    canonical = json.dumps(normalized, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def backoff_delay(attempts: int, base_seconds: float, cap_seconds: float = 300.0) -> float:
    """Exponential backoff after ``attempts`` failed deliveries: base, 2*base, 4*base, ... capped."""
    return min(cap_seconds, base_seconds * (2 ** max(0, attempts - 1)))


class IdempotencyConflict(Exception):
    """The ``job_id`` is already bound to a different payload (HTTP 409)."""

    def __init__(self, job_id: str, version_id: str):
        super().__init__(f"job_id {job_id!r} was already used for a different request (version {version_id})")
        self.job_id = job_id
        self.version_id = version_id


class UnknownVersion(KeyError):
    """No job with this version id (HTTP 404)."""


# -- tables -------------------------------------------------------------------------------------


class Base(DeclarativeBase):
    pass


class Job(Base):
    __tablename__ = "jobs"

    version_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    work_id: Mapped[str] = mapped_column(String(255))
    shot_id: Mapped[str | None] = mapped_column(String(255))
    job_id: Mapped[str | None] = mapped_column(String(255))
    payload_hash: Mapped[str] = mapped_column(String(64))
    request: Mapped[dict[str, Any]] = mapped_column(JSON)
    callback_url: Mapped[str | None] = mapped_column(Text)
    callback_context: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16), default="queued")
    stage: Mapped[str] = mapped_column(String(64), default="queued")
    error: Mapped[str | None] = mapped_column(Text)
    run_id: Mapped[str | None] = mapped_column(String(64))
    root_run_id: Mapped[str | None] = mapped_column(String(64))
    submitted_at: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)
    finished_at: Mapped[float | None] = mapped_column(Float)
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # What the status follower last read from Dagster: stage times, progress, worker (kept so
    # GET /version answers from this store alone, fast, and the same after a restart).
    live: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # Which HTTP dialect created the job ('r2v' or 'openai'), the API key's name that submitted it, and
    # when a cancel was asked for (migration 0002_v1_jobs; jobs from before it read back as 'r2v').
    dialect: Mapped[str] = mapped_column(String(16), default="r2v", server_default="r2v")
    submitter: Mapped[str | None] = mapped_column(String(255))
    cancel_requested_at: Mapped[float | None] = mapped_column(Float)
    # Higher runs first (Dagster's dagster/priority); FIFO among equals. Operators change it.
    priority: Mapped[int] = mapped_column(Integer, default=0, server_default="0")

    __table_args__ = (
        Index("ix_jobs_kind_status_created", "kind", "status", "created_at"),
        Index("ix_jobs_shot", "work_id", "shot_id", "status"),
        Index("ix_jobs_run_id", "run_id"),
        Index("ix_jobs_submitted", "submitted_at"),
        Index("ix_jobs_dialect_created", "dialect", "created_at"),
    )


class IdempotencyKey(Base):
    __tablename__ = "idempotency_keys"

    job_id: Mapped[str] = mapped_column(String(255), primary_key=True)  # PK: unique by construction
    version_id: Mapped[str] = mapped_column(ForeignKey("jobs.version_id"))
    payload_hash: Mapped[str] = mapped_column(String(64))


class Artifact(Base):
    __tablename__ = "artifacts"

    artifact_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    version_id: Mapped[str] = mapped_column(ForeignKey("jobs.version_id"), index=True)
    work_id: Mapped[str] = mapped_column(String(255))
    shot_id: Mapped[str | None] = mapped_column(String(255))
    kind: Mapped[str] = mapped_column(String(32))
    role: Mapped[str] = mapped_column(String(64))
    path: Mapped[str] = mapped_column(Text)  # relative to media_root
    url_path: Mapped[str] = mapped_column(Text)  # e.g. /media/r2v/demo/shot-1/<id>/output.mp4
    bytes: Mapped[int | None] = mapped_column(BigInteger)  # 64-bit on PostgreSQL too (files > 2 GiB)
    sha256: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[float] = mapped_column(Float)
    metadata_: Mapped[dict[str, Any] | None] = mapped_column("metadata", JSON)

    __table_args__ = (UniqueConstraint("version_id", "path", name="uq_artifacts_version_path"),)


class InputAsset(Base):
    __tablename__ = "input_assets"

    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    path: Mapped[str] = mapped_column(Text)  # relative to the assets dir
    media_type: Mapped[str] = mapped_column(String(128))
    bytes: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[float] = mapped_column(Float)


class Character(Base):
    """A named reference (a representative frame, and an audio track where the source had one)
    taken once from a video; usable as a memory slot in both dialects. Its files are input assets."""

    __tablename__ = "characters"

    character_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(255))
    image_sha256: Mapped[str] = mapped_column(ForeignKey("input_assets.sha256"))
    audio_sha256: Mapped[str | None] = mapped_column(ForeignKey("input_assets.sha256"))
    source: Mapped[dict[str, Any]] = mapped_column(JSON)  # {"version_id": ...} or {"upload_sha256": ...}
    submitter: Mapped[str | None] = mapped_column(String(255))
    created_at: Mapped[float] = mapped_column(Float)


class CallbackOutbox(Base):
    __tablename__ = "callback_outbox"

    delivery_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    version_id: Mapped[str] = mapped_column(ForeignKey("jobs.version_id"), unique=True)  # one per job
    url: Mapped[str] = mapped_column(Text)
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[float | None] = mapped_column(Float)
    status: Mapped[str] = mapped_column(String(16), default="pending")
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[float] = mapped_column(Float)
    delivered_at: Mapped[float | None] = mapped_column(Float)

    __table_args__ = (Index("ix_outbox_due", "status", "next_attempt_at"),)


# -- records returned to callers ----------------------------------------------------------------


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
class JobRecord:
    version_id: str
    kind: str
    work_id: str
    shot_id: str | None
    job_id: str | None
    payload_hash: str
    request: dict[str, Any]
    callback_url: str | None
    callback_context: dict[str, Any] | None
    status: str
    stage: str
    error: str | None
    run_id: str | None
    root_run_id: str | None
    submitted_at: float | None
    created_at: float
    updated_at: float
    finished_at: float | None
    result: dict[str, Any] | None
    live: dict[str, Any] | None = None
    dialect: str = "r2v"
    submitter: str | None = None
    cancel_requested_at: float | None = None
    priority: int = 0


@dataclass(frozen=True)
class AcceptResult:
    version_id: str
    created: bool  # False: an idempotent replay of an earlier request with the same job_id
    job: JobRecord


@dataclass(frozen=True)
class ArtifactRecord:
    artifact_id: str
    version_id: str
    work_id: str
    shot_id: str | None
    kind: str
    role: str
    path: str
    url_path: str
    bytes: int | None
    sha256: str | None
    created_at: float
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class InputAssetRecord:
    sha256: str
    path: str
    media_type: str
    bytes: int
    created_at: float


@dataclass(frozen=True)
class CharacterRecord:
    character_id: str
    name: str
    image: InputAssetRecord
    audio: InputAssetRecord | None
    source: dict[str, Any]
    submitter: str | None
    created_at: float


@dataclass(frozen=True)
class CallbackDelivery:
    delivery_id: str
    version_id: str
    url: str
    payload: dict[str, Any]
    attempts: int
    next_attempt_at: float | None
    status: str
    last_error: str | None
    created_at: float
    delivered_at: float | None


def _job_record(row: Job) -> JobRecord:
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


def _artifact_record(row: Artifact) -> ArtifactRecord:
    return ArtifactRecord(
        artifact_id=row.artifact_id,
        version_id=row.version_id,
        work_id=row.work_id,
        shot_id=row.shot_id,
        kind=row.kind,
        role=row.role,
        path=row.path,
        url_path=row.url_path,
        bytes=row.bytes,
        sha256=row.sha256,
        created_at=row.created_at,
        metadata=dict(row.metadata_ or {}),
    )


def _asset_record(row: InputAsset) -> InputAssetRecord:
    return InputAssetRecord(
        sha256=row.sha256,
        path=row.path,
        media_type=row.media_type,
        bytes=row.bytes,
        created_at=row.created_at,
    )


def _delivery_record(row: CallbackOutbox) -> CallbackDelivery:
    return CallbackDelivery(
        delivery_id=row.delivery_id,
        version_id=row.version_id,
        url=row.url,
        payload=row.payload,
        attempts=row.attempts,
        next_attempt_at=row.next_attempt_at,
        status=row.status,
        last_error=row.last_error,
        created_at=row.created_at,
        delivered_at=row.delivered_at,
    )


class _Unset:
    pass


def _started_at(live: dict[str, Any] | None) -> float | None:
    """The first stage a worker stamped (claimed...), from the follower's live snapshot."""
    times = (live or {}).get("stage_times") or {}
    stamps = [t for stage, t in times.items() if stage != "queued" and isinstance(t, int | float)]
    return min(stamps) if stamps else None


_UNSET: Any = _Unset()


# -- engine -------------------------------------------------------------------------------------

_READ_OPTION = "shotloom_read_only"


def _sqlite_engine(url: str, busy_timeout_s: float) -> Engine:
    parsed = make_url(url)
    database = parsed.database
    if database and database != ":memory:" and not database.startswith("file:"):
        Path(database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": busy_timeout_s})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let us issue BEGIN ourselves (pysqlite's implicit BEGIN is DEFERRED, which turns a
        # read-then-write transaction into an immediate SQLITE_BUSY under concurrency).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        # Writers take the write lock up front; the busy timeout queues them. Reads stay deferred.
        conn.exec_driver_sql("BEGIN" if conn.get_execution_options().get(_READ_OPTION) else "BEGIN IMMEDIATE")

    return engine


# Any constant: serializes concurrent create_schema() calls on one PostgreSQL database.
_SCHEMA_LOCK_KEY = 0x5_4071_00A1


_TOUCHED, _QUEUE_CHANGED = "shotloom_touched_versions", "shotloom_queue_changed"
_MAX_STAMPS = 100_000


def _note_changes(session: Session, _flush_context: Any) -> None:
    """after_flush: which job versions this write touched, and whether a queue's membership
    changed (its positions). The session's new/dirty/deleted sets and attribute history still
    show the flushed changes here."""
    touched: set[str] = session.info.setdefault(_TOUCHED, set())
    for obj in (*session.new, *session.dirty, *session.deleted):
        if isinstance(obj, Job):
            touched.add(obj.version_id)
            if obj in session.new or obj in session.deleted:
                session.info[_QUEUE_CHANGED] = True
            else:
                history = inspect(obj).attrs.status.history
                if "queued" in (*history.added, *history.deleted):
                    session.info[_QUEUE_CHANGED] = True
                if inspect(obj).attrs.priority.history.has_changes():  # the queue's order moved
                    session.info[_QUEUE_CHANGED] = True
        elif isinstance(obj, Artifact):
            touched.add(obj.version_id)


def _search_path_schema(url: str) -> str | None:
    """The first schema a PostgreSQL URL puts on its search_path (``options=-c search_path=x``)."""
    import re

    options = make_url(url).query.get("options")
    options = options if isinstance(options, str) else ""
    found = re.search(r"search_path\s*=\s*([A-Za-z_][A-Za-z0-9_]*)", options)
    return found.group(1) if found else None


class Store:
    """The service store. Thread-safe: every method opens its own session and transaction."""

    def __init__(self, url: str, *, busy_timeout_s: float = 30.0, create: bool = True):
        self.url = url
        # What committed writes changed, for readers that cache (api.core.views.JobViews): a stamp
        # per job version and a generation of queue membership. The API process is the store's
        # only writer, so a view read under unchanged stamps is still current.
        self.queue_generation = 0
        self._stamps: dict[str, int] = {}
        self._writes = 0
        self._stamp_floor = 0  # the stamp of versions not in _stamps (bounded: cleared when large)
        self._stamp_lock = threading.Lock()
        if make_url(url).get_backend_name() == "sqlite":
            self.engine = _sqlite_engine(url, busy_timeout_s)
        else:
            self.engine = create_engine(url, pool_pre_ping=True)
        self._read_engine = self.engine.execution_options(**{_READ_OPTION: True})
        self._write_sessions = sessionmaker(self.engine, expire_on_commit=False)
        event.listen(self._write_sessions, "after_flush", _note_changes)
        if create:
            self.create_schema()

    def create_schema(self) -> None:
        """Bring the schema to the newest Alembic revision (api/migrations): a new database runs them
        all, one from the release before migrations (tables, no alembic_version) is stamped at the
        baseline and upgraded in place. Already current (the usual start): one read, nothing else."""
        from api import migrations

        if self.engine.dialect.name == "postgresql":
            schema = _search_path_schema(self.url)
            if schema:  # a schema of its own beside another application's tables (Dagster's)
                with self.engine.begin() as conn:
                    conn.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{schema}"'))
            with self.engine.connect() as conn:
                if migrations.is_current(conn):
                    return
            # Migration checks race between processes starting at once; DDL is transactional here,
            # so take a transaction-scoped advisory lock and upgrade (re-checked) under it, atomically.
            with self.engine.begin() as conn:
                conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _SCHEMA_LOCK_KEY})
                migrations.upgrade(conn)
            return
        database = self.engine.url.database
        if database and database != ":memory:" and not database.startswith("file:"):
            # The first connection switches the file to WAL and creates the tables: processes
            # starting together on a new file get "database is locked" there, busy timeout or not.
            from filelock import FileLock

            with FileLock(database + ".lock"):
                self._upgrade_sqlite(migrations)
            return
        self._upgrade_sqlite(migrations)

    def _upgrade_sqlite(self, migrations: Any) -> None:
        with self._read_engine.connect() as conn:  # deferred BEGIN: no write lock just to look
            if migrations.is_current(conn):
                return
        with self.engine.begin() as conn:  # BEGIN IMMEDIATE: every revision in one transaction
            migrations.upgrade(conn)

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def _write(self) -> Iterator[Session]:
        session = self._write_sessions()
        try:
            with session, session.begin():
                yield session
        finally:
            self._publish(session.info)  # after the commit (or rollback): cached views are stale now

    def _publish(self, changes: dict[str, Any]) -> None:
        with self._stamp_lock:
            self._writes += 1
            if len(self._stamps) >= _MAX_STAMPS:
                self._stamps.clear()
                self._stamp_floor = self._writes - 1  # nothing unstamped changed after it
            for version_id in changes.get(_TOUCHED, ()):
                self._stamps[version_id] = self._writes
            if changes.get(_QUEUE_CHANGED):
                self.queue_generation += 1

    def version_stamp(self, version_id: str) -> int:
        """Changes when a write touches the version's job row or artifacts (read it before them)."""
        return self._stamps.get(version_id, self._stamp_floor)

    @contextmanager
    def _read(self) -> Iterator[Session]:
        with Session(self._read_engine, expire_on_commit=False) as session, session.begin():
            yield session

    # -- jobs -----------------------------------------------------------------------------------

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
                record = _job_record(row)
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
            return AcceptResult(version_id=key.version_id, created=False, job=_job_record(existing))

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
            return _job_record(row) if row is not None else None

    def by_run_id(self, run_id: str) -> JobRecord | None:
        """The job whose current or root run is ``run_id``."""
        with self._read() as s:
            row = s.scalars(
                select(Job).where((Job.run_id == run_id) | (Job.root_run_id == run_id)).limit(1)
            ).first()
            return _job_record(row) if row is not None else None

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

    def unsubmitted(self) -> list[JobRecord]:
        """Accepted jobs never handed to Dagster (e.g. the process died in between), oldest first."""
        with self._read() as s:
            rows = s.scalars(
                select(Job)
                .where(Job.submitted_at.is_(None), Job.status.in_(("queued", "running")))
                .order_by(Job.created_at, Job.version_id)
            ).all()
            return [_job_record(r) for r in rows]

    def unfinished(self, kind: JobKind | None = None) -> list[JobRecord]:
        """Submitted jobs still queued or running (what a status follower polls), oldest first."""
        with self._read() as s:
            q = select(Job).where(Job.submitted_at.is_not(None), Job.status.in_(("queued", "running")))
            if kind is not None:
                q = q.where(Job.kind == kind)
            rows = s.scalars(q.order_by(Job.created_at, Job.version_id)).all()
            return [_job_record(r) for r in rows]

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
        result: dict[str, Any] | None = _UNSET,
        live: dict[str, Any] | None = _UNSET,
    ) -> JobRecord:
        """Change status/stage/error/result (arguments left out are kept). Entering succeeded or failed
        stamps ``finished_at``; a finished job is not moved back to queued/running."""
        if status is not None and status not in STATUSES:
            raise ValueError(f"unknown status {status!r}")
        with self._write() as s:
            row = self._job_for_update(s, version_id)
            now = time.time()
            if status is not None and not (row.status in FINISHED and status not in FINISHED):
                if status in FINISHED and row.status != status:
                    row.finished_at = now
                row.status = status
            if stage is not None:
                row.stage = stage
            if error is not _UNSET:
                row.error = error
            if result is not _UNSET:
                row.result = result
            if live is not _UNSET:
                row.live = live
            row.updated_at = now
            return _job_record(row)

    def start_step(self, version_id: str, run_id: str) -> JobRecord:
        """Point the version at the run of its next step (its retries have it as their root)."""
        with self._write() as s:
            row = self._job_for_update(s, version_id)
            row.run_id = row.root_run_id = run_id
            row.updated_at = time.time()
            return _job_record(row)

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
            return _job_record(row)

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
            return _job_record(row), self._position(s, row), self._artifacts(s, version_id)

    def job_view(self, version_id: str) -> tuple[JobRecord, list[ArtifactRecord]] | None:
        """The job and its artifacts in one read (no queue position: see ``queue_positions``)."""
        with self._read() as s:
            row = s.get(Job, version_id)
            return (_job_record(row), self._artifacts(s, version_id)) if row is not None else None

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

    @staticmethod
    def _artifacts(s: Session, version_id: str) -> list[ArtifactRecord]:
        rows = s.scalars(
            select(Artifact)
            .where(Artifact.version_id == version_id)
            .order_by(Artifact.created_at, Artifact.artifact_id)
        ).all()
        return [_artifact_record(a) for a in rows]

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
            return _job_record(row)

    def queued_of_work(self, work_id: str) -> list[JobRecord]:
        with self._read() as s:
            rows = s.scalars(
                select(Job).where(Job.work_id == work_id, Job.status == "queued").order_by(Job.created_at)
            ).all()
            return [_job_record(r) for r in rows]

    def request_cancel(self, version_id: str) -> JobRecord:
        """Record that a client asked to stop the job (durable: the follower acts on it)."""
        with self._write() as s:
            row = self._job_for_update(s, version_id)
            if row.cancel_requested_at is None:
                row.cancel_requested_at = row.updated_at = time.time()
            return _job_record(row)

    def cancel_requested(self) -> list[JobRecord]:
        """Unfinished jobs a client asked to stop."""
        with self._read() as s:
            rows = s.scalars(
                select(Job).where(Job.cancel_requested_at.is_not(None), Job.status.in_(("queued", "running")))
            ).all()
            return [_job_record(r) for r in rows]

    def list_jobs(
        self,
        dialect: str,
        *,
        after: str | None = None,
        limit: int = 20,
        order: Literal["asc", "desc"] = "desc",
        finished_after: float | None = None,
    ) -> tuple[list[JobRecord], bool]:
        """One page of a dialect's jobs by creation time, after the job ``after`` (exclusive);
        and whether more follow. An unknown ``after`` raises :class:`UnknownVersion`."""
        with self._read() as s:
            q = select(Job).where(Job.dialect == dialect)
            if finished_after is not None:  # unfinished, or finished since (not expired)
                q = q.where(Job.finished_at.is_(None) | (Job.finished_at >= finished_after))
            key = tuple_(Job.created_at, Job.version_id)
            if after is not None:
                anchor = s.get(Job, after)
                if anchor is None or anchor.dialect != dialect:
                    raise UnknownVersion(after)
                mark = tuple_(anchor.created_at, anchor.version_id)
                q = q.where(key > mark if order == "asc" else key < mark)
            if order == "asc":
                q = q.order_by(Job.created_at, Job.version_id)
            else:
                q = q.order_by(Job.created_at.desc(), Job.version_id.desc())
            rows = s.scalars(q.limit(limit + 1)).all()
            return [_job_record(r) for r in rows[:limit]], len(rows) > limit

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

    def finished_jobs(self, dialect: str, *, finished_before: float | None = None) -> list[JobRecord]:
        """A dialect's finished jobs, oldest finish first (optionally only those before a time)."""
        with self._read() as s:
            q = select(Job).where(
                Job.dialect == dialect, Job.status.in_(FINISHED), Job.finished_at.is_not(None)
            )
            if finished_before is not None:
                q = q.where(Job.finished_at < finished_before)
            rows = s.scalars(q.order_by(Job.finished_at, Job.version_id)).all()
            return [_job_record(r) for r in rows]

    def output_bytes(self, dialect: str, version_id: str | None = None) -> int:
        """Bytes of the artifacts of a dialect's jobs (or of one job)."""
        with self._read() as s:
            q = select(func.coalesce(func.sum(Artifact.bytes), 0)).join(
                Job, Job.version_id == Artifact.version_id
            )
            q = q.where(Job.dialect == dialect)
            if version_id is not None:
                q = q.where(Job.version_id == version_id)
            return int(s.scalar(q) or 0)

    def merges_naming(self, version_id: str) -> bool:
        """Whether a merge job lists this version among its shots (the film needs its MP4)."""
        with self._read() as s:
            rows = s.scalars(select(Job.request).where(Job.kind == "merge")).all()
        for request in rows:
            shots = (request or {}).get("inputs", {}).get("shots", [])
            if any(shot.get("version_id") == version_id for shot in shots):
                return True
        return False

    def recent_durations(self, limit: int) -> list[float]:
        """Wall seconds from claim (or submission) to end of the newest succeeded shots."""
        with self._read() as s:
            rows = s.execute(
                select(Job.finished_at, Job.submitted_at, Job.live)
                .where(Job.kind == "r2v", Job.status == "succeeded", Job.finished_at.is_not(None))
                .order_by(Job.finished_at.desc())
                .limit(limit)
            ).all()
        out = []
        for finished, submitted, live in rows:
            start = _started_at(live) or submitted
            if start is not None and finished >= start:
                out.append(finished - start)
        return out

    def recent_stage_times(self, limit: int) -> list[tuple[dict[str, float], float, dict[str, Any]]]:
        """(stage_times, finished_at, result) of the newest succeeded shots that recorded stage
        times (the result: what their runs recorded, e.g. the steps and guidance they sampled)."""
        with self._read() as s:
            rows = s.execute(
                select(Job.live, Job.finished_at, Job.result)
                .where(Job.kind == "r2v", Job.status == "succeeded", Job.finished_at.is_not(None))
                .order_by(Job.finished_at.desc())
                .limit(limit)
            ).all()
        out = []
        for live, finished, result in rows:
            times = (live or {}).get("stage_times") or {}
            if times:
                out.append(({k: float(v) for k, v in times.items()}, finished, result or {}))
        return out

    def oldest_running_start(self) -> float | None:
        """When the longest-running shot started (claimed by a worker), if any runs."""
        with self._read() as s:
            rows = s.execute(
                select(Job.live, Job.submitted_at).where(Job.kind == "r2v", Job.status == "running")
            ).all()
        starts = [_started_at(live) or submitted for live, submitted in rows]
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

    def latest_shots(self, work_ids: list[str] | None, shot_ids: list[str] | None) -> list[JobRecord]:
        """The newest successful version of every shot (R2V and /v1 videos; not images or films),
        optionally only of some works and shots, in (work, shot) order."""
        with self._read() as s:
            query = select(Job).where(Job.kind == "r2v", Job.status == "succeeded", Job.dialect != "images")
            if work_ids is not None:
                query = query.where(Job.work_id.in_(work_ids))
            if shot_ids is not None:
                query = query.where(Job.shot_id.in_(shot_ids))
            newest: dict[tuple[str, str], Job] = {}
            for row in s.scalars(query.order_by(Job.finished_at, Job.created_at)).all():
                newest[(row.work_id, row.shot_id or "")] = row  # later rows win
            return [_job_record(newest[k]) for k in sorted(newest)]

    def newest_succeeded_shot(self, work_id: str, shot_id: str) -> JobRecord | None:
        """The newest successful R2V job for ``(work_id, shot_id)`` (a memory slot's ``shot_id``)."""
        with self._read() as s:
            row = s.scalars(
                select(Job)
                .where(
                    Job.kind == "r2v",
                    Job.work_id == work_id,
                    Job.shot_id == shot_id,
                    Job.status == "succeeded",
                )
                .order_by(Job.finished_at.desc().nulls_last(), Job.created_at.desc())
                .limit(1)
            ).first()
            return _job_record(row) if row is not None else None

    # -- artifacts ------------------------------------------------------------------------------

    def add_artifact(
        self,
        version_id: str,
        *,
        kind: str,
        role: str,
        path: str,
        url_path: str,
        bytes: int | None = None,  # noqa: A002 - the column's name
        sha256: str | None = None,
        metadata: dict[str, Any] | None = None,
        work_id: str | None = None,
        shot_id: str | None = None,
        artifact_id: str | None = None,
    ) -> ArtifactRecord:
        """Index one produced file (``path`` relative to media_root). Idempotent per (version, path):
        recording the same file again returns the existing record. work_id/shot_id default to the job's."""
        try:
            with self._write() as s:
                job = s.get(Job, version_id)
                if job is None:
                    raise UnknownVersion(version_id)
                row = Artifact(
                    artifact_id=artifact_id or uuid.uuid4().hex,
                    version_id=version_id,
                    work_id=work_id if work_id is not None else job.work_id,
                    shot_id=shot_id if shot_id is not None else job.shot_id,
                    kind=kind,
                    role=role,
                    path=path,
                    url_path=url_path,
                    bytes=bytes,
                    sha256=sha256,
                    created_at=time.time(),
                    metadata_=metadata or {},
                )
                s.add(row)
                s.flush()
                return _artifact_record(row)
        except IntegrityError:
            with self._read() as s:
                existing = s.scalars(
                    select(Artifact).where(Artifact.version_id == version_id, Artifact.path == path)
                ).first()
                if existing is None:
                    raise
                return _artifact_record(existing)

    def get_artifact(self, artifact_id: str) -> ArtifactRecord | None:
        with self._read() as s:
            row = s.get(Artifact, artifact_id)
            return _artifact_record(row) if row is not None else None

    def artifacts_for(self, version_id: str) -> list[ArtifactRecord]:
        with self._read() as s:
            return self._artifacts(s, version_id)

    # -- input assets ---------------------------------------------------------------------------

    def put_input_asset(self, sha256: str, path: str, media_type: str, size: int) -> InputAssetRecord:
        """Record a stored input resource (content-addressed: the first record for a digest wins)."""
        try:
            with self._write() as s:
                existing = s.get(InputAsset, sha256)
                if existing is not None:
                    return _asset_record(existing)
                row = InputAsset(
                    sha256=sha256, path=path, media_type=media_type, bytes=size, created_at=time.time()
                )
                s.add(row)
                s.flush()
                return _asset_record(row)
        except IntegrityError:  # a concurrent writer (non-SQLite backends) stored it first
            found = self.get_input_asset(sha256)
            if found is None:
                raise
            return found

    def get_input_asset(self, sha256: str) -> InputAssetRecord | None:
        with self._read() as s:
            row = s.get(InputAsset, sha256)
            return _asset_record(row) if row is not None else None

    # -- characters -------------------------------------------------------------------------------
    def put_character(
        self,
        character_id: str,
        name: str,
        image_sha256: str,
        audio_sha256: str | None,
        source: dict[str, Any],
        submitter: str | None,
    ) -> CharacterRecord:
        """Record a character (content-addressed: the same name and media give the same id, and
        the first record of an id wins)."""
        with self._write() as s:
            if s.get(Character, character_id) is None:
                s.add(
                    Character(
                        character_id=character_id,
                        name=name,
                        image_sha256=image_sha256,
                        audio_sha256=audio_sha256,
                        source=source,
                        submitter=submitter,
                        created_at=time.time(),
                    )
                )
        found = self.get_character(character_id)
        assert found is not None
        return found

    def get_character(self, character_id: str) -> CharacterRecord | None:
        with self._read() as s:
            row = s.get(Character, character_id)
            if row is None:
                return None
            image = s.get(InputAsset, row.image_sha256)
            audio = s.get(InputAsset, row.audio_sha256) if row.audio_sha256 else None
            return CharacterRecord(
                character_id=row.character_id,
                name=row.name,
                image=_asset_record(image),
                audio=_asset_record(audio) if audio is not None else None,
                source=row.source,
                submitter=row.submitter,
                created_at=row.created_at,
            )

    # -- callback outbox ------------------------------------------------------------------------

    def enqueue_callback(
        self, version_id: str, url: str, payload: dict[str, Any], *, now: float | None = None
    ) -> str:
        """Schedule the job's callback (due at once). One delivery per job: a second call returns the
        first delivery's id and changes nothing."""
        now = time.time() if now is None else now
        try:
            with self._write() as s:
                existing = s.scalars(
                    select(CallbackOutbox).where(CallbackOutbox.version_id == version_id)
                ).first()
                if existing is not None:
                    return existing.delivery_id
                row = CallbackOutbox(
                    delivery_id=uuid.uuid4().hex,
                    version_id=version_id,
                    url=url,
                    payload=payload,
                    attempts=0,
                    next_attempt_at=now,
                    status="pending",
                    created_at=now,
                )
                s.add(row)
                s.flush()
                return row.delivery_id
        except IntegrityError:
            with self._read() as s:
                found = s.scalars(
                    select(CallbackOutbox).where(CallbackOutbox.version_id == version_id)
                ).first()
                if found is None:
                    raise
                return found.delivery_id

    def get_callback(self, delivery_id: str) -> CallbackDelivery | None:
        with self._read() as s:
            row = s.get(CallbackOutbox, delivery_id)
            return _delivery_record(row) if row is not None else None

    def callback_for(self, version_id: str) -> CallbackDelivery | None:
        with self._read() as s:
            row = s.scalars(select(CallbackOutbox).where(CallbackOutbox.version_id == version_id)).first()
            return _delivery_record(row) if row is not None else None

    def due_callbacks(self, now: float | None = None, limit: int = 100) -> list[CallbackDelivery]:
        """Pending deliveries whose next attempt is due, earliest first (also what survives a restart)."""
        now = time.time() if now is None else now
        with self._read() as s:
            rows = s.scalars(
                select(CallbackOutbox)
                .where(CallbackOutbox.status == "pending", CallbackOutbox.next_attempt_at <= now)
                .order_by(CallbackOutbox.next_attempt_at, CallbackOutbox.created_at)
                .limit(limit)
            ).all()
            return [_delivery_record(r) for r in rows]

    def record_attempt(
        self,
        delivery_id: str,
        ok: bool,
        error: str | None = None,
        next_attempt_at: float | None = None,
        *,
        now: float | None = None,
    ) -> CallbackDelivery:
        """Count one delivery attempt. ``ok`` -> delivered. Failed with ``next_attempt_at`` -> stays
        pending until then; failed without it -> gave_up (the caller applies callback_max_attempts)."""
        now = time.time() if now is None else now
        with self._write() as s:
            row = s.get(CallbackOutbox, delivery_id, with_for_update=True)
            if row is None:
                raise KeyError(delivery_id)
            row.attempts += 1
            if ok:
                row.status, row.delivered_at, row.next_attempt_at, row.last_error = (
                    "delivered",
                    now,
                    None,
                    None,
                )
            elif next_attempt_at is not None:
                row.status, row.next_attempt_at, row.last_error = "pending", next_attempt_at, error
            else:
                row.status, row.next_attempt_at, row.last_error = "gave_up", None, error
            return _delivery_record(row)
