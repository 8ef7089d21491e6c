"""The service store's tables (SQLAlchemy ORM models). ``Base.metadata`` is the schema Alembic's
revisions (api/migrations) must produce: tests/test_api_migrations.py compares the two."""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, BigInteger, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


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


class Change(Base):
    """A change counter (api.store.changes): one row a job version, bumped by every write to its row
    or its artifacts, and one for the queues (subject ':queue'), bumped when their membership or
    order changes. Cached views compare them, so any process's write invalidates every cache."""

    __tablename__ = "changes"

    subject: Mapped[str] = mapped_column(String(32), primary_key=True)  # a version id, ':queue' or ':seq'
    counter: Mapped[int] = mapped_column(BigInteger)  # 0: the version was deleted (a tombstone)
    # The sequence number of the write that last moved it (None: before the sequence existed).
    seq: Mapped[int | None] = mapped_column(BigInteger, nullable=True)

    __table_args__ = (Index("ix_changes_seq", "seq"),)
