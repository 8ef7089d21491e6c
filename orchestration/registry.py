"""The worker registry, kept in Dagster's own storage (its key-value table), so every host that
shares the storage (SQLite on one host, PostgreSQL across several) sees every worker.

Each worker publishes its record under ``shotloom/worker/<name>``: name, host, URL, pool, device,
boot id, pid, capabilities, and a heartbeat it refreshes every few seconds. The names are listed
under ``shotloom/workers``; a worker re-adds itself at every heartbeat, so two workers registering
at the same moment (a read-modify-write of the list) lose nothing for longer than one beat.

Liveness is judged by the heartbeat and the boot id, not by a local pid: a host that disappears
stops beating, and its runs are resumed or retried elsewhere once its records go stale.

Imported by every process that builds the Dagster instance (through the launcher): no torch.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from contracts.tags import run_owner

INDEX_KEY = "shotloom/workers"
# Below this much free on the disk of a SQLite storage, nobody can write it (heartbeats included):
# a judge is as blind as when the storage is away (see :class:`_Watch`).
NO_ROOM_BYTES = 1 << 20
RECORD_PREFIX = "shotloom/worker/"
CLAIM_PREFIX = "shotloom/claim/"
BOUND_PREFIX = "shotloom/bound/"  # + run id: the worker (name, boot id) the run is bound to


@dataclass(frozen=True)
class WorkerRecord:
    name: str
    url: str
    pid: int
    boot_id: str
    device: str
    pool: str = "device"  # device | media
    host: str = field(default_factory=socket.gethostname)
    heartbeat: float = 0.0  # unix time of the last beat; 0: withdrawn (stopped cleanly)
    capabilities: dict[str, Any] | None = None

    def alive(
        self, stale_after_s: float, now: float | None = None, watched_since: float | None = None
    ) -> bool:
        """Beating recently (and, on this host, its process still there). ``watched_since``: since
        when the judge has seen the registry without a gap (see :class:`WorkerRegistry`); silence
        from before that is not held against the worker."""
        now = time.time() if now is None else now
        if self.heartbeat <= 0:
            return False  # withdrawn
        if now - max(self.heartbeat, watched_since or 0.0) > stale_after_s:
            return False
        return not self.local or _pid_alive(self.pid)

    @property
    def local(self) -> bool:
        return self.host == socket.gethostname()

    @classmethod
    def parse(cls, text: str) -> WorkerRecord | None:
        try:
            data = json.loads(text)
            return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})
        except (ValueError, TypeError):
            return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _sqlite_dir(run_storage: Any) -> str | None:
    """The folder of a SQLite run storage's database (None: another database)."""
    conn_string = getattr(run_storage, "_conn_string", None)
    if not isinstance(conn_string, str) or not conn_string.startswith("sqlite"):
        return None
    from sqlalchemy.engine import make_url

    database = make_url(conn_string).database
    return os.path.dirname(database) if database else None


def _free_bytes(folder: str) -> int:
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return NO_ROOM_BYTES  # not there (yet): not a full disk


class _Watch:
    """Since when this process has seen its storage without a failure. The storage away for a while
    (PostgreSQL restarting), or the disk of a SQLite storage full, stops every worker's beats and
    every judge's reads alike, and the records then read stale though nobody died: a judge counts
    a worker's silence only from the end of its own blindness. Any connection error of any engine
    in the process counts (the daemon's run monitoring fails on its run query before it reaches
    the registry), through SQLAlchemy's ``handle_error`` event, installed once a judge exists."""

    def __init__(self) -> None:
        self.since: float | None = None  # None: blind now (the last attempt failed), or no read yet
        self._installed = False

    def install(self) -> None:
        if self._installed:
            return
        from sqlalchemy import event
        from sqlalchemy.engine import Engine

        from orchestration.storage import lost_connection

        def on_error(context) -> None:  # SQLite's "disk I/O error" of a full disk is one too
            if context.is_disconnect or lost_connection(context.sqlalchemy_exception):
                self.failed()

        event.listen(Engine, "handle_error", on_error)
        self._installed = True

    def read(self) -> None:
        if self.since is None:
            self.since = time.time()

    def failed(self) -> None:
        self.since = None

    def seen_since(self) -> float:
        """When the current unbroken view began (now, while blind: nobody is judged dead blind)."""
        return time.time() if self.since is None else self.since


_watch = _Watch()  # per process: every registry object of a process reads the same storage


class WorkerRegistry:
    """Records of the workers, on a Dagster run storage (``instance.run_storage``). ``stale_after_s``:
    the heartbeat timeout a reader that judges liveness (:meth:`alive`) goes by."""

    def __init__(self, run_storage, stale_after_s: float | None = None):
        self.storage = run_storage
        self.stale_after_s = stale_after_s
        self._sqlite_dir = _sqlite_dir(run_storage)
        if stale_after_s is not None:
            _watch.install()

    def _read(self, keys: set[str]) -> dict[str, str]:
        try:
            values = self.storage.get_cursor_values(keys)
        except Exception:
            _watch.failed()
            raise
        _watch.read()
        return values

    def alive(self, record: WorkerRecord, now: float | None = None) -> bool:
        """``record`` beating within the heartbeat timeout, counted from the end of this process's
        last blindness to the storage (a record just read by :meth:`get` or :meth:`records`)."""
        if self.stale_after_s is None:
            raise ValueError("a registry that judges liveness needs its stale_after_s")
        if self._sqlite_dir is not None and _free_bytes(self._sqlite_dir) < NO_ROOM_BYTES:
            _watch.failed()  # the state disk full: no worker can beat, so silence proves nothing
        return record.alive(self.stale_after_s, now, watched_since=_watch.seen_since())

    def _names(self) -> list[str]:
        raw = self._read({INDEX_KEY}).get(INDEX_KEY)
        try:
            names = json.loads(raw) if raw else []
        except ValueError:
            names = []
        return [n for n in names if isinstance(n, str)]

    def publish(self, record: WorkerRecord) -> WorkerRecord:
        """Write (or refresh) a record, with a heartbeat of now."""
        record = replace(record, heartbeat=time.time())
        self.storage.set_cursor_values({RECORD_PREFIX + record.name: json.dumps(asdict(record))})
        names = self._names()
        if record.name not in names:
            self.storage.set_cursor_values({INDEX_KEY: json.dumps(sorted({*names, record.name}))})
        return record

    def withdraw(self, name: str, boot_id: str) -> None:
        """A worker stopping cleanly: its record stays (for the runs that name it) but reads dead."""
        current = self.get(name)
        if current is not None and current.boot_id == boot_id:
            stopped = replace(current, heartbeat=0.0)
            self.storage.set_cursor_values({RECORD_PREFIX + name: json.dumps(asdict(stopped))})

    def get(self, name: str) -> WorkerRecord | None:
        raw = self._read({RECORD_PREFIX + name}).get(RECORD_PREFIX + name)
        return WorkerRecord.parse(raw) if raw else None

    def records(self, pool: str | None = None) -> list[WorkerRecord]:
        """Every registered worker (of ``pool``), alive or not, by name."""
        keys = {RECORD_PREFIX + n for n in self._names()}
        values = self._read(keys) if keys else {}
        parsed = (WorkerRecord.parse(v) for v in values.values())
        return sorted((r for r in parsed if r is not None and pool in (None, r.pool)), key=lambda r: r.name)

    def quiet_for(self, since: float, now: float | None = None) -> float:
        """How long this process has seen nothing happen since ``since`` (a unix time): silence from
        before the end of its own last blindness to the storage is not counted (see :class:`_Watch`)."""
        return (time.time() if now is None else now) - max(since, _watch.seen_since())

    def bind(self, run_id: str, name: str, boot_id: str) -> None:
        """Bind ``run_id`` to the worker ``name`` of boot ``boot_id`` (a takeover still looking for
        a worker: no name, its ``TAKEOVER_BOOT`` mark). The run's tags say the same for people and
        the UI, but Dagster writes tags read-modify-write: a worker's stage write in flight when it
        was stopped puts its old binding back there when it wakes, over a takeover's or over the
        next worker's. This row is only ever written whole, by whoever binds: it is the binding."""
        self.storage.set_cursor_values({BOUND_PREFIX + run_id: json.dumps([name, boot_id])})

    def owners(self, runs: list[Any]) -> dict[str, tuple[str, str]]:
        """Who each run (a ``DagsterRun``) is bound to, by run id: its binding row, or its tags for
        a run bound where no row is kept (an earlier release; a test's hand-made run)."""
        keys = {BOUND_PREFIX + run.run_id for run in runs}
        rows = self._read(keys) if keys else {}
        out: dict[str, tuple[str, str]] = {}
        for run in runs:
            raw = rows.get(BOUND_PREFIX + run.run_id)
            name, boot_id = json.loads(raw) if raw else run_owner(run.tags)
            out[run.run_id] = (name, boot_id)
        return out

    def owner(self, run: Any) -> tuple[str, str]:
        """Who ``run`` is bound to: (worker name, boot id), "" where unbound."""
        return self.owners([run])[run.run_id]

    def claim(self, run_id: str, owner: str) -> bool:
        """Exclusive across hosts: True for exactly one worker asking to take ``run_id`` (an INSERT
        into the key-value table, whose key is unique; ``set_cursor_values`` would overwrite)."""
        from dagster._core.storage.runs.schema import KeyValueStoreTable
        from sqlalchemy.exc import IntegrityError

        try:
            with self.storage.connect() as conn:
                conn.execute(KeyValueStoreTable.insert().values(key=CLAIM_PREFIX + run_id, value=owner))
        except IntegrityError:
            return False
        return True
