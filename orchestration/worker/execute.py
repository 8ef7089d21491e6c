"""One run, on the MAIN thread, through Dagster's own run-worker entry point (``core_execute_run``):
``capture_interrupts`` and the SIGINT handling inside step execution only work there, which is
what makes cancel immediate and clean. A run whose worker died resumes from its last finished
step. After every run: its final stage, the weight loads, the runtimes' idle clocks, the worker
idle again, and a nudge to the API (when the worker knows its address).
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from orchestration.worker.memory import admit, runtime_for
from orchestration.worker.snapshot import loaded_runtimes, loads

if TYPE_CHECKING:
    from dagster import DagsterRun

    from orchestration.worker.process import Worker

log = logging.getLogger("shotloom.worker")
RECORD_RETRY_S, RECORD_RETRY_MAX_S = 1.0, 30.0  # between tries at recording a run's end


def execute(worker: Worker, run_id: str, resume: bool) -> None:
    from dagster import DagsterRunStatus
    from dagster._core.errors import DagsterExecutionInterruptedError
    from dagster._grpc.impl import core_execute_run
    from dagster._utils.hosted_user_process import recon_job_from_origin
    from dagster._utils.interrupts import capture_interrupts

    from orchestration.registry import WorkerRegistry

    with worker.lock:
        worker.run_id, worker.pending_run_id = run_id, None
    started = time.perf_counter()  # (the storage's patience is timed on the same clock)
    ours = True
    try:
        run = worker.instance.get_run_by_id(run_id)
        if run is None or run.is_finished:
            return
        owner = WorkerRegistry(worker.instance.run_storage).owner(run)
        if owner != (worker.name, worker.boot_id):
            # Bound to this worker before every offer (launcher, recovery): an offer answered late
            # (this worker was stopped or cut off while the launcher gave up on it and bound the
            # run to another) is not run, and nothing of this worker's is written on it.
            ours = False
            log.warning("%s: run %s is bound to %s (boot %s), not run here", worker.name, run_id, *owner)
            return
        if run.status == DagsterRunStatus.CANCELING:
            worker.instance.report_run_canceled(run, "Canceled before the device worker started it.")
            return
        if run.job_code_origin is None:
            worker.instance.report_run_failed(run, "Run has no job code origin.")
            return
        if worker.pool == "device" and not admit(worker, run_id, runtime_for(worker)):
            return
        recon_job = recon_job_from_origin(run.job_code_origin)
        with capture_interrupts():
            try:
                if resume:
                    events = _resume_from_last_finished_step(worker, recon_job, run)
                else:
                    events = core_execute_run(recon_job, run, worker.instance, inject_env_vars=False)
                for _event in events:
                    pass
            except (KeyboardInterrupt, DagsterExecutionInterruptedError):
                log.info("%s: run %s interrupted", worker.name, run_id)
    except Exception as exc:
        # core_execute_run reports its own failures; what raised before it (admission, recon)
        # must not leave the run STARTING forever (the health check would call it finished).
        log.exception("%s: run %s raised", worker.name, run_id)
        _fail_unfinished(worker, run_id, f"Device worker {worker.name} could not run it: {exc!r}")
    finally:
        _after_run(worker, run_id, ours, started)
        log.info("%s: run %s done in %.2fs", worker.name, run_id, time.perf_counter() - started)


def _resume_from_last_finished_step(worker: Worker, recon_job, run):
    """Execute a run whose worker died, from the steps that had not finished. The finished ones
    stored their outputs through the IO manager (safetensors under the run id), from which the
    remaining steps load them: conditioning and denoise are not redone when a worker dies while
    decoding; a run whose worker died after its last step only records its end (a merge or the
    stills of a shot are not made twice). (Dagster's ``core_execute_run`` with
    ``resume_from_failure`` re-runs every step of an in-process executor, and reloads the run, so
    the subset is applied here.)"""
    from dagster import DagsterEventType
    from dagster._core.events import DagsterEvent
    from dagster._core.execution.api import execute_run_iterator

    snapshot = worker.instance.get_execution_plan_snapshot(run.execution_plan_snapshot_id)
    if run.has_repository_load_data:
        recon_job = recon_job.with_repository_load_data(snapshot.repository_load_data)
    records = worker.instance.get_records_for_run(run.run_id, of_type=DagsterEventType.STEP_SUCCESS).records
    succeeded = {r.event_log_entry.step_key for r in records}
    planned = run.step_keys_to_execute or [step.key for step in snapshot.steps]
    read_later = {
        h.step_key for step in snapshot.steps for i in step.inputs for h in i.upstream_output_handles
    }
    # Kept: the leading steps (plan order) that finished and whose outputs, where a later step
    # reads them, this host can read (a run resumed on another host without shared step storage
    # starts over).
    finished: list[str] = []
    for key in planned:
        if key not in succeeded or (key in read_later and not _outputs_here(run.run_id, key)):
            break
        finished.append(key)
    remaining = planned[len(finished) :]
    if not remaining:  # its worker died after the last step, before the run's end was written
        worker.instance.report_dagster_event(
            DagsterEvent(
                event_type_value=DagsterEventType.RUN_SUCCESS.value,
                job_name=run.job_name,
                message=f"Every step had finished ({', '.join(finished)}); nothing run again.",
            ),
            run_id=run.run_id,
        )
        return iter(())
    if finished:
        worker.instance.report_engine_event(
            f"Resuming from the last finished step: {', '.join(sorted(finished))} kept; "
            f"running {', '.join(remaining)}",
            run,
        )
        run = run._replace(step_keys_to_execute=remaining)
    return execute_run_iterator(recon_job, run, worker.instance, resume_from_failure=True)


def _fail_unfinished(worker: Worker, run_id: str, message: str) -> None:
    try:
        run = worker.instance.get_run_by_id(run_id)
        if run is not None and not run.is_finished:
            worker.instance.report_run_failed(run, message)
    except Exception:
        log.exception("%s: could not report %s as failed", worker.name, run_id)


def _restore_status(worker: Worker, run: DagsterRun) -> DagsterRun | None:
    """Dagster records a run's end in two writes: its ending event, then its status. The storage
    cut between the two (PostgreSQL restarting) leaves the event in the log and the run STARTED,
    and the daemon, which sees its worker alive, then waits on it for ever. The worker that ran it
    writes the status again from the event (the storage's own ``handle_run_event``)."""
    from dagster import DagsterEventType
    from dagster._time import datetime_from_timestamp

    run_id = run.run_id
    ending = {DagsterEventType.RUN_SUCCESS, DagsterEventType.RUN_FAILURE, DagsterEventType.RUN_CANCELED}
    records = worker.instance.get_records_for_run(run_id, of_type=ending, limit=1, ascending=False).records
    if not records:
        return run
    entry = records[0].event_log_entry
    log.warning(
        "%s: run %s ended (%s) but its status reads %s: recording it again",
        worker.name,
        run_id,
        entry.dagster_event_type.value,
        run.status.value,
    )
    worker.instance.run_storage.handle_run_event(
        run_id, entry.get_dagster_event(), datetime_from_timestamp(entry.timestamp)
    )
    return worker.instance.get_run_by_id(run_id)


def _after_run(worker: Worker, run_id: str, ours: bool, started: float) -> None:
    """The worker idle again; for a run it ran (``ours``, ``started`` at that
    ``time.perf_counter()``), its end recorded first."""
    if ours:
        _record_end(worker, run_id, started)
    with worker.lock:
        worker.run_id = None
        if ours:
            worker.finished.append(run_id)
            worker.runs_done += 1
        worker.state = "stopping" if worker.stopping else "idle"
    if ours and worker.api_url:
        threading.Thread(target=tell_api, args=(worker, run_id), daemon=True).start()


def _record_end(worker: Worker, run_id: str, started: float) -> None:
    """Its status (restored if lost), its final stage, the weight loads, the runtimes' clocks."""
    from dagster import DagsterRunStatus

    from contracts import events
    from contracts.tags import LOADS_TAG
    from resources import run_state
    from shotloom import stages

    final = {
        DagsterRunStatus.SUCCESS: stages.SUCCEEDED,
        DagsterRunStatus.FAILURE: stages.FAILED,
        DagsterRunStatus.CANCELED: stages.CANCELED,
    }
    try:
        run = _settle(worker, run_id, started)
        tags = {LOADS_TAG: str(loads())} if worker.pool == "device" else {}
        if run is not None and run.status in final:
            tags.update(events.stage_tags(final[run.status]))
        run_state.record(worker.instance, run_id, tags)
        for rt in loaded_runtimes():
            rt.after_run()  # idle clock, measured CUDA peak
    except Exception:
        log.exception("%s: could not finish bookkeeping for %s", worker.name, run_id)


def _settle(worker: Worker, run_id: str, started: float) -> DagsterRun | None:
    """The run's end, in the storage. Its execution is over here: a run still unfinished in the
    storage whose writes gave up waiting since it ``started`` (``time.perf_counter()``; the
    storage away or its disk full for longer than they wait) is one whose end could not be
    written: it is recorded (failed, saying so) and, while the storage still cannot take it, tried
    again until it can, the worker taking nothing else meanwhile, so a job is never left running
    for ever. A worker stopping leaves its run as it is (resumed elsewhere)."""
    from dagster import DagsterRunStatus

    from orchestration.storage import gave_up_since, storage_outage

    wait = RECORD_RETRY_S
    while True:
        try:
            run = worker.instance.get_run_by_id(run_id)
            if run is not None and not run.is_finished:
                run = _restore_status(worker, run)
            if run is not None and run.status == DagsterRunStatus.CANCELING:
                # Interrupted before Dagster could record it (e.g. the run never reached a step).
                worker.instance.report_run_canceled(run, "Canceled on the device worker.")
            elif run is not None and not run.is_finished and not worker.stopping and gave_up_since(started):
                worker.instance.report_run_failed(
                    run,
                    f"Device worker {worker.name}: the run stopped without its outcome written: Dagster's "
                    "storage could not take its writes (unreachable, or its disk full) for longer than "
                    "runtime.storage_outage_seconds",
                )
            else:
                return run
            return worker.instance.get_run_by_id(run_id)
        except Exception as exc:
            if worker.stopping or not storage_outage(exc):
                raise
            log.warning("%s: the end of run %s is not recorded yet, retrying: %s", worker.name, run_id, exc)
        time.sleep(wait)
        wait = min(wait * 2, RECORD_RETRY_MAX_S)


def tell_api(worker: Worker, run_id: str) -> None:
    """A nudge, nothing more: a missed one costs the API one follow tick."""
    import urllib.request

    from orchestration.launcher import worker_auth_headers

    request = urllib.request.Request(
        f"{worker.api_url}/internal/run-ended", data=b"", method="POST", headers=worker_auth_headers()
    )
    try:
        urllib.request.urlopen(request, timeout=1.0).close()
    except OSError as exc:
        log.debug("%s: could not tell the API that %s ended: %s", worker.name, run_id, exc)


def _outputs_here(run_id: str, step_key: str) -> bool:
    """The step's outputs are in this host's step storage (the IO manager's files)."""
    from resources.tensor_io import default_storage_dir

    folder = Path(default_storage_dir()) / run_id / step_key
    return folder.is_dir() and any(folder.iterdir())
