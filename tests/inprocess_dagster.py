"""The API's :class:`api.dagster.Gateway`, answered in the test process by a real Dagster instance.

Nothing is faked: a submitted run is created in one SQLite ``DagsterInstance`` (under the stack's
``dagster_home``) and queued, as the webserver and the run queue do; a lane per worker of the
server YAML (its device worker, its media workers, with their names; one more for the stock
launcher's runs) takes the runs of its pool one at a time, highest ``dagster/priority`` first then
in order (the launcher's routing: :func:`orchestration.launcher.run_pool`), and executes each for
real on its own thread with the real ops and the test's tiny model. Dagster's
``execute_in_process`` creates a run of its own, so a lane runs the queued one through the same
machinery (``execute_run`` on the in-process ephemeral job ``execute_in_process`` builds), with the
resources a worker's environment gives (the inference YAML, the media root, the step storage) in
its run config. Every answer is read back from the instance:
runs with their statuses and tags, a failed run's errors (as GraphQL words them), materializations
and engine events with their metadata as plain values (as :func:`api.dagster.metadata_value` reads
GraphQL's). Around a run a lane keeps the launcher's and the worker's books (the run's worker and
``claimed`` stage, its final stage, the process's weight loads), and tells the API the run ended.

Cancel: a queued run is canceled from the queue; a started one is marked CANCELING and interrupted
(Dagster's ``DagsterExecutionInterruptedError``, raised in the lane's thread while it is in op code,
where a worker's SIGINT is raised), so it ends CANCELED. What each lane says of itself is the
worker's own ``/status`` (:func:`orchestration.worker.snapshot.status`), read by the API as the
registered workers' is (:class:`InProcessWorkers`).
"""

from __future__ import annotations

import ctypes
import heapq
import itertools
import json
import logging
import socket
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dagster import DagsterEventType, DagsterInstance, DagsterRunStatus, MetadataValue, RunsFilter
from dagster._core.definitions.metadata import metadata_value as mv
from dagster._core.errors import DagsterExecutionInterruptedError, DagsterInvalidConfigError
from dagster._core.events import DagsterEvent
from dagster._utils.error import SerializableErrorInfo

from api.background.workers import WorkerStatuses
from api.dagster import (
    DagsterGatewayError,
    EngineEvent,
    Materialization,
    RunInfo,
    RunSubmission,
    StepFailure,
    own_error,
)
from contracts import events
from contracts.tags import (
    LAUNCHED_AT_TAG,
    LOADS_TAG,
    PARENT_RUN_ID_TAG,
    PRIORITY_TAG,
    RETRY_NUMBER_TAG,
    ROOT_RUN_ID_TAG,
    WORKER_TAG,
)
from orchestration.coordinator import cancel_if_duplicate
from settings.server import ServerConfig
from shotloom import stages

log = logging.getLogger("shotloom.tests.inprocess")
OPS_DIR = str(Path(__file__).resolve().parent.parent / "ops") + "/"  # op code: where a cancel interrupts
INTERRUPT_AGAIN_S = 5.0  # an interrupt the run outlived is raised again after this
FINAL = {
    DagsterRunStatus.SUCCESS: stages.SUCCEEDED,
    DagsterRunStatus.FAILURE: stages.FAILED,
    DagsterRunStatus.CANCELED: stages.CANCELED,
}


# -- answers, as GraphQL gives them ---------------------------------------------------------------
def plain_value(value: MetadataValue) -> Any:
    """A metadata value as :func:`api.dagster.metadata_value` reads the GraphQL entry of it."""
    if isinstance(value, mv.JsonMetadataValue):
        return json.loads(json.dumps(value.data))  # GraphQL sends the JSON string
    if isinstance(value, mv.PathMetadataValue | mv.NotebookMetadataValue):
        return str(value.value)
    if isinstance(value, mv.TextMetadataValue | mv.UrlMetadataValue | mv.MarkdownMetadataValue):
        return value.value
    if isinstance(value, mv.IntMetadataValue):
        return int(value.value) if value.value is not None else None
    if isinstance(value, mv.FloatMetadataValue | mv.TimestampMetadataValue):
        return float(value.value) if value.value is not None else None
    if isinstance(value, mv.BoolMetadataValue):
        return value.value
    if isinstance(value, mv.DagsterRunMetadataValue):
        return value.run_id
    if isinstance(value, mv.DagsterAssetMetadataValue):
        return "/".join(value.asset_key.path)
    if isinstance(value, mv.DagsterJobMetadataValue):
        return value.job_name
    if isinstance(value, mv.PoolMetadataValue):
        return value.pool
    return None  # null; tables, schemas and code references are not carried (nor over GraphQL)


def plain_metadata(metadata: Mapping[str, MetadataValue] | None) -> dict[str, Any]:
    return {label: plain_value(value) for label, value in (metadata or {}).items()}


def python_error(error: SerializableErrorInfo | None) -> dict[str, Any] | None:
    """A ``PythonError`` as GraphQL answers it: message, className and the explicit causes."""
    if error is None:
        return None
    causes, cause = [], error.cause
    while cause is not None and len(causes) < 10:
        causes.append({"message": cause.message, "className": cause.cls_name})
        cause = cause.cause
    return {"message": error.message, "className": error.cls_name, "causes": causes}


def run_info(record) -> RunInfo:
    run = record.dagster_run
    tags = dict(run.tags)
    return RunInfo(
        run_id=run.run_id,
        job_name=run.job_name,
        status=run.status.value,
        tags=tags,
        creation_time=record.create_timestamp.timestamp(),
        start_time=record.start_time,
        end_time=record.end_time,
        update_time=record.update_timestamp.timestamp() if record.update_timestamp else None,
        root_run_id=run.root_run_id or tags.get(ROOT_RUN_ID_TAG),
        parent_run_id=run.parent_run_id or tags.get(PARENT_RUN_ID_TAG),
    )


# -- one worker pool's device ---------------------------------------------------------------------
class Lane:
    """One worker of a pool, in this process: its runs, one at a time, on its own thread. It has the
    attributes a worker's ``/status`` reads (:func:`orchestration.worker.snapshot.status`), whose
    weights are this process's (one device lane: the model is loaded once, as on a worker)."""

    def __init__(self, name: str, pool: str | None, runtime_cfg, inference_config: str):
        self.name, self.pool, self.device, self.threads = name, pool, "cpu", 1
        self.runtime_cfg = runtime_cfg
        self.inference_config = inference_config  # its runtimes, of the several this process holds
        self.boot_id = uuid.uuid4().hex
        self.lock = threading.Lock()
        self.state = "starting"
        self.run_id: str | None = None
        self.pending_run_id: str | None = None
        self.finished: deque[str] = deque(maxlen=256)
        self.runs_done = 0
        self.admission_plan = self.residency = self.group = None
        self.thread: threading.Thread | None = None

    def status(self) -> dict[str, Any]:
        """What the registry and ``GET /status`` of a worker would say, as the API reads them."""
        from orchestration.worker.snapshot import status

        known = {"name": self.name, "pool": self.pool, "device": self.device, "host": socket.gethostname()}
        return {**known, **status(self, self.inference_config).model_dump(mode="json")}


class RunQueue:
    """One pool's queued runs: highest ``dagster/priority`` first, then in the order queued."""

    def __init__(self):
        self.lock = threading.Lock()
        self.wake = threading.Condition(self.lock)
        self.heap: list[tuple[int, int, str]] = []  # (-priority, order, run id)
        self._order = itertools.count()

    def put(self, run_id: str, priority: int) -> None:
        with self.lock:
            heapq.heappush(self.heap, (-priority, next(self._order), run_id))
            self.wake.notify()

    def take(self, lane: Lane, closing: threading.Event) -> str | None:
        """The next run, waiting for one, made ``lane``'s under the queue's lock (a run is always
        queued or a lane's: a cancel finds it); None once closing."""
        with self.lock:
            while not self.heap and not closing.is_set():
                self.wake.wait()
            if closing.is_set():
                return None
            run_id = heapq.heappop(self.heap)[2]
            with lane.lock:
                lane.run_id, lane.state = run_id, "busy"
            return run_id

    def remove(self, run_id: str) -> bool:
        with self.lock:
            kept = [entry for entry in self.heap if entry[2] != run_id]
            removed, self.heap = len(kept) != len(self.heap), kept
            heapq.heapify(self.heap)
            return removed

    def close(self) -> None:
        with self.lock:
            self.wake.notify_all()


class InProcessWorkers(WorkerStatuses):
    """The API's view of the workers (``/health``, a job's worker, the model's capabilities): the
    lanes' own status, as it reads a registered worker's."""

    def __init__(self, lanes: Callable[[], Iterable[Lane]]):
        super().__init__(registry=None)
        self.lanes = lanes

    def refresh(self) -> None:
        self.snapshots = {lane.name: lane.status() for lane in self.lanes() if lane.pool is not None}


# -- the gateway ----------------------------------------------------------------------------------
class InProcessDagster:
    """:class:`api.dagster.Gateway` on one Dagster instance, its runs executed by in-process lanes:
    one per device and media worker of the server YAML (with their names), one for the stock
    launcher's runs (no pool); each pool's lanes take its runs from one queue."""

    def __init__(self, cfg: ServerConfig):
        from orchestration.definitions import defs

        self.defs = defs
        self.inference_config = str(cfg.inference_config())
        self.resources = {  # what a worker's environment gives its runs (server.py's Stack.env)
            "runtime": {"config": {"inference_config": self.inference_config}},
            "media": {"config": {"root": str(cfg.media_root)}},
            "io_manager": {"config": {"base_dir": str(cfg.step_storage)}},
        }
        cfg.dagster_home.mkdir(parents=True, exist_ok=True)
        # No settings (with any, Dagster reconfigures the process's logging (dictConfig) at each run),
        # and no compute-log capture: it tails each step's output with two `tail -F` processes and
        # a watcher per stream, which the lanes' threads would spawn, and a test process ignoring
        # SIGTERM (as some launchers leave it) would leak and wait 30 s on at each step's end.
        self.instance = DagsterInstance.local_temp(
            str(cfg.dagster_home),
            overrides={
                "compute_logs": {
                    "module": "dagster._core.storage.noop_compute_log_manager",
                    "class": "NoOpComputeLogManager",
                }
            },
        )
        self.on_run_ended: Callable[[], None] = lambda: None  # told after every run (the API's nudge)
        self.lanes = [
            *(Lane(name, "device", cfg.runtime, self.inference_config) for name in cfg.worker_names()),
            *(Lane(name, "media", cfg.runtime, self.inference_config) for name in cfg.media_worker_names()),
            # the stock launcher's runs (no worker pool)
            Lane("stock", None, cfg.runtime, self.inference_config),
        ]
        self.queues = {lane.pool: RunQueue() for lane in self.lanes}
        self.workers = InProcessWorkers(lambda: self.lanes)
        self._jobs: dict[str, Any] = {}  # job name -> the in-process ephemeral job
        self._closing = threading.Event()

    # -- life -------------------------------------------------------------------------------------
    def start(self) -> InProcessDagster:
        for lane in self.lanes:
            lane.thread = threading.Thread(
                target=self._serve, args=(lane,), name=f"lane-{lane.name}", daemon=True
            )
            lane.thread.start()
        return self

    def close(self) -> None:
        self._closing.set()
        for queue in self.queues.values():
            queue.close()
        for lane in self.lanes:
            running = lane.run_id
            if running is not None:
                self.terminate(running)
        for lane in self.lanes:
            if lane.thread is not None:
                lane.thread.join(timeout=60)
        self.instance.dispose()

    # -- health -----------------------------------------------------------------------------------
    def ping(self) -> bool:
        return not self._closing.is_set()

    def daemon_healthy(self, daemon_types: Iterable[str] | None = None) -> bool | None:
        return not self._closing.is_set()  # the lanes are the run queue's daemon

    # -- submitting -------------------------------------------------------------------------------
    def _job(self, job_name: str):
        if job_name not in self._jobs:
            # execute_in_process's own job: the in-process executor, the definitions' resources
            self._jobs[job_name] = self.defs.get_job_def(job_name).as_ephemeral_job(
                resource_defs={}, input_values={}
            )
        return self._jobs[job_name]

    @staticmethod
    def _origin(job_name: str):
        """The job in the code location the webserver would have loaded (``-m orchestration.definitions``)."""
        from dagster._core.remote_origin import (
            InProcessCodeLocationOrigin,
            RemoteJobOrigin,
            RemoteRepositoryOrigin,
        )
        from dagster._core.types.loadable_target_origin import LoadableTargetOrigin

        target = LoadableTargetOrigin(executable_path=sys.executable, module_name="orchestration.definitions")
        location = InProcessCodeLocationOrigin(target, location_name="orchestration.definitions")
        return RemoteJobOrigin(RemoteRepositoryOrigin(location, "__repository__"), job_name)

    def submit(self, job_name: str, run_config: Mapping[str, Any], tags: Mapping[str, str]) -> str:
        (answer,) = self.submit_many([RunSubmission(job_name, run_config, tags)])
        if isinstance(answer, DagsterGatewayError):
            raise answer
        return answer

    def submit_many(self, submissions: Sequence[RunSubmission]) -> list[str | DagsterGatewayError]:
        return [self._submit_one(sub) for sub in submissions]

    def _submit_one(self, sub: RunSubmission) -> str | DagsterGatewayError:
        """Created and queued (as the webserver's launchRun with the queued run coordinator), or
        refused as GraphQL refuses it: an unknown job, a run config its schema does not take."""
        from dagster._core.definitions.job_base import InMemoryJob
        from dagster._core.execution.api import create_execution_plan

        from orchestration.launcher import run_pool

        try:
            job = self._job(sub.job_name)
        except Exception as exc:
            return DagsterGatewayError(
                f"submit {sub.job_name}: PipelineNotFoundError: {exc}", kind="PipelineNotFoundError"
            )
        run_config = {**sub.run_config, "resources": self.resources}
        tags = {str(k): str(v) for k, v in sub.tags.items()}
        try:
            plan = create_execution_plan(
                InMemoryJob(job), run_config=run_config, instance_ref=self.instance.get_ref()
            )
        except DagsterInvalidConfigError as exc:
            detail = "; ".join(e.message for e in exc.errors)
            return DagsterGatewayError(
                f"submit {sub.job_name}: RunConfigValidationInvalid: {detail}",
                kind="RunConfigValidationInvalid",
            )
        run = self.instance.create_run_for_job(
            job_def=job,
            execution_plan=plan,
            run_config=run_config,
            tags={**job.run_tags, **tags},
            remote_job_origin=self._origin(sub.job_name),  # a queued run says where its code is
        )
        original = cancel_if_duplicate(self.instance, run)  # as the run queue does on submit
        if original is not None:
            return original
        self.instance.report_dagster_event(
            DagsterEvent(event_type_value=DagsterEventType.RUN_ENQUEUED.value, job_name=run.job_name),
            run_id=run.run_id,
        )
        self.queues[run_pool(run)].put(run.run_id, int(tags.get(PRIORITY_TAG, "0") or 0))
        return run.run_id

    def terminate(self, run_id: str, force: bool = False, wait_starting_s: float = 5.0) -> bool:
        run = self.instance.get_run_by_id(run_id)
        if run is None or run.is_finished:
            return False
        if any(queue.remove(run_id) for queue in self.queues.values()):
            # as the queued run coordinator cancels a queued run
            self.instance.report_run_canceling(run, message="Canceling run from the queue.")
            self.instance.report_run_canceled(run)
            return True
        for lane in self.lanes:
            if lane.run_id == run_id:
                if run.status == DagsterRunStatus.CANCELING and not force:
                    return False  # already being canceled (the launcher refuses it too)
                if run.status != DagsterRunStatus.CANCELING:
                    self.instance.report_run_canceling(run)
                threading.Thread(target=self._interrupt, args=(lane, run_id), daemon=True).start()
                if force:
                    self.instance.report_run_canceled(run, message="Forcibly marked as canceled.")
                return True
        if force:  # in no lane: marked canceled, as Dagster's MARK_AS_CANCELED_IMMEDIATELY does
            self.instance.report_run_canceled(run, message="Forcibly marked as canceled.")
            return True
        return False

    def _interrupt(self, lane: Lane, run_id: str) -> None:
        """Raise Dagster's interrupt in the lane's thread once it is in op code (a worker's SIGINT
        is raised there too; between steps Dagster would hold it until the next one)."""
        raised_at = None
        while lane.run_id == run_id:
            now = time.monotonic()
            if (raised_at is None or now - raised_at > INTERRUPT_AGAIN_S) and _in_op_code(lane.thread):
                with lane.lock:
                    if lane.run_id == run_id:
                        _raise_in(lane.thread, DagsterExecutionInterruptedError)
                        raised_at = now
            time.sleep(0.02)

    # -- the lanes --------------------------------------------------------------------------------
    def _serve(self, lane: Lane) -> None:
        if lane.pool == "device":  # a warm worker: the model is loaded before it takes a run
            from shotloom.runtime import get_runtime

            lane.state = "warming"
            get_runtime(self.inference_config).adapter  # noqa: B018 - loads the weights
        lane.state = "idle"
        queue = self.queues[lane.pool]
        while True:
            run_id = queue.take(lane, self._closing)
            if run_id is None:
                return
            try:
                self._execute(lane, run_id)
            except DagsterExecutionInterruptedError:
                log.info("%s: run %s interrupted outside its steps", lane.name, run_id)
            except Exception:
                log.exception("%s: run %s raised", lane.name, run_id)
            finally:
                try:
                    self._after_run(lane, run_id)
                finally:
                    with lane.lock:
                        lane.run_id, lane.state = None, "idle"
                        lane.finished.append(run_id)
                        lane.runs_done += 1
                    self.on_run_ended()

    def _execute(self, lane: Lane, run_id: str) -> None:
        from dagster._core.definitions.job_base import InMemoryJob
        from dagster._core.execution.api import execute_run

        from resources import run_state

        run = self.instance.get_run_by_id(run_id)
        if run is None or run.status != DagsterRunStatus.QUEUED:
            return  # canceled while it waited
        # Dequeued and launched (as the daemon and DagsterInstance.launch_run record it) ...
        self.instance.report_dagster_event(
            DagsterEvent(event_type_value=DagsterEventType.RUN_STARTING.value, job_name=run.job_name),
            run_id=run_id,
        )
        if lane.pool is not None:  # ... and bound to this lane, as the launcher binds it to a worker
            claimed = {WORKER_TAG: lane.name, LAUNCHED_AT_TAG: f"{time.time():.6f}"}
            run_state.record(self.instance, run_id, {**claimed, **events.stage_tags(stages.CLAIMED)})
        run = self.instance.get_run_by_id(run_id)
        if run.status == DagsterRunStatus.CANCELING:
            self.instance.report_run_canceled(run, "Canceled before the lane started it.")
            return
        execute_run(InMemoryJob(self._job(run.job_name)), run, self.instance)

    def _after_run(self, lane: Lane, run_id: str) -> None:
        """The worker's books after a run: a run interrupted before Dagster could record it is
        canceled; the final stage; the weight loads of the process (device runs)."""
        from orchestration.worker.snapshot import loaded_runtimes, loads
        from resources import run_state

        run = self.instance.get_run_by_id(run_id)
        if run is not None and run.status == DagsterRunStatus.CANCELING:
            self.instance.report_run_canceled(run, "Canceled on the lane.")
            run = self.instance.get_run_by_id(run_id)
        if run is None:
            return
        tags = {LOADS_TAG: str(loads())} if lane.pool == "device" else {}
        if run.status in FINAL:
            tags.update(events.stage_tags(FINAL[run.status]))
        run_state.record(self.instance, run_id, tags)
        for rt in loaded_runtimes():
            rt.after_run()

    # -- reading runs -----------------------------------------------------------------------------
    def _runs(self, run_filter: RunsFilter, limit: int | None = None) -> list[RunInfo]:
        return [run_info(r) for r in self.instance.get_run_records(run_filter, limit=limit)]

    def run(self, run_id: str) -> RunInfo | None:
        return self.runs([run_id]).get(run_id)

    def runs(
        self, run_ids: Iterable[str], failures: bool = True, statuses: Iterable[str] | None = None
    ) -> dict[str, RunInfo]:
        from dataclasses import replace

        ids = list(dict.fromkeys(run_ids))
        if not ids:
            return {}
        wanted = [DagsterRunStatus(s) for s in statuses] if statuses is not None else None
        found = {info.run_id: info for info in self._runs(RunsFilter(run_ids=ids, statuses=wanted))}
        if failures:
            for rid, info in found.items():
                if info.status == "FAILURE":
                    message, error, steps = self._failure(rid)
                    found[rid] = replace(
                        info, failure_message=message, failure_error=error, step_failures=steps
                    )
        return found

    def _failure(self, run_id: str) -> tuple[str | None, str | None, tuple[StepFailure, ...]]:
        """The RUN_FAILURE event's message and own error, and the step failures, as GraphQL reads them."""
        kinds = {DagsterEventType.RUN_FAILURE, DagsterEventType.STEP_FAILURE}
        message = error = None
        steps: list[StepFailure] = []
        for record in self.instance.get_records_for_run(run_id, of_type=kinds).records:
            entry = record.event_log_entry
            event = entry.dagster_event
            if event.event_type == DagsterEventType.RUN_FAILURE:
                data = event.job_failure_data
                message, error = entry.message, own_error(python_error(data.error if data else None))
                continue
            data = event.step_failure_data
            err = python_error(data.error)
            steps.append(
                StepFailure(
                    step_key=entry.step_key,
                    message=((err or {}).get("message") or "").strip(),
                    class_name=(err or {}).get("className"),
                    description=data.user_failure_data.description if data.user_failure_data else None,
                    error_source=data.error_source.value if data.error_source else None,
                    cause=own_error(err),
                )
            )
        return message, error, tuple(steps)

    def find_runs_by_tag(self, key: str, value: str, limit: int | None = None) -> list[RunInfo]:
        return self._runs(RunsFilter(tags={key: value}), limit=limit)

    def retries_of(self, root_run_id: str) -> list[RunInfo]:
        runs = self._runs(RunsFilter(tags={ROOT_RUN_ID_TAG: root_run_id}))
        return sorted(runs, key=lambda r: (r.creation_time, int(r.tags.get(RETRY_NUMBER_TAG, "0") or 0)))

    def materializations(self, run_id: str) -> list[Materialization]:
        if self.instance.get_run_by_id(run_id) is None:
            raise DagsterGatewayError(f"run {run_id} not found", kind="RunNotFoundError")
        out = []
        records = self.instance.get_records_for_run(run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION)
        for record in records.records:
            entry = record.event_log_entry
            mat = entry.dagster_event.step_materialization_data.materialization
            out.append(
                Materialization(
                    asset_key=tuple(mat.asset_key.path),
                    partition=str(mat.partition) if mat.partition is not None else None,
                    metadata=plain_metadata(mat.metadata),
                    step_key=entry.step_key,
                    timestamp=entry.timestamp,
                    description=mat.description,
                    tags=dict(mat.tags or {}),
                )
            )
        return out

    def engine_events(self, run_id: str, cursor: str | None = None) -> tuple[list[EngineEvent], str | None]:
        out: list[EngineEvent] = []
        while True:
            page = self.instance.get_records_for_run(
                run_id, cursor=cursor, of_type=DagsterEventType.ENGINE_EVENT, limit=500
            )
            for record in page.records:
                entry = record.event_log_entry
                data = entry.dagster_event.engine_event_data
                out.append(EngineEvent(entry.message or "", plain_metadata(data.metadata if data else None)))
            cursor = page.cursor or cursor
            if not page.has_more:
                return out, cursor


def _in_op_code(thread: threading.Thread | None) -> bool:
    """The thread runs an op, and computes right now: its innermost frame is the engine's or the
    model libraries' own code, never Dagster's, the store's or the standard library's, whose locks
    an exception raised between an acquire and its ``try`` would leave held in this process."""
    frame = sys._current_frames().get(thread.ident) if thread is not None else None
    if frame is None or not frame.f_code.co_filename.startswith(_computing()):
        return False
    while frame is not None:
        if frame.f_code.co_filename.startswith(OPS_DIR):
            return True
        frame = frame.f_back
    return False


def _computing() -> tuple[str, ...]:
    """Where the code of a computing op lives: the engine, the ops, and the libraries of the model."""
    roots = [OPS_DIR, str(Path(OPS_DIR).parent / "shotloom") + "/"]
    for name in ("torch", "diffusers", "transformers", "numpy"):
        module = sys.modules.get(name)
        if module is not None and module.__file__:
            roots.append(str(Path(module.__file__).parent) + "/")
    return tuple(roots)


def _raise_in(thread: threading.Thread, exc_type: type[BaseException]) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(exc_type))
