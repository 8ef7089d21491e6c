"""Dagster's storage on SQLite: runs and schedules laid out as Dagster's ``storage: sqlite`` does,
events in ONE consolidated database (WAL) instead of one SQLite file per run.

Why not the stock per-run layout: every new run gets its own event database, which each process
that touches the run creates or opens anew (schema, Alembic stamp, a fresh engine per event).
Measured on the 2-core machine: a GraphQL ``launchRun`` took 139 ms with per-run files and 41 ms
with the consolidated database, and every stage event a worker writes pays the same toll.

A state directory made by an earlier release holds the per-run files: :func:`consolidate_events`
copies their events (and through them the asset index) into the consolidated database once, then
moves the per-run directory aside, so nothing an operator could see before is lost.
"""

from __future__ import annotations

import logging
import math
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

log = logging.getLogger("shotloom.storage")
T = TypeVar("T")
# How long a call waits for Dagster's storage where the instance YAML names no patience (the server
# YAML's runtime.storage_outage_seconds, written into it, has the same default).
DEFAULT_PATIENCE_S = 300.0

_PER_RUN_DIR = "runs"  # Dagster's per-run event files, under history/
_IMPORTED_DIR = "runs.consolidated"  # where they go once imported (kept: a manual rollback needs them)


def sqlite_storage_config(storage_dir: Path) -> dict[str, Any]:
    """The ``dagster.yaml`` keys for SQLite storage under ``storage_dir``."""
    history, schedules = str(storage_dir / "history"), str(storage_dir / "schedules")

    def section(module: str, cls: str, base_dir: str) -> dict[str, Any]:
        return {"module": f"dagster._core.storage.{module}", "class": cls, "config": {"base_dir": base_dir}}

    return {
        "run_storage": section("runs", "SqliteRunStorage", history),
        "event_log_storage": section("event_log", "ConsolidatedSqliteEventLogStorage", history),
        "schedule_storage": section("schedules", "SqliteScheduleStorage", schedules),
    }


def consolidate_events(storage_dir: Path) -> int:
    """Copy the events of per-run event files (an earlier release's layout) into the consolidated
    database, in each run's order; returns how many runs were imported. Idempotent: a directory
    already imported is not there any more."""
    per_run = storage_dir / "history" / _PER_RUN_DIR
    shards = sorted(p for p in per_run.glob("*.db") if p.stem != "index") if per_run.is_dir() else []
    if not shards:
        return 0
    from dagster._core.storage.event_log import ConsolidatedSqliteEventLogStorage, SqliteEventLogStorage

    old = SqliteEventLogStorage(str(per_run))
    new = ConsolidatedSqliteEventLogStorage(str(storage_dir / "history"))
    done = 0
    for shard in shards:
        run_id = "" if shard.name == ".db" else shard.stem  # ".db": events of no run
        new.delete_events(run_id)  # a part imported by an attempt that was cut short
        for entry in old.get_logs_for_run(run_id):
            new.store_event(entry)
        done += bool(run_id)
    old.dispose()
    new.dispose()
    per_run.rename(per_run.with_name(_IMPORTED_DIR))
    log.info("moved the events of %d runs into the consolidated event log", done)
    return done


@contextmanager
def postgres_lock(url: str, name: str) -> Iterator[None]:
    """A session-level advisory lock on the PostgreSQL at ``url``, held for the block: hosts that
    start at once create Dagster's schema one after the other."""
    import psycopg
    from sqlalchemy.engine import make_url

    conninfo = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    key = zlib.crc32(f"shotloom/{name}".encode())
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (key,))
        try:
            yield
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (key,))


def dagster_postgres_url(url: str) -> str:
    """The URL as Dagster's PostgreSQL storage needs it: SQLAlchemy 2.1 reads a bare
    ``postgresql://`` as psycopg 3, whose server-side parameters Dagster's ``NOTIFY`` cannot take;
    Dagster is written for psycopg2. Other drivers named explicitly are left as they are."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres", "postgresql+psycopg"):
        parsed = parsed.set(drivername="postgresql+psycopg2")
    return parsed.render_as_string(hide_password=False)


def lost_connection(error: BaseException) -> bool:
    """The connection to the database failed or was cut (the server down, restarting, out of
    reach), as opposed to a statement the server refused (a constraint, bad SQL)."""
    import sqlalchemy

    return isinstance(error, sqlalchemy.exc.DBAPIError) and (
        error.connection_invalidated
        or isinstance(error, sqlalchemy.exc.OperationalError | sqlalchemy.exc.InterfaceError)
    )


def _patiently(
    attempt: Callable[[], T], patience_s: float, retryable: Callable[[BaseException], bool], what: str
) -> T:
    """``attempt()``, tried again with a growing, jittered pause while it raises what
    ``retryable`` accepts, for up to ``patience_s``; then (or for anything else) its error."""
    import random
    import time

    deadline, wait, warned = time.perf_counter() + patience_s, 0.2, False
    while True:
        try:
            return attempt()
        except Exception as exc:
            if not retryable(exc):
                raise
            if time.perf_counter() >= deadline:
                _gave_up[0] = time.perf_counter()
                raise
            if not warned:
                log.warning("%s, retrying for up to %g s: %s", what, patience_s, str(exc).splitlines()[0])
                warned = True
        time.sleep(wait * random.uniform(0.5, 1.0))
        wait = min(wait * 2, 2.0)


def patiently(attempt: Callable[[], T], patience_s: float, what: str) -> T:
    """``attempt()``, tried again while Dagster's storage cannot take it for a reason that passes
    (:func:`storage_outage`), for up to ``patience_s``. For the control plane's own calls whose
    failure Dagster turns into a failed run (a launch, a resume, a submission that raised marks
    the run failed, with no word of why): a database restarting is waited out instead."""
    return _patiently(attempt, patience_s, storage_outage, what)


_gave_up = [-math.inf]  # when a call of this process last gave up waiting (time.perf_counter())


def gave_up_since(started: float) -> bool:
    """Whether a storage call of this process gave up waiting for the storage since ``started``
    (``time.perf_counter()``)."""
    return _gave_up[0] > started


def wait_out_postgres_outages(patience_s: float) -> None:
    """Make this process's Dagster PostgreSQL storages wait for the server up to ``patience_s``.

    Every connection they open (NullPool: one per operation) goes through
    ``dagster_postgres.utils.retry_pg_connection_fn``, which gives up after 5 tries over ~6 s. A
    worker running a run would then fail it at its next event when PostgreSQL restarts or fails
    over, and could not even record that. With this, the run's next write (a stage, a step's end,
    its outcome) waits for the server instead, and the run goes on where it was. Only the module's
    name is replaced: the storages look it up at each connection (dagster is pinned exactly)."""
    import sqlalchemy
    from dagster_postgres import utils

    unreachable = (sqlalchemy.exc.DatabaseError, sqlalchemy.exc.OperationalError, sqlalchemy.exc.TimeoutError)

    def patient(fn, retry_limit: int = 5, retry_wait: float = 0.2):  # Dagster's signature
        try:
            return _patiently(
                fn, patience_s, lambda exc: isinstance(exc, unreachable), "Dagster's PostgreSQL unreachable"
            )
        except unreachable as exc:
            raise utils.DagsterPostgresException(
                f"PostgreSQL unreachable for more than {patience_s:g} s"
            ) from exc

    utils.retry_pg_connection_fn = patient


def out_of_room(error: BaseException) -> bool:
    """SQLite could not write for want of room: the disk under the state directory is full
    ("database or disk is full", or an I/O error writing the WAL or its index, which is how a
    full disk shows up there; readers write the index too)."""
    import sqlalchemy

    cause = error.orig if isinstance(error, sqlalchemy.exc.DBAPIError) else error
    name = getattr(cause, "sqlite_errorname", "") or ""
    return name == "SQLITE_FULL" or name.startswith("SQLITE_IOERR")


def storage_outage(error: BaseException) -> bool:
    """Dagster's storage cannot take a call now, for a reason that passes: unreachable (or cut),
    or its disk full."""
    from dagster_postgres.utils import DagsterPostgresException

    return isinstance(error, DagsterPostgresException) or lost_connection(error) or out_of_room(error)


# The storage writes a run makes, each retried whole when it failed for a reason that passes (the
# connection cut mid-statement, the disk full): the writes, and the asset partitions ops register
# (adding is idempotent). Every read of these storages is retried too (:data:`_READS`: safe to
# repeat), so a read nobody listed cannot fail a step. The worker registry's own calls (key-value
# cursors) are not: its heartbeat and fence keep their own pace and judge a failure themselves.
_RUN_WRITES = {
    "event_log_storage": ("store_event", "add_dynamic_partitions"),
    "run_storage": ("add_run_tags", "handle_run_event"),
}
_READS = ("get_", "has_", "fetch_")
_NOT_RETRIED = ("get_cursor_values",)


def _run_calls(storage: Any, storage_name: str) -> list[str]:
    reads = [
        name
        for name in dir(type(storage))
        if name.startswith(_READS) and name not in _NOT_RETRIED and callable(getattr(storage, name, None))
    ]
    return [*_RUN_WRITES[storage_name], *reads]


def retry_run_writes(instance: Any, patience_s: float, gate: Callable[[], None] | None = None) -> None:
    """Retry this process's run writes (and reads) to Dagster's storage while they fail for a
    reason that passes, for up to ``patience_s``: on PostgreSQL, a connection dropped in the middle
    of a call (a restart: :func:`wait_out_postgres_outages` waits at the next connect, but a
    statement already sent fails with "server closed the connection unexpectedly"); on SQLite, a
    full disk under the state directory (:func:`out_of_room`). Either would otherwise fail the step
    it belongs to, and often the run's end could not be written either, leaving it STARTED. The
    call is tried again (on a new connection) until it goes through. A write the database refused
    for what it says (a constraint, bad SQL) fails as it would have. The rare write that committed
    just before the connection dropped is recorded twice (an event seen twice; nothing is executed
    again). ``gate``: called before each try of a write (the worker's fence, which may exit)."""

    def patient(call, retryable, what, gated):
        def attempt(*args, **kwargs):
            if gated:
                gate()
            return call(*args, **kwargs)

        def retried(*args, **kwargs):
            return _patiently(lambda: attempt(*args, **kwargs), patience_s, retryable, what)

        return retried

    for storage_name in _RUN_WRITES:
        storage = getattr(instance, storage_name)
        if type(storage).__module__.startswith("dagster_postgres"):
            retryable, what = lost_connection, "a run write lost its connection"
        else:  # SQLite: a lock held past the busy timeout is not waited out here, a full disk is
            retryable, what = out_of_room, "no room to write Dagster's storage"
        for method in _run_calls(storage, storage_name):
            gated = gate is not None and method in _RUN_WRITES[storage_name]
            setattr(storage, method, patient(getattr(storage, method), retryable, what, gated))
