"""A run's outcome survives the storage going away around it: a run write whose connection was cut
is tried again (a refused one is not), and a run whose ending event was stored but whose status
write was lost (PostgreSQL stopping between Dagster's two writes) gets its status back from the
worker that ran it; a run resumed after its worker died past its last step is not made again. On
Dagster's real (SQLite) storage."""

from __future__ import annotations

import logging
import math
import time
from types import SimpleNamespace

import pytest
import sqlalchemy
from dagster import (
    DagsterEventType,
    DagsterInstance,
    DagsterRunStatus,
    in_process_executor,
    job,
    op,
    reconstructable,
)
from dagster._core.events import DagsterEvent
from dagster._core.events.log import EventLogEntry
from dagster._core.execution.plan.objects import StepSuccessData

from orchestration import storage
from orchestration.worker import execute
from orchestration.worker.execute import _restore_status, _resume_from_last_finished_step


@op
def noop() -> None:
    pass


@job
def one() -> None:
    noop()


@op(config_schema={"marker": str})
def make(context) -> None:
    with open(context.op_config["marker"], "a") as f:
        f.write("made\n")


@job(executor_def=in_process_executor)
def last_step_only() -> None:
    make()


def ended(run_id: str, kind: DagsterEventType, step_key: str | None = None) -> EventLogEntry:
    event = DagsterEvent(
        event_type_value=kind.value,
        job_name="one",
        message="ended",
        step_key=step_key,
        event_specific_data=StepSuccessData(duration_ms=1.0) if step_key else None,
    )
    return EventLogEntry(
        error_info=None,
        level=logging.DEBUG,
        user_message="",
        run_id=run_id,
        timestamp=time.time(),
        step_key=step_key,
        dagster_event=event,
    )


@pytest.mark.parametrize(
    ("kind", "status"),
    [
        (DagsterEventType.RUN_SUCCESS, DagsterRunStatus.SUCCESS),
        (DagsterEventType.RUN_FAILURE, DagsterRunStatus.FAILURE),
    ],
)
def test_a_run_whose_status_write_was_lost_gets_it_back_from_its_ending_event(kind, status):
    with DagsterInstance.ephemeral() as instance:
        run = instance.create_run_for_job(one, status=DagsterRunStatus.STARTED)
        instance.event_log_storage.store_event(ended(run.run_id, kind))  # the status write is lost
        stuck = instance.get_run_by_id(run.run_id)
        assert stuck.status == DagsterRunStatus.STARTED
        worker = SimpleNamespace(instance=instance, name="cpu-0")
        assert _restore_status(worker, stuck).status == status
        assert instance.get_run_by_id(run.run_id).status == status


def test_a_run_still_going_is_left_as_it_is():
    with DagsterInstance.ephemeral() as instance:
        run = instance.create_run_for_job(one, status=DagsterRunStatus.STARTED)
        worker = SimpleNamespace(instance=instance, name="cpu-0")
        assert _restore_status(worker, run).status == DagsterRunStatus.STARTED


def cut() -> sqlalchemy.exc.OperationalError:
    return sqlalchemy.exc.OperationalError("INSERT", {}, Exception("server closed the connection"))


def test_a_call_cut_mid_statement_is_tried_again_and_a_refused_one_is_not():
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise cut()
        return "written"

    assert storage._patiently(flaky, 10, storage.lost_connection, "a write") == "written"
    assert len(calls) == 3

    refused = sqlalchemy.exc.IntegrityError("INSERT", {}, Exception("duplicate key"))
    assert not storage.lost_connection(refused)
    tries = []

    def constraint():
        tries.append(1)
        raise refused

    with pytest.raises(sqlalchemy.exc.IntegrityError):
        storage._patiently(constraint, 10, storage.lost_connection, "a write")
    assert len(tries) == 1


def test_past_its_patience_the_lost_connection_is_raised():
    started = time.monotonic()
    with pytest.raises(sqlalchemy.exc.OperationalError):
        storage._patiently(lambda: (_ for _ in ()).throw(cut()), 0.5, storage.lost_connection, "a write")
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("step_finished", [True, False])
def test_a_resumed_run_whose_last_step_had_finished_is_not_made_again(tmp_path, step_finished):
    marker = tmp_path / "made.txt"
    (tmp_path / "home").mkdir()
    with DagsterInstance.local_temp(str(tmp_path / "home")) as instance:
        run = instance.create_run_for_job(
            last_step_only,
            run_config={"ops": {"make": {"config": {"marker": str(marker)}}}},
            status=DagsterRunStatus.STARTED,
        )
        if step_finished:  # its worker died after the step, before the run's end was written
            instance.event_log_storage.store_event(ended(run.run_id, DagsterEventType.STEP_SUCCESS, "make"))
        worker = SimpleNamespace(instance=instance, name="media-0")
        for _event in _resume_from_last_finished_step(worker, reconstructable(last_step_only), run):
            pass
        assert instance.get_run_by_id(run.run_id).status == DagsterRunStatus.SUCCESS
        made = marker.read_text().splitlines() if marker.exists() else []
        assert made == ([] if step_finished else ["made"])


def test_a_run_over_here_whose_end_was_never_written_is_failed_once_the_storage_takes_it(monkeypatch):
    """Its execution ended, its writes having given up waiting (the state disk full past their
    patience), without a word of its end: it must not read STARTED for ever. While the storage
    still refuses, the worker keeps trying. A run whose writes never gave up is left as it is, and
    so is the run of a worker stopping (resumed elsewhere)."""
    monkeypatch.setattr(execute, "RECORD_RETRY_S", 0.01)
    monkeypatch.setattr(storage, "_gave_up", [-math.inf])
    with DagsterInstance.ephemeral() as instance:
        run = instance.create_run_for_job(one, status=DagsterRunStatus.STARTED)
        started = time.perf_counter()
        worker = SimpleNamespace(instance=instance, name="cpu-0", stopping=False)
        assert execute._settle(worker, run.run_id, started).status == DagsterRunStatus.STARTED

        with pytest.raises(sqlalchemy.exc.OperationalError):  # a write of the run gives up
            storage._patiently(lambda: (_ for _ in ()).throw(no_room()), 0, storage.out_of_room, "a write")
        stopping = SimpleNamespace(instance=instance, name="cpu-0", stopping=True)
        assert execute._settle(stopping, run.run_id, started).status == DagsterRunStatus.STARTED

        get_run_by_id, refusals = instance.get_run_by_id, []

        def full_then_room(run_id):
            if len(refusals) < 3:
                refusals.append(run_id)
                raise no_room()
            return get_run_by_id(run_id)

        monkeypatch.setattr(instance, "get_run_by_id", full_then_room)
        settled = execute._settle(worker, run.run_id, started)
        assert len(refusals) == 3 and settled.status == DagsterRunStatus.FAILURE
        failure = instance.get_records_for_run(run.run_id, of_type=DagsterEventType.RUN_FAILURE).records
        assert "storage_outage_seconds" in failure[0].event_log_entry.dagster_event.message


def no_room() -> sqlalchemy.exc.OperationalError:
    import sqlite3

    full = sqlite3.OperationalError("database or disk is full")
    full.sqlite_errorcode, full.sqlite_errorname = 13, "SQLITE_FULL"
    return sqlalchemy.exc.OperationalError("INSERT", {}, full)


def test_a_full_disk_is_waited_for_and_a_refused_write_is_not():
    assert storage.out_of_room(no_room()) and storage.storage_outage(no_room())
    refused = sqlalchemy.exc.IntegrityError("INSERT", {}, Exception("UNIQUE constraint failed"))
    assert not storage.out_of_room(refused) and not storage.storage_outage(refused)
