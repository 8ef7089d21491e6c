"""Change counters, kept in the database: how a cached view knows it is still current.

The pollers' views (:mod:`api.core.views`, the event streams of :mod:`api.core.events`) are cached
per job. Every write transaction bumps, in the same transaction, the counter of each job version
whose row or artifacts it changed (table ``changes``, one row a version) and, when it changed which
jobs are queued or their order, the queue's counter (subject :data:`QUEUE`). Any process that writes
the store (a second API process, a Dagster schedule, an operator's script) so invalidates every
process's cached views. A version's row is made with its job (counter 1); when the job is deleted
it stays as a tombstone (counter 0); version ids are uuid4 hex, never reused.

Each such write first takes the next number of a sequence (subject :data:`SEQ`, its counter the
latest number) and stamps every row it moves with it. The row lock on the sequence is held to the
commit, so the numbers become visible in order: a reader that saw every change up to number n
learns all later ones from one indexed query (``seq > n``), however many jobs it caches; the
pollers so read the database once per commit, not once per request (:class:`ChangeReader.since`).
A reader meeting a job for the first time reads its counter alone (:class:`ChangeReader.read`).
"""

from __future__ import annotations

import threading
from typing import Any, NamedTuple

from sqlalchemy import bindparam, insert, inspect, update
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session
from sqlalchemy.pool import SingletonThreadPool

from api.store.tables import Artifact, Change, Job

QUEUE = ":queue"  # the queues' subject (no version id has a colon)
SEQ = ":seq"  # the sequence's subject: its counter is the number the last write took

_CHANGES = Change.__table__
# What a write session noted in its info (note_changes) for count_changes.
_CREATED, _TOUCHED = "shotloom_created_versions", "shotloom_touched_versions"
_DELETED, _QUEUE_CHANGED = "shotloom_deleted_versions", "shotloom_queue_changed"


# (the version's counter, the queues'); the version's is None for no such version (unknown, deleted)
Changes = tuple[int | None, int]


class ChangesSince(NamedTuple):
    """What moved after a sequence number: ``seq`` covers it all (the next look starts there). A
    tuple: the pollers make one every turn of the event loop, and a frozen dataclass costs more."""

    seq: int
    versions: dict[str, int | None]  # version id -> its counter now (None: deleted)
    queue: int | None  # the queues' counter, if it moved


def note_changes(session: Session, _flush_context: Any) -> None:
    """after_flush: which job versions this write created, touched or deleted, and whether a
    queue's membership changed (its positions). The session's new/dirty/deleted sets and attribute
    history still show the flushed changes here."""
    info = session.info
    touched: set[str] = info.setdefault(_TOUCHED, set())
    for obj in (*session.new, *session.dirty, *session.deleted):
        if isinstance(obj, Job):
            touched.add(obj.version_id)
            if obj in session.new or obj in session.deleted:
                info.setdefault(_CREATED if obj in session.new else _DELETED, set()).add(obj.version_id)
                info[_QUEUE_CHANGED] = True
            else:
                history = inspect(obj).attrs.status.history
                if "queued" in (*history.added, *history.deleted):
                    info[_QUEUE_CHANGED] = True
                if inspect(obj).attrs.priority.history.has_changes():  # the queue's order moved
                    info[_QUEUE_CHANGED] = True
        elif isinstance(obj, Artifact):
            touched.add(obj.version_id)


_SUBJECT, _COUNTER = _CHANGES.c.subject, _CHANGES.c.counter
# Built once: every write transaction runs some of them (Core on the session's connection, not the
# ORM's execute path, which cost most of an accept's extra time).
_NEXT_SEQ = update(_CHANGES).where(_SUBJECT == SEQ).values(counter=_COUNTER + 1).returning(_COUNTER)
_TOMBSTONE = (
    update(_CHANGES)
    .where(_SUBJECT.in_(bindparam("subjects", expanding=True)))
    .values(counter=0, seq=bindparam("at"))
)
_CREATE = insert(_CHANGES)
_BUMP = (
    update(_CHANGES)
    .where(_SUBJECT.in_(bindparam("subjects", expanding=True)))
    .values(counter=_COUNTER + 1, seq=bindparam("at"))
)


def count_changes(session: Session) -> None:
    """Bump the counters of what this write changed (see :func:`note_changes`), in its transaction,
    after its last flush, stamped with the sequence's next number. The sequence's row first, the
    queue's last: writers take the row locks in one order."""
    info = session.info
    created, deleted = info.pop(_CREATED, set()), info.pop(_DELETED, set())
    touched = info.pop(_TOUCHED, set()) - created - deleted
    queue_changed = info.pop(_QUEUE_CHANGED, False)
    if not (created or deleted or touched or queue_changed):
        return
    conn = session.connection()
    seq = conn.execute(_NEXT_SEQ).scalar_one()
    if deleted:  # a tombstone, so the deletion is in the sequence too
        conn.execute(_TOMBSTONE, {"subjects": sorted(deleted), "at": seq})
    if created:
        conn.execute(_CREATE, [{"subject": v, "counter": 1, "seq": seq} for v in sorted(created)])
    if touched:
        conn.execute(_BUMP, {"subjects": sorted(touched), "at": seq})
    if queue_changed:
        conn.execute(_BUMP, {"subjects": [QUEUE], "at": seq})


class ChangeReader:
    """Reads the counters on a DBAPI connection of its own, outside the pool and outside any
    transaction (autocommit: each read sees the latest commit): one indexed query costs a few
    microseconds this way on SQLite, an ORM session about twenty times as much. Thread-safe (one
    lock: a read is short)."""

    def __init__(self, engine: Engine):
        self._engine = engine
        mark = "?" if engine.dialect.paramstyle == "qmark" else "%s"
        self._sql = (
            f"SELECT (SELECT counter FROM changes WHERE subject = {mark}), "
            f"(SELECT counter FROM changes WHERE subject = {mark})"
        )
        self._since_sql = f"SELECT subject, counter, seq FROM changes WHERE seq > {mark} ORDER BY seq"
        self._seq_sql = f"SELECT counter FROM changes WHERE subject = {mark}"
        # An in-memory SQLite database lives in its thread's one pooled connection: read there.
        self._pooled = isinstance(engine.pool, SingletonThreadPool)
        self._lock = threading.Lock()
        self._own: Any = None  # the pool's wrapper of our connection (closes it)
        self._dbapi: Any = None  # the driver's connection: sqlite3's or psycopg's (both .execute)

    def read(self, version_id: str) -> Changes:
        version, queue = self._query(self._sql, (version_id, QUEUE))[0]
        return version or None, queue  # 0: deleted

    def since(self, seq: int | None) -> ChangesSince:
        """What moved after sequence number ``seq``, and the number that covers it; ``None``: the
        latest number and nothing (a reader's first look: it has cached nothing yet)."""
        if seq is None:
            return ChangesSince(self._query(self._seq_sql, (SEQ,))[0][0], {}, None)
        rows = self._query(self._since_sql, (seq,))
        if not rows:  # the usual answer: nothing moved
            return ChangesSince(seq, {}, None)
        versions = {subject: counter or None for subject, counter, _ in rows if subject != QUEUE}
        queue = next((counter for subject, counter, _ in rows if subject == QUEUE), None)
        return ChangesSince(rows[-1][2], versions, queue)

    def _query(self, sql: str, params: tuple) -> list[tuple]:
        with self._lock:
            if self._pooled:
                conn = self._engine.raw_connection()
                try:
                    return conn.dbapi_connection.execute(sql, params).fetchall()
                finally:
                    conn.close()
            try:
                return (self._dbapi or self._connect()).execute(sql, params).fetchall()
            except Exception:  # a connection the server dropped (PostgreSQL restarted): once anew
                self._close()
                return self._connect().execute(sql, params).fetchall()

    def _connect(self) -> Any:
        own = self._engine.raw_connection()  # the engine's connect hooks ran (SQLite pragmas)
        own.detach()  # its own from now on: closed with the reader, never back in the pool
        if self._engine.dialect.name == "postgresql":
            own.dbapi_connection.autocommit = True  # SQLite's: isolation_level None already
        self._own, self._dbapi = own, own.dbapi_connection
        return self._dbapi

    def _close(self) -> None:
        own, self._own, self._dbapi = self._own, None, None
        if own is not None:
            try:
                own.close()
            except Exception:  # already broken: nothing to release
                pass

    def close(self) -> None:
        with self._lock:
            self._close()
