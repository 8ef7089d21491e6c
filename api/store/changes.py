"""Change counters, kept in the database: how a cached view knows it is still current.

The pollers' views (:mod:`api.core.views`, the event streams of :mod:`api.core.events`) are cached
per job. Every write transaction bumps, in the same transaction, the counter of each job version
whose row or artifacts it changed (table ``changes``, one row a version) and, when it changed which
jobs are queued or their order, the queue's counter (subject :data:`QUEUE`). Any process that writes
the store (a second API process, a Dagster schedule, an operator's script) so invalidates every
process's cached views; a reader compares the two counters it reads in one indexed query with the
ones its cached view was made under. A version's row is made with its job (counter 1) and goes with
it; version ids are uuid4 hex, never reused, so one id's counter never repeats.
"""

from __future__ import annotations

import threading
from typing import Any

from sqlalchemy import delete, insert, inspect, update
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session
from sqlalchemy.pool import SingletonThreadPool

from api.store.tables import Artifact, Change, Job

QUEUE = ":queue"  # the queues' subject (no version id has a colon)

_CHANGES = Change.__table__
# What a write session noted in its info (note_changes) for count_changes.
_CREATED, _TOUCHED = "shotloom_created_versions", "shotloom_touched_versions"
_DELETED, _QUEUE_CHANGED = "shotloom_deleted_versions", "shotloom_queue_changed"


# (the version's counter, the queues'); the version's is None for no such version (unknown, deleted)
Changes = tuple[int | None, int]


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


def count_changes(session: Session) -> None:
    """Bump the counters of what this write changed (see :func:`note_changes`), in its transaction,
    after its last flush. The queue's row last: writers take the row locks in one order."""
    info = session.info
    created, deleted = info.pop(_CREATED, set()), info.pop(_DELETED, set())
    touched = info.pop(_TOUCHED, set()) - created - deleted
    if deleted:
        session.execute(delete(_CHANGES).where(_CHANGES.c.subject.in_(sorted(deleted))))
    if created:
        session.execute(insert(_CHANGES), [{"subject": v, "counter": 1} for v in sorted(created)])
    if touched:
        bump = _CHANGES.c.counter + 1
        session.execute(update(_CHANGES).where(_CHANGES.c.subject.in_(sorted(touched))).values(counter=bump))
    if info.pop(_QUEUE_CHANGED, False):
        session.execute(
            update(_CHANGES).where(_CHANGES.c.subject == QUEUE).values(counter=_CHANGES.c.counter + 1)
        )


class ChangeReader:
    """Reads a version's and the queues' counters on a DBAPI connection of its own, outside the pool
    and outside any transaction (autocommit: each read sees the latest commit). The pollers ask on
    every request: one indexed query costs about 4 microseconds this way on SQLite (the cached
    view's whole answer about 50), an ORM session about twenty times as much. Thread-safe (one lock:
    a read is short)."""

    def __init__(self, engine: Engine):
        self._engine = engine
        mark = "?" if engine.dialect.paramstyle == "qmark" else "%s"
        self._sql = (
            f"SELECT (SELECT counter FROM changes WHERE subject = {mark}), "
            f"(SELECT counter FROM changes WHERE subject = {mark})"
        )
        # An in-memory SQLite database lives in its thread's one pooled connection: read there.
        self._pooled = isinstance(engine.pool, SingletonThreadPool)
        self._lock = threading.Lock()
        self._own: Any = None  # the pool's wrapper of our connection (closes it)
        self._dbapi: Any = None  # the driver's connection: sqlite3's or psycopg's (both .execute)

    def read(self, version_id: str) -> Changes:
        with self._lock:
            if self._pooled:
                conn = self._engine.raw_connection()
                try:
                    return conn.dbapi_connection.execute(self._sql, (version_id, QUEUE)).fetchone()
                finally:
                    conn.close()
            try:
                return (self._dbapi or self._connect()).execute(self._sql, (version_id, QUEUE)).fetchone()
            except Exception:  # a connection the server dropped (PostgreSQL restarted): once anew
                self._close()
                return self._connect().execute(self._sql, (version_id, QUEUE)).fetchone()

    def commit_mark(self) -> int | None:
        """A number that changes whenever any other connection, of any process, commits (SQLite's
        ``PRAGMA data_version`` on this reader's connection); None where there is no such number
        (PostgreSQL; an in-memory SQLite database, whose writes share the reader's connection)."""
        if self._pooled or self._engine.dialect.name != "sqlite":
            return None
        with self._lock:
            try:
                return (self._dbapi or self._connect()).execute("PRAGMA data_version").fetchone()[0]
            except Exception:  # as in read(): once anew
                self._close()
                return self._connect().execute("PRAGMA data_version").fetchone()[0]

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
