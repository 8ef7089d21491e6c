"""DeviceRunLauncher: hands gpu-tagged runs to long-lived device workers.

Modelled on dagster-docker's ``DockerRunLauncher``, but instead of starting a
container per run it binds the run to an idle worker process
(``orchestration.worker``) that keeps its model loaded across runs. Workers
register themselves in the shared storage (``orchestration.registry``); the launcher
talks to them over their HTTP endpoint. Two pools: device workers (runs
with the gpu tag: generation) and media workers (the media tag: merges, light
and quick, so they never wait behind a generation nor take a device). Runs with
neither take the stock ``DefaultRunLauncher`` path (a run worker via the code server).

Every process that builds the instance (webserver, daemon, workers, API)
imports this module: keep it free of torch and of anything heavy.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self

from dagster import Field, Float, IntSource, StringSource
from dagster import _check as check
from dagster._core.launcher import (
    CheckRunHealthResult,
    DefaultRunLauncher,
    LaunchRunContext,
    ResumeRunContext,
    RunLauncher,
    WorkerStatus,
)
from dagster._core.storage.dagster_run import DagsterRun, DagsterRunStatus
from dagster._serdes import ConfigurableClass, ConfigurableClassData
from pydantic import ValidationError

from contracts import events
from contracts import worker as protocol
from contracts.tags import (
    LAUNCHED_AT_TAG,
    POOL_TAGS,
    TAKEOVER_BOOT,
    binding_tags,
)
from orchestration.registry import WorkerRecord, WorkerRegistry
from orchestration.storage import DEFAULT_PATIENCE_S, patiently
from resources import run_state
from shotloom import stages

WORKER_TOKEN_ENV = "SHOTLOOM_WORKER_TOKEN"  # the shared secret a worker demands of its callers


def read_workers(state_dir: str | Path, pool: str | None = None) -> list[WorkerRecord]:
    """The registered workers of the instance under ``state_dir`` (for processes that hold no
    instance: server.py's readiness report, tests, benches)."""
    from dagster import DagsterInstance

    home = Path(state_dir) / "dagster_home"
    if not (home / "dagster.yaml").is_file():
        return []  # the server has not written its instance yet
    with DagsterInstance.from_config(str(home)) as instance:
        return WorkerRegistry(instance.run_storage).records(pool)


def run_pool(run: DagsterRun) -> str | None:
    """The worker pool a run goes to, or None for the stock launcher."""
    return next((pool for pool, tag in POOL_TAGS.items() if tag in run.tags), None)


class WorkerError(Exception):
    """The worker could not be reached (transient) or answered with an error."""


def worker_auth_headers() -> dict[str, str]:
    """What a caller of a worker sends: the shared token of the control plane, when one is set."""
    token = os.environ.get(WORKER_TOKEN_ENV)
    return {"Authorization": f"Bearer {token}"} if token else {}


def call_worker(url: str, path: str, payload: Mapping[str, Any] | None = None, timeout: float = 5.0) -> dict:
    """GET (no payload) or POST JSON to a worker; returns the JSON answer, 409 included."""
    data = None if payload is None else json.dumps(payload).encode()
    headers = {"Content-Type": "application/json", **worker_auth_headers()}
    req = urllib.request.Request(url + path, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        if exc.code == 409:  # busy / not running that run: an answer, not an error
            return {"conflict": True, **json.loads(exc.read() or b"{}")}
        raise WorkerError(f"{url}{path}: HTTP {exc.code}") from exc
    except (OSError, ValueError) as exc:
        raise WorkerError(f"{url}{path}: {exc}") from exc


def worker_status(url: str, timeout: float = 5.0) -> protocol.WorkerStatus:
    """A worker's ``GET /status``, typed (WorkerError when it cannot answer, or answers nonsense)."""
    answer = call_worker(url, protocol.STATUS_PATH, timeout=timeout)
    try:
        return protocol.WorkerStatus.model_validate(answer)
    except ValidationError as exc:
        raise WorkerError(f"{url}{protocol.STATUS_PATH}: not a worker's status: {exc}") from exc


class DeviceRunLauncher(RunLauncher, ConfigurableClass):
    """Binds each gpu-tagged run to an idle device worker; the rest go to DefaultRunLauncher."""

    def __init__(
        self,
        state_dir: str,
        launch_timeout_seconds: int = 300,
        request_timeout_seconds: int = 5,
        heartbeat_timeout_seconds: float = 15,
        storage_outage_seconds: float = DEFAULT_PATIENCE_S,
        inst_data: ConfigurableClassData | None = None,
    ):
        self._inst_data = inst_data
        self.state_dir = Path(state_dir)
        self.launch_timeout = launch_timeout_seconds
        self.request_timeout = request_timeout_seconds
        self.heartbeat_timeout = heartbeat_timeout_seconds
        self.storage_patience = storage_outage_seconds
        self._default: DefaultRunLauncher | None = None
        super().__init__()

    # -- ConfigurableClass --------------------------------------------------
    @property
    def inst_data(self) -> ConfigurableClassData | None:
        return self._inst_data

    @classmethod
    def config_type(cls) -> dict:
        return {
            "state_dir": Field(
                StringSource, description="The server's state dir (workers register in the shared storage)."
            ),
            "launch_timeout_seconds": Field(
                IntSource,
                is_required=False,
                default_value=300,
                description="How long launch_run waits for an idle worker (workers may still be warming).",
            ),
            "request_timeout_seconds": Field(IntSource, is_required=False, default_value=5),
            "heartbeat_timeout_seconds": Field(
                Float,
                is_required=False,
                default_value=15.0,
                description="A worker whose heartbeat is older than this is dead (its runs move on).",
            ),
            "storage_outage_seconds": Field(
                Float,
                is_required=False,
                default_value=DEFAULT_PATIENCE_S,
                description="How long a launch or a takeover waits for Dagster's storage while it cannot "
                "take writes (a launch that raised would fail its run).",
            ),
        }

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData, config_value: Mapping[str, Any]) -> Self:
        return cls(inst_data=inst_data, **config_value)

    # -- helpers ------------------------------------------------------------
    def _fallback(self) -> DefaultRunLauncher:
        if self._default is None:
            self._default = DefaultRunLauncher()
            self._default.register_instance(self._instance)
        return self._default

    @property
    def registry(self) -> WorkerRegistry:
        return WorkerRegistry(self._instance.run_storage, self.heartbeat_timeout)

    def _record(self, name: str) -> WorkerRecord | None:
        return self.registry.get(name)

    def _dispatch(self, run: DagsterRun, resume: bool, pool: str) -> WorkerRecord:
        """Offer the run to each idle registered worker until one accepts, waiting if all are busy.

        The binding tags are written BEFORE the offer: once a worker accepts, its ops write stage
        tags, and run tags are a read-modify-write of the run row, so two writers would lose
        updates. A worker that refuses gets its tags overwritten by the next offer.
        """
        deadline = time.monotonic() + self.launch_timeout
        while True:
            for record in self.registry.records(pool):
                if not self.registry.alive(record):
                    continue
                try:
                    status = worker_status(record.url, timeout=self.request_timeout)
                    if status.state != "idle" or status.boot_id != record.boot_id:
                        continue
                    self._tag(run, record, resume)
                except (WorkerError, ValidationError):
                    continue  # dead, booting, or not a worker of ours: try the next one
                offer = protocol.RunOffer(run_id=run.run_id, resume=resume)
                try:
                    answer = protocol.OfferAnswer.model_validate(
                        call_worker(
                            record.url, protocol.RUNS_PATH, offer.model_dump(), timeout=self.request_timeout
                        )
                    )
                except (WorkerError, ValidationError):
                    # The answer may be what was lost: a worker that took the run keeps it. One that
                    # answers neither (stopped, cut off) and takes it later finds the run bound to
                    # the next worker, and does not run it (orchestration.worker.execute).
                    if self._took(record, run.run_id):
                        return record
                    continue
                if answer.accepted:
                    return record
            # A worker that just finished may still be tidying up; the queue limit keeps this short.
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"no idle {pool} worker registered within {self.launch_timeout}s for run {run.run_id}"
                )
            time.sleep(0.2)

    def _took(self, record: WorkerRecord, run_id: str) -> bool:
        try:
            status = worker_status(record.url, timeout=self.request_timeout)
        except WorkerError:
            return False
        return status.boot_id == record.boot_id and status.holds(run_id)

    def _tag(self, run: DagsterRun, record: WorkerRecord, resume: bool) -> None:
        self.registry.bind(run.run_id, record.name, record.boot_id)
        run_state.record(
            self._instance,
            run.run_id,
            {
                **binding_tags(record.name, record.boot_id, record.pid),
                LAUNCHED_AT_TAG: f"{time.time():.6f}",
                # A resumed run (its worker died mid-run) is visibly "recovered", then moves on.
                **events.stage_tags(stages.RECOVERED if resume else stages.CLAIMED),
            },
        )

    def _bind(self, run: DagsterRun, resume: bool, pool: str) -> None:
        """Bind the run to a worker; Dagster's storage going away meanwhile (PostgreSQL restarting)
        is waited out, not raised: Dagster fails a run whose launch or resume raised. Everything
        before an offer is safe to do again, and nothing after an accepted one touches the storage."""
        record = self._patiently(lambda: self._dispatch(run, resume, pool), f"binding run {run.run_id}")
        verb = "Resumed" if resume else "Launched"
        self._patiently(
            lambda: self._instance.report_engine_event(
                f"{verb} run on {pool} worker {record.name} ({record.device}, pid {record.pid})",
                run,
                cls=self.__class__,
            ),
            f"recording the binding of run {run.run_id}",
        )

    def _patiently(self, attempt, what: str):
        return patiently(attempt, self.storage_patience, f"Dagster's storage unavailable while {what}")

    def _revoke(self, run: DagsterRun) -> None:
        """A takeover takes the run from its dead worker at once, before it waits for an idle one: a
        worker that was only stopped or cut off and wakes meanwhile finds the run bound to no worker
        of its own at its next write, and fences itself (orchestration.worker.fence), rather than
        finish a run another worker is about to run again."""

        def revoke() -> None:
            mark = f"{TAKEOVER_BOOT}{time.time():.3f}"
            self.registry.bind(run.run_id, "", mark)
            self._instance.add_run_tags(run.run_id, binding_tags("", mark, None))

        self._patiently(revoke, f"taking run {run.run_id} from its worker")

    # -- RunLauncher --------------------------------------------------------
    def launch_run(self, context: LaunchRunContext) -> None:
        run = context.dagster_run
        pool = run_pool(run)
        if pool is None:
            self._fallback().launch_run(context)
            return
        self._bind(run, resume=False, pool=pool)

    @property
    def supports_resume_run(self) -> bool:
        return True

    def resume_run(self, context: ResumeRunContext) -> None:
        run = context.dagster_run
        pool = run_pool(run)
        if pool is None:
            raise NotImplementedError("only runs of a worker pool can be resumed")
        self._revoke(run)
        self._bind(run, resume=True, pool=pool)

    def terminate(self, run_id: str) -> bool:
        check.str_param(run_id, "run_id")
        run = self._instance.get_run_by_id(run_id)
        if not run or run.is_finished:
            return False
        if run_pool(run) is None:
            return self._fallback().terminate(run_id)
        if run.status == DagsterRunStatus.CANCELING:
            # Already being canceled: two terminates racing on a queued run (the queue cancels it,
            # then this would write CANCELING over its CANCELED, and the run would hold a device
            # slot until monitoring's cancel timeout).
            return False
        self._instance.report_run_canceling(run)
        name, boot_id = self.registry.owner(run)
        record = self._record(name) if name else None
        if record is None or record.boot_id != boot_id:
            # Not bound yet, or its worker is gone: the worker checks CANCELING before it starts a
            # run, and run monitoring's cancel timeout finishes the job otherwise.
            return False
        try:
            reply = call_worker(record.url, protocol.terminate_path(run_id), {}, timeout=self.request_timeout)
            answer = protocol.TerminateAnswer.model_validate(reply)
        except (WorkerError, ValidationError) as exc:
            self._instance.report_engine_event(
                f"Could not reach worker {record.name} to terminate: {exc}", run, cls=self.__class__
            )
            return False
        return answer.terminated

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: DagsterRun) -> CheckRunHealthResult:
        if run_pool(run) is None:
            # The stock launcher cannot be asked either; leave such runs to the runtime limit.
            return CheckRunHealthResult(WorkerStatus.RUNNING, "not a worker-pool run")
        name, boot_id = self.registry.owner(run)
        if boot_id.startswith(TAKEOVER_BOOT):
            # Taken from a dead worker by a takeover (resume_run) still looking for an idle one; one
            # that outlived every wait of a launch was cut short (the daemon died): resume it again.
            began = float(boot_id[len(TAKEOVER_BOOT) :] or 0)
            if time.time() - began < self.launch_timeout + self.storage_patience + self.heartbeat_timeout:
                return CheckRunHealthResult(WorkerStatus.RUNNING, "being taken over", transient=True)
            return CheckRunHealthResult(WorkerStatus.FAILED, "its takeover stopped before a worker took it")
        if not name or not boot_id:
            return CheckRunHealthResult(WorkerStatus.RUNNING, "being bound to a worker", transient=True)
        record = self._record(name)
        if record is None:
            return CheckRunHealthResult(WorkerStatus.FAILED, f"worker {name} is gone", run_worker_id=name)
        if record.boot_id != boot_id:
            return CheckRunHealthResult(WorkerStatus.FAILED, f"worker {name} restarted", run_worker_id=name)
        if not self.registry.alive(record):
            why = "stopped" if record.heartbeat <= 0 else "died" if record.local else "stopped beating"
            return CheckRunHealthResult(WorkerStatus.FAILED, f"worker {name} {why}", run_worker_id=name)
        try:
            status = worker_status(record.url, timeout=self.request_timeout)
        except WorkerError as exc:
            # Alive but not answering (busy GIL, slow disk): never fail a run on that alone.
            return CheckRunHealthResult(WorkerStatus.RUNNING, str(exc), transient=True, run_worker_id=name)
        if status.boot_id != boot_id:
            return CheckRunHealthResult(WorkerStatus.FAILED, f"worker {name} restarted", run_worker_id=name)
        if status.holds(run.run_id):
            return CheckRunHealthResult(WorkerStatus.RUNNING, run_worker_id=name)
        if run.run_id in status.finished_run_ids:
            return CheckRunHealthResult(WorkerStatus.SUCCESS, run_worker_id=name)
        return CheckRunHealthResult(
            WorkerStatus.FAILED, f"worker {name} is not running this run", run_worker_id=name
        )

    def get_run_worker_debug_info(self, run: DagsterRun, include_container_logs: bool | None = True) -> str:
        name, _ = self.registry.owner(run)
        record = self._record(name) if name else None
        return f"device worker {name}: {record}" if record else f"device worker {name}: not registered"

    def dispose(self) -> None:
        if self._default is not None:
            self._default.dispose()

    def join(self, timeout: int = 30) -> None:
        if self._default is not None:
            self._default.join(timeout)
