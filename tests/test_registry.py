"""Judging a worker dead by its heartbeat, on Dagster's real (in-memory SQLite) run storage: a gap in
the judge's own view of the registry (the storage away: PostgreSQL restarting) is not held against
the workers, whose beats stopped for the same reason; a worker that stays silent after it is still
found dead one heartbeat timeout later."""

from __future__ import annotations

import socket
import time

import pytest
from dagster import DagsterInstance

from orchestration import registry as registry_module
from orchestration.registry import WorkerRecord, WorkerRegistry

STALE_S = 5.0


class FlakyStorage:
    """The run storage, with an outage switch."""

    def __init__(self, storage):
        self.storage, self.down = storage, False

    def get_cursor_values(self, keys):
        if self.down:
            raise ConnectionError("server closed the connection unexpectedly")
        return self.storage.get_cursor_values(keys)

    def set_cursor_values(self, values):
        if self.down:
            raise ConnectionError("server closed the connection unexpectedly")
        return self.storage.set_cursor_values(values)


@pytest.fixture
def storage(monkeypatch):
    monkeypatch.setattr(registry_module, "_watch", registry_module._Watch())  # this test's process view
    with DagsterInstance.ephemeral() as instance:
        yield FlakyStorage(instance.run_storage)


def record(name: str = "w-0") -> WorkerRecord:
    return WorkerRecord(
        name=name, url="http://127.0.0.1:1", pid=1, boot_id="b", device="cpu:0", host="elsewhere"
    )


def test_an_outage_of_the_storage_is_not_a_worker_dying(storage):
    judge = WorkerRegistry(storage, STALE_S)
    WorkerRegistry(storage).publish(record())
    assert judge.alive(judge.get("w-0"))

    storage.down = True  # the database goes away: beats and reads fail alike
    with pytest.raises(ConnectionError):
        judge.get("w-0")
    storage.down = False
    seen = judge.get("w-0")
    later = time.time() + 30  # read back long after its last beat, as after a 30 s outage
    assert not seen.alive(STALE_S, later)  # by its heartbeat alone it would be dead...
    assert judge.alive(seen, time.time() + STALE_S / 2)  # ...but the judge was blind too
    # A worker that stays silent once the storage is back is found dead a timeout later.
    assert not judge.alive(seen, registry_module._watch.since + STALE_S + 1)


def test_a_run_left_unbound_through_an_outage_is_quiet_only_since_the_storage_came_back(storage):
    """An idle worker takes a STARTING run that nobody bound within the handover grace (its daemon
    died mid-launch). A launcher that waited a storage outage out binds it as soon as the storage
    is back: the outage must not count towards the grace, or both take the run."""
    judge = WorkerRegistry(storage, STALE_S)
    judge.get("w-0")
    launched = time.time() - 30  # marked STARTING just before a 30 s outage
    registry_module._watch.since = launched - 1  # watching since before the launch
    assert judge.quiet_for(launched) >= 30  # seen all along: that long
    storage.down = True
    with pytest.raises(ConnectionError):
        judge.get("w-0")
    assert judge.quiet_for(launched) < 1  # blind: nothing is orphaned meanwhile
    storage.down = False
    judge.get("w-0")
    assert judge.quiet_for(launched) < 1  # back: counted from now
    assert judge.quiet_for(launched, time.time() + 20) > 19


def test_a_connection_error_anywhere_in_the_process_counts_as_blindness(storage):
    """The daemon's run monitoring fails on its run query, not on the registry: that counts too."""
    import sqlalchemy
    from sqlalchemy.pool import NullPool

    judge = WorkerRegistry(storage, STALE_S)
    WorkerRegistry(storage).publish(record())
    seen = judge.get("w-0")
    since = registry_module._watch.since
    judge.get("w-0")
    assert registry_module._watch.since == since  # an unbroken view: death is judged
    assert not judge.alive(seen, since + STALE_S + 1)

    with socket.socket() as s:  # a port nothing listens on: the server is away
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    away = sqlalchemy.create_engine(f"postgresql+psycopg2://u@127.0.0.1:{port}/d", poolclass=NullPool)
    with pytest.raises(sqlalchemy.exc.OperationalError):
        away.connect()
    assert registry_module._watch.since is None  # blind: nobody is judged dead meanwhile
    assert judge.alive(seen, time.time())
    judge.get("w-0")
    assert registry_module._watch.since > since


def test_a_full_disk_under_a_sqlite_storage_is_not_a_worker_dying(tmp_path, monkeypatch):
    """Nobody can beat while the disk of a SQLite storage is full, whether or not the judge's reads
    still go through: the judge is blind until there is room again."""
    from dataclasses import replace

    from dagster._core.storage.runs import SqliteRunStorage

    from conftest import fill, small_disk_at

    monkeypatch.setattr(registry_module, "_watch", registry_module._Watch())
    with small_disk_at(tmp_path / "disk", "4m") as disk:
        storage = SqliteRunStorage.from_local(str(disk))
        judge = WorkerRegistry(storage, STALE_S)
        WorkerRegistry(storage).publish(record())
        silent = replace(judge.get("w-0"), heartbeat=time.time() - 30)
        registry_module._watch.since = time.time() - 60  # the judge has been watching a while
        assert not judge.alive(silent)  # room on the disk: 30 s of silence is death

        filler = fill(disk)
        assert judge.alive(silent)  # no room: nobody could have beaten
        filler.unlink()
        judge.get("w-0")
        assert judge.alive(silent)  # silence counts again from now...
        assert not judge.alive(silent, time.time() + STALE_S + 1)  # ...and a timeout later it is death
        storage.dispose()
