"""The store's engine: one SQLAlchemy engine per URL (SQLite pragmas and locking, or PostgreSQL),
the schema brought to Alembic's head at start, the short read and write transactions every
method runs in (a write counts what it changed: :mod:`api.store.changes`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event, exc, text
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.orm import Session, sessionmaker

from api.store.changes import ChangeReader, Changes, ChangesSince, count_changes, note_changes
from api.store.events import StoreEvents

_READ_OPTION = "shotloom_read_only"
log = logging.getLogger("shotloom.api")
WARN_EVERY_S = 10.0  # an unavailable database is logged at most this often
_last_warned = -WARN_EVERY_S


class StoreUnavailable(Exception):
    """The database cannot answer now: PostgreSQL stopped, restarting or cut off by the network,
    SQLite's disk full or its lock held past the busy timeout. Nothing was changed by the call
    that raised it (its transaction rolled back); trying again later is right."""


def _unreachable(error: BaseException) -> bool:
    """Whether ``error`` says the database is away (or full) rather than that a statement is wrong."""
    if isinstance(error, exc.DBAPIError):
        return error.connection_invalidated or isinstance(error, exc.OperationalError | exc.InterfaceError)
    # Raw driver errors, from the change reader's own connection (sqlite3's and psycopg's names).
    return type(error).__name__ in ("OperationalError", "InterfaceError") and type(error).__module__ in (
        "sqlite3",
        "psycopg",
        "psycopg.errors",
    )


class _Reachable:
    """``with reachable():`` raise :class:`StoreUnavailable` for a database that is away, instead of
    the driver's error. A class, not a generator context manager: every store call enters it, the
    pollers' once-a-turn change look among them, and a generator's frame costs several times this."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, _type: type[BaseException] | None, error: BaseException | None, _tb: Any) -> bool:
        if not isinstance(error, Exception) or isinstance(error, StoreUnavailable) or not _unreachable(error):
            return False  # no error, already ours, or a statement that is wrong: as it is
        global _last_warned
        if time.monotonic() - _last_warned > WARN_EVERY_S:  # once a while, not once a request
            _last_warned = time.monotonic()
            log.warning("store unavailable: %s", (str(error).splitlines() or [type(error).__name__])[0])
        raise StoreUnavailable("the service's database is unavailable") from error


_REACHABLE = _Reachable()


def reachable() -> _Reachable:
    return _REACHABLE


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


def _search_path_schema(url: str) -> str | None:
    """The first schema a PostgreSQL URL puts on its search_path (``options=-c search_path=x``)."""
    import re

    options = make_url(url).query.get("options")
    options = options if isinstance(options, str) else ""
    found = re.search(r"search_path\s*=\s*([A-Za-z_][A-Za-z0-9_]*)", options)
    return found.group(1) if found else None


class StoreEngine:
    """The engine and sessions every part of :class:`api.store.Store` runs its transactions on."""

    def __init__(self, url: str, *, busy_timeout_s: float = 30.0, create: bool = True):
        self.url = url
        if make_url(url).get_backend_name() == "sqlite":
            self.engine = _sqlite_engine(url, busy_timeout_s)
        else:
            self.engine = create_engine(url, pool_pre_ping=True)
        self._read_engine = self.engine.execution_options(**{_READ_OPTION: True})
        self._write_sessions = sessionmaker(self.engine, expire_on_commit=False)
        # What each write changed is counted in the database, in the write's own transaction, so
        # readers that cache (api.core.views.JobViews) see any process's writes (api.store.changes).
        event.listen(self._write_sessions, "after_flush", note_changes)
        self._changes = ChangeReader(self.engine)
        self.events = StoreEvents()  # told after a write commits (api.store.events)
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
        self._changes.close()
        self.engine.dispose()

    @contextmanager
    def _write(self) -> Iterator[Session]:
        with reachable(), self._write_sessions() as session, session.begin():
            yield session
            session.flush()
            count_changes(session)  # committed with the write, or rolled back with it

    def changes(self, version_id: str) -> Changes:
        """The version's change counter (None: no such version) and the queues' (read them before
        what they cover: a write in between then costs one more read, never a stale answer)."""
        with reachable():
            return self._changes.read(version_id)

    def changes_since(self, seq: int | None) -> ChangesSince:
        """The counters that moved after sequence number ``seq`` (see ``ChangeReader.since``)."""
        with reachable():
            return self._changes.since(seq)

    @contextmanager
    def _read(self) -> Iterator[Session]:
        with reachable(), Session(self._read_engine, expire_on_commit=False) as session, session.begin():
            yield session
