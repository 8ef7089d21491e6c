"""The API's service store: versions (jobs), idempotency keys, artifact index, input assets, callback outbox.

SQLAlchemy 2.x ORM over any SQLAlchemy URL: SQLite by default (WAL, busy timeout, ``BEGIN IMMEDIATE`` for
writes so concurrent writers queue up instead of failing), PostgreSQL works with the same code.
Every public method is its own short transaction and returns plain frozen dataclasses (no ORM object
escapes a session). Times are unix seconds (float).

Dagster's run storage stays the source of truth for runs; this store maps the service's ids onto runs
(``version_id`` -> current ``run_id``, following retries) and keeps what Dagster does not: idempotency,
the artifact index the HTTP routes answer from, stored input resources and pending callbacks.

One module a domain, each a part of :class:`Store` over the same engine and sessions (``engine``):
``tables`` (the ORM models, the schema Alembic migrates to), ``changes`` (the change counters cached
views compare, kept in the database), ``jobs`` (accept, submission, status, cancel, delete),
``queue`` (positions, priorities, one job's view), ``history`` (pages of jobs, retention's and
timing's reads), ``artifacts``, ``assets`` (input assets and characters) and ``outbox`` (callback
deliveries).
"""

from __future__ import annotations

from api.store.artifacts import ArtifactRecord, ArtifactStore
from api.store.assets import AssetStore, CharacterRecord, InputAssetRecord
from api.store.engine import StoreUnavailable
from api.store.history import HistoryStore
from api.store.jobs import (
    FINISHED,
    STATUSES,
    AcceptResult,
    IdempotencyConflict,
    JobKind,
    JobRecord,
    JobsStore,
    JobStatus,
    NewJob,
    UnknownVersion,
    payload_hash,
)
from api.store.outbox import CallbackDelivery, DeliveryStatus, OutboxStore, backoff_delay
from api.store.queue import QueueStore
from api.store.tables import Artifact, Base, CallbackOutbox, Character, IdempotencyKey, InputAsset, Job

__all__ = [
    "FINISHED",
    "STATUSES",
    "AcceptResult",
    "Artifact",
    "ArtifactRecord",
    "Base",
    "CallbackDelivery",
    "CallbackOutbox",
    "Character",
    "CharacterRecord",
    "DeliveryStatus",
    "IdempotencyConflict",
    "IdempotencyKey",
    "InputAsset",
    "InputAssetRecord",
    "Job",
    "JobKind",
    "JobRecord",
    "JobStatus",
    "NewJob",
    "Store",
    "StoreUnavailable",
    "UnknownVersion",
    "backoff_delay",
    "payload_hash",
]


class Store(JobsStore, QueueStore, HistoryStore, ArtifactStore, AssetStore, OutboxStore):
    """The service store. Thread-safe: every method opens its own session and transaction."""
