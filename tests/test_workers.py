"""Device workers behind DeviceRunLauncher.

Fast tests pin the private Dagster APIs the worker relies on, the generated
dagster.yaml and the launcher's health answers. The slow ones run the whole stack
from server.py (2 CPU workers, 1 thread each) in file order; the last of those stops
it with SIGTERM and starts it again on the same state dir. The final test binds a job
that can never fit to one bare worker process (admission on live RAM).
Crash recovery (kill -9) is in test_recovery.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import psutil
import pytest
from dagster import DagsterEventType, DagsterInstance, DagsterRunStatus
from dagster._core.launcher import LaunchRunContext
from dagster._daemon.controller import create_daemon_of_type
from dagster._daemon.run_coordinator import QueuedRunCoordinatorDaemon

from contracts import events
from contracts.tags import (
    ADMISSION_TAG,
    BOOT_TAG,
    DUPLICATE_OF_TAG,
    GPU_TAG,
    KIND_TAG,
    LAUNCHED_AT_TAG,
    LOADS_TAG,
    MEDIA_TAG,
    PID_TAG,
    STAGE_TAG,
    STEP_TAG,
    VERSION_TAG,
    WORKER_TAG,
)
from orchestration.instance_yaml import write_dagster_yaml
from orchestration.launcher import DeviceRunLauncher, read_workers
from orchestration.registry import WorkerRecord, WorkerRegistry
from settings.server import ServerConfig
from shotloom import stages

from api_stack import wait_for
from conftest import (
    LOCATION,
    Stack,
    first_submit,
    free_port,
    start_stack,
    stop_stack,
    write_inference_yaml,
    write_server_yaml,
)

REPO = Path(__file__).resolve().parent.parent


# -- fast ----------------------------------------------------------------------
def test_private_dagster_apis_the_worker_uses_are_unchanged():
    """core_execute_run & co. are private: fail loudly here when a Dagster upgrade moves them."""
    import inspect

    import dagster
    from dagster._grpc.impl import core_execute_run
    from dagster._utils.hosted_user_process import recon_job_from_origin
    from dagster._utils.interrupts import capture_interrupts, setup_interrupt_handlers

    assert dagster.__version__ == "1.13.27"
    params = list(inspect.signature(core_execute_run).parameters)
    assert params == ["recon_job", "dagster_run", "instance", "inject_env_vars", "resume_from_failure"]
    assert list(inspect.signature(recon_job_from_origin).parameters) == ["origin"]
    assert callable(capture_interrupts) and callable(setup_interrupt_handlers)
    # The worker sees SIGTERM through the wakeup fd because Dagster re-maps SIGTERM's handler:
    assert "SIGTERM" in inspect.getsource(setup_interrupt_handlers)


def test_launcher_imports_without_torch():
    code = "import sys, orchestration.launcher, settings.server; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


def test_the_daemon_dequeues_as_soon_as_the_queue_changes(tmp_path):
    """server.py's daemon does not wait out its interval once a run is queued, a run ends or an
    operator pauses: its look at the queue (one query) changes, and it dequeues again at once."""
    import threading

    from dagster._core.storage.dagster_run import DagsterRun
    from dagster._core.storage.runs.schema import RunsTable

    from orchestration.daemon import _patch_run_queue_daemon
    from orchestration.queue_control import QueueControl

    cfg = ServerConfig.model_validate(
        {
            "state_dir": str(tmp_path),
            "inference": {"config": "configs/inference.wan-tiny.yaml"},
            "workers": {"devices": [{"device": "cpu"}]},
            "dequeue_interval_seconds": 600,  # never reached here: only a change wakes it
        }
    ).resolved()
    write_dagster_yaml(cfg)
    _patch_run_queue_daemon()
    with DagsterInstance.from_config(str(cfg.dagster_home)) as instance:
        coordinator = instance.run_coordinator
        daemon = create_daemon_of_type(QueuedRunCoordinatorDaemon.daemon_type(), instance)
        iterations: list[float] = []

        def run_iteration(_context):
            iterations.append(time.monotonic())
            yield None

        daemon.run_iteration = run_iteration
        context = type("Context", (), {"instance": instance})()
        loop = daemon.core_loop(context, threading.Event())

        def iterate_until(count: int) -> None:
            deadline = time.monotonic() + 60
            while len(iterations) < count:
                assert time.monotonic() < deadline, "the daemon waited for its interval"
                next(loop)

        def add(run_id: str, status: DagsterRunStatus):
            run = instance.add_run(DagsterRun(job_name="r2v", run_id=run_id * 32, tags={GPU_TAG: "1"}))
            with instance.run_storage.connect() as conn:  # as the daemon sees it (no code origin here)
                conn.execute(
                    RunsTable.update().where(RunsTable.c.run_id == run.run_id).values(status=status.value)
                )
            return run.run_id

        iterate_until(1)
        add("a", DagsterRunStatus.QUEUED)
        iterate_until(2)  # a run queued (no limit known yet: it could start)
        running = add("b", DagsterRunStatus.STARTED)
        coordinator._limits = {GPU_TAG: 1}  # as the last dequeue found it: one device, now busy
        for _ in range(40):  # ~2 s of looks
            next(loop)
        assert len(iterations) == 2  # the queue moved, but nothing could start: no dequeue
        add("c", DagsterRunStatus.QUEUED)
        for _ in range(40):
            next(loop)
        assert len(iterations) == 2
        # a run ended with runs waiting: its slot is free
        instance.report_run_failed(instance.get_run_by_id(running))
        iterate_until(3)
        QueueControl(tmp_path).pause("ops")  # an operator's request
        iterate_until(4)
        assert iterations[-1] - iterations[0] < 30  # far below the 600 s interval: no wait was served


def test_a_worker_that_ended_a_run_tells_the_api_whose_follower_reads_the_runs_at_once(monkeypatch, tmp_path):
    """The worker's nudge, into the API's real route: the follower's next tick comes now. With the
    workers' token set, only a caller holding it is heard; the route is not in the public schema."""
    from types import SimpleNamespace

    import httpx
    from fastapi import FastAPI

    from api.admin.internal import worker_calls_router
    from api.background import Background
    from api.store import Store
    from orchestration.launcher import WORKER_TOKEN_ENV
    from orchestration.worker import Worker
    from settings.api import ApiConfig

    from api_stack import served

    store = Store(f"sqlite:///{tmp_path / 'service.sqlite'}")
    follower = Background(store, None, ApiConfig(), None)  # not started: only its wake is looked at
    app = FastAPI()
    app.include_router(worker_calls_router(SimpleNamespace(background=follower)))
    assert "/internal/run-ended" not in app.openapi()["paths"]
    try:
        with served(app) as base:
            worker = SimpleNamespace(name="media-0", api_url=base)
            Worker._tell_api(worker, "r" * 32)
            assert follower.follow_wake.is_set()
            follower.follow_wake.clear()

            monkeypatch.setenv(WORKER_TOKEN_ENV, "t0ken-of-the-control-plane")
            stranger = httpx.post(f"{base}/internal/run-ended", timeout=5)
            assert stranger.status_code == 401 and not follower.follow_wake.is_set()
            Worker._tell_api(worker, "r" * 32)  # the worker sends the token it holds
            assert follower.follow_wake.is_set()
    finally:
        store.close()


def test_a_terminate_racing_another_on_a_queued_run_changes_nothing(tmp_path):
    """Two terminates of one queued run at once (a client's cancel and the API's retry): the queue
    cancels it, and the second, finding it CANCELING, must not write CANCELING again over the
    CANCELED that follows (the run would then hold a device slot until the cancel timeout)."""
    from dagster import DagsterEventType
    from dagster._core.storage.dagster_run import DagsterRun

    cfg = ServerConfig.model_validate(
        {
            "state_dir": str(tmp_path),
            "inference": {"config": "configs/inference.wan-tiny.yaml"},
            "workers": {"devices": [{"device": "cpu"}]},
        }
    ).resolved()
    write_dagster_yaml(cfg)
    with DagsterInstance.from_config(str(cfg.dagster_home)) as instance:
        run = instance.add_run(DagsterRun(job_name="r2v", run_id="r" * 32, tags={GPU_TAG: "1"}))
        instance.report_run_canceling(run, message="Canceling run from the queue.")  # the first
        assert instance.run_launcher.terminate(run.run_id) is False  # the second
        instance.report_run_canceled(instance.get_run_by_id(run.run_id))
        assert instance.get_run_by_id(run.run_id).status == DagsterRunStatus.CANCELED
        kinds = [e.dagster_event_type for e in instance.all_logs(run.run_id) if e.dagster_event]
        assert kinds.count(DagsterEventType.RUN_CANCELING) == 1


def test_generated_dagster_yaml_builds_the_instance(tmp_path):
    cfg = ServerConfig.model_validate(
        {
            "state_dir": str(tmp_path),
            "inference": {"config": "configs/inference.wan-tiny.yaml"},
            "workers": {"devices": [{"device": "cpu", "threads": 1}, {"device": "cpu"}, {"device": 1}]},
        }
    ).resolved()
    assert cfg.worker_names() == ["cpu-0", "cpu-1", "cuda-1"]
    write_dagster_yaml(cfg)
    with DagsterInstance.from_config(str(cfg.dagster_home)) as instance:
        assert isinstance(instance.run_launcher, DeviceRunLauncher)
        assert instance.run_launcher.supports_check_run_worker_health
        coordinator = instance.run_coordinator
        assert coordinator.dequeue_interval_seconds == 1.0
        # The daemon reads the interval from the coordinator (a float).
        dequeuer = create_daemon_of_type(QueuedRunCoordinatorDaemon.daemon_type(), instance)
        assert dequeuer.interval_seconds == 1.0
        # One slot per worker alive in the registry, per pool (on any host): none registered yet.
        limits = coordinator.get_run_queue_config().tag_concurrency_limits
        assert limits == [{"key": GPU_TAG, "limit": 0}, {"key": MEDIA_TAG, "limit": 0}]
        registry = WorkerRegistry(instance.run_storage)
        for name, pool in (("cpu-0", "device"), ("gpu2-cuda-0", "device"), ("media-0", "media")):
            registry.publish(WorkerRecord(name, "http://127.0.0.1:1", os.getpid(), "boot", "cpu:0", pool))
        limits = coordinator.get_run_queue_config().tag_concurrency_limits
        assert limits == [
            {"key": GPU_TAG, "limit": 2},
            {"key": MEDIA_TAG, "limit": 1},  # merges never wait behind a generation
        ]
        registry.withdraw("cpu-0", "boot")  # stopped: its slot goes
        assert coordinator.get_run_queue_config().tag_concurrency_limits[0] == {"key": GPU_TAG, "limit": 1}
        assert instance.run_monitoring_enabled and instance.run_monitoring_max_resume_run_attempts > 0
        # No "Join the Dagster community" dialog on a fresh state dir, no telemetry.
        assert not instance.nux_enabled and not instance.telemetry_enabled
    shipped = ServerConfig.load(REPO / "configs" / "server.cpu.yaml")
    assert [(d.device, d.threads) for d in shipped.workers.devices] == [("cpu", 1), ("cpu", 1)]
    assert shipped.inference.config == REPO / "configs" / "inference.wan-tiny.yaml"


def test_an_earlier_releases_per_run_event_files_move_into_the_consolidated_log(tmp_path):
    """State dirs of earlier releases kept one event database per run; upgrading keeps every
    event and the asset history an operator could see."""
    from dagster import AssetKey, AssetMaterialization
    from dagster._core.test_utils import create_run_for_test

    from orchestration.storage import consolidate_events

    cfg = ServerConfig.model_validate(
        {
            "state_dir": str(tmp_path),
            "inference": {"config": "configs/inference.wan-tiny.yaml"},
            "workers": {"devices": [{"device": "cpu"}]},
        }
    ).resolved()
    home = cfg.dagster_home
    home.mkdir(parents=True)
    storage = home / "storage"
    (home / "dagster.yaml").write_text(f"storage:\n  sqlite:\n    base_dir: {storage}\n")
    with DagsterInstance.from_config(str(home)) as old:
        runs = [create_run_for_test(old, job_name="r2v") for _ in range(2)]
        for n, run in enumerate(runs):
            old.report_engine_event(f"stage decode of run {n}", run)
            old.report_runless_asset_event(AssetMaterialization(AssetKey(["shot", f"s{n}"])))
        before = {r.run_id: [e.message for e in old.all_logs(r.run_id)] for r in runs}
    assert (storage / "history" / "runs").is_dir()

    assert consolidate_events(storage) == 2
    assert consolidate_events(storage) == 0  # once
    write_dagster_yaml(cfg)
    with DagsterInstance.from_config(str(home)) as new:
        assert type(new.event_log_storage).__name__ == "ConsolidatedSqliteEventLogStorage"
        assert {r.run_id: [e.message for e in new.all_logs(r.run_id)] for r in runs} == before
        assert any("stage decode of run 1" in m for m in before[runs[1].run_id])
        assert {AssetKey(["shot", "s0"]), AssetKey(["shot", "s1"])} <= set(new.all_asset_keys())
        assert [r.run_id for r in new.get_runs()] == [r.run_id for r in reversed(runs)]


def test_health_check_answers_from_the_worker_registry(tmp_path):
    from dagster import instance_for_test
    from dagster._core.launcher import WorkerStatus
    from dagster._core.test_utils import create_run_for_test

    launcher = DeviceRunLauncher(state_dir=str(tmp_path), request_timeout_seconds=1)
    dead_port = free_port()  # nothing listens there
    with instance_for_test() as instance:
        launcher.register_instance(instance)

        def health(tags: dict[str, str]):
            run = create_run_for_test(instance, job_name="r2v", tags={GPU_TAG: "1", **tags})
            return launcher.check_run_worker_health(run)

        bound = {WORKER_TAG: "cpu-0", BOOT_TAG: "boot-a"}
        assert health({}).status == WorkerStatus.RUNNING  # not bound yet
        assert health(bound).status == WorkerStatus.FAILED  # worker not registered
        registry = WorkerRegistry(instance.run_storage)
        record = WorkerRecord("cpu-0", f"http://127.0.0.1:{dead_port}", os.getpid(), "boot-a", "cpu:0")
        registry.publish(record)
        result = health(bound)  # beating, endpoint not answering: transient, not a failure
        assert result.status == WorkerStatus.RUNNING and result.transient
        assert health({**bound, BOOT_TAG: "boot-old"}).status == WorkerStatus.FAILED  # restarted
        # Another host's worker that stopped beating is dead (no local pid to look at).
        elsewhere = replace(record, host="gpu-host-2", pid=1)
        registry.publish(elsewhere)
        assert health(bound).status == WorkerStatus.RUNNING
        launcher.heartbeat_timeout = 0.2
        time.sleep(0.3)
        stale = health(bound)
        assert stale.status == WorkerStatus.FAILED and "stopped beating" in stale.msg
        registry.withdraw("cpu-0", "boot-a")
        assert "stopped" in health(bound).msg
        assert [r.name for r in registry.records("device")] == ["cpu-0"] and registry.records("media") == []
        # Taking over an orphaned run: exactly one claimant wins, whatever host it is on.
        assert registry.claim("run-1", "a-cpu-0") and not registry.claim("run-1", "b-cpu-0")


def test_a_takeover_takes_the_run_from_its_dead_worker_before_it_waits_for_an_idle_one(tmp_path):
    """A dead worker's run is revoked when the takeover is decided, not when an idle worker is
    found: a worker that was only stopped and wakes meanwhile must find the run no longer its own
    (its fence reads the binding: orchestration.worker.fence), or it finishes the run another
    worker then runs again (the fault soak saw a step run twice so)."""
    from dagster import instance_for_test
    from dagster._core.launcher import ResumeRunContext, WorkerStatus
    from dagster._core.test_utils import create_run_for_test

    from contracts.tags import TAKEOVER_BOOT, run_owner

    launcher = DeviceRunLauncher(state_dir=str(tmp_path), request_timeout_seconds=1, launch_timeout_seconds=1)
    with instance_for_test() as instance:
        launcher.register_instance(instance)
        bound = {GPU_TAG: "1", WORKER_TAG: "cpu-1", BOOT_TAG: "boot-stopped"}
        run = create_run_for_test(instance, job_name="r2v", status=DagsterRunStatus.STARTED, tags=bound)
        with pytest.raises(RuntimeError, match="no idle device worker"):  # none idle within its wait
            launcher.resume_run(ResumeRunContext(dagster_run=run, workspace=None))
        owner = run_owner(instance.get_run_by_id(run.run_id).tags)
        assert owner[0] == "" and owner[1].startswith(TAKEOVER_BOOT)  # no worker's any more
        # ... and in the registry's binding row too, which nobody but a binder writes.
        registry = WorkerRegistry(instance.run_storage, launcher.heartbeat_timeout)
        assert registry.owner(instance.get_run_by_id(run.run_id)) == owner
        # Run monitoring reads a takeover in flight as such, and one that outlived every wait (its
        # daemon died mid-takeover) as failed: it is resumed again, never left unbound.
        taken = instance.get_run_by_id(run.run_id)
        assert launcher.check_run_worker_health(taken).status == WorkerStatus.RUNNING
        registry.bind(run.run_id, "", f"{TAKEOVER_BOOT}{time.time() - 3600:.3f}")
        result = launcher.check_run_worker_health(taken)
        assert result.status == WorkerStatus.FAILED and "takeover" in result.msg

        # Bound to the next worker, then the stopped worker's tag write in flight at its stop lands:
        # Dagster writes tags read-modify-write, so the tags name the stopped worker again. Run
        # monitoring must still judge the run by the worker it was bound to last, or it takes the
        # run over again while that worker runs it.
        nxt = WorkerRecord("cpu-0", "http://127.0.0.1:9", os.getpid(), "boot-next", "cpu:0")
        registry.publish(nxt)
        launcher._tag(taken, nxt, resume=True)  # what binding it to an idle worker writes
        instance.add_run_tags(run.run_id, {WORKER_TAG: "cpu-1", BOOT_TAG: "boot-stopped"})
        late = instance.get_run_by_id(run.run_id)
        assert run_owner(late.tags) == ("cpu-1", "boot-stopped")  # the tags were rewritten...
        assert registry.owner(late) == ("cpu-0", "boot-next")  # ... the binding was not
        result = launcher.check_run_worker_health(late)
        assert result.status == WorkerStatus.RUNNING and result.run_worker_id == "cpu-0", result.msg


def test_a_workers_next_stage_names_it_again_after_a_stale_binding_landed_in_the_tags():
    """The UI and the API show a run's worker from its tags: a woken worker's late write that put
    its old binding back there is put right by the next stage the owning worker writes."""
    from types import SimpleNamespace

    from dagster import instance_for_test
    from dagster._core.test_utils import create_run_for_test

    from contracts.tags import run_owner
    from orchestration.worker.fence import sign_stage_writes
    from resources import run_state

    with instance_for_test() as instance:
        run = create_run_for_test(instance, job_name="r2v", status=DagsterRunStatus.STARTED)
        worker = SimpleNamespace(instance=instance, run_id=run.run_id, name="cpu-0", boot_id="boot-next")
        sign_stage_writes(worker)
        instance.add_run_tags(run.run_id, {WORKER_TAG: "cpu-1", BOOT_TAG: "boot-stopped"})  # the late write
        assert run_owner(instance.get_run_by_id(run.run_id).tags) == ("cpu-1", "boot-stopped")
        run_state.record(instance, run.run_id, events.stage_tags(stages.INFERRING))
        assert run_owner(instance.get_run_by_id(run.run_id).tags) == ("cpu-0", "boot-next")


# -- slow: the whole stack -----------------------------------------------------
@pytest.fixture(scope="module")
def stack(tmp_path_factory, wan_checkpoint) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("server")
    inference = write_inference_yaml(root / "inference.yaml", "wan", wan_checkpoint, root / "cache")
    port = free_port()
    state = root / "state"
    state.mkdir()
    config = write_server_yaml(root / "server.yaml", state, port, inference)
    stack = start_stack(config, state, port)
    try:
        yield stack
    finally:
        stop_stack(stack)


@pytest.mark.slow
def test_runs_start_in_submission_order_on_both_workers(stack):
    run_ids = [first_submit(stack, "s0")] + [stack.submit(f"s{i}") for i in range(1, 6)]
    statuses = stack.wait(run_ids)
    assert statuses == [DagsterRunStatus.SUCCESS] * 6, stack.log("worker-cpu-0")
    runs = [stack.instance().get_run_by_id(r) for r in run_ids]
    launched = [float(r.tags[LAUNCHED_AT_TAG]) for r in runs]
    assert launched == sorted(launched)  # FIFO: the queue hands runs out in submission order
    assert {r.tags[WORKER_TAG] for r in runs} == {"cpu-0", "cpu-1"}


@pytest.mark.slow
def test_warm_worker_reuses_weights_and_process(stack):
    with stack.instance() as instance:
        runs = [
            r.dagster_run
            for r in instance.get_run_records()
            if GPU_TAG in r.dagster_run.tags and WORKER_TAG in r.dagster_run.tags
        ]
    workers = stack.workers()
    assert len(runs) >= 6
    for run in runs:
        worker = workers[run.tags[WORKER_TAG]]
        assert run.tags[PID_TAG] == str(worker["pid"])  # same long-lived process for every run
        assert run.tags[BOOT_TAG] == worker["boot_id"]
        assert run.tags[LOADS_TAG] == "1"  # weights were loaded once (warm-up), never per run
    for worker in workers.values():
        assert worker["loads"] == 1 and worker["weights_loaded"] and worker["runs_done"] >= 2
        assert "rss_bytes" in worker["resources"]


@pytest.mark.slow
def test_merge_runs_on_the_warm_media_worker_never_a_device(stack):
    media = stack.state / "media"
    inputs = [next((media / "r2v" / "w" / s).glob("*/output.mp4")) for s in ("s0", "s1")]
    config = {"work_id": "w", "inputs": [str(p.relative_to(media)) for p in inputs], "shot_ids": ["s0", "s1"]}
    run_id = stack.client.submit_job_execution(
        "merge", run_config={"ops": {"merge_op": {"config": config}}}, **LOCATION
    )
    assert stack.wait([run_id], timeout=120) == [DagsterRunStatus.SUCCESS], stack.log("daemon")
    run = stack.instance().get_run_by_id(run_id)
    pids = {w.name: str(w.pid) for w in read_workers(stack.state, "media")}
    assert sorted(pids) == ["media-0", "media-1"]  # the default: two media lanes
    assert GPU_TAG not in run.tags and run.tags[WORKER_TAG] in pids  # no device for a merge
    assert run.tags[PID_TAG] == pids[run.tags[WORKER_TAG]]  # in the long-lived process: none started
    assert list((media / "merge" / "w").glob("*/film.mp4"))


@pytest.mark.slow
def test_a_jobs_step_submitted_twice_runs_once_and_both_answers_name_the_same_run(stack):
    """A launch retried after its answer was lost may land after the first one did: the run queue
    cancels the second, unrun, and both submissions answer the run that has the step."""
    from api.dagster import DagsterGateway, RunSubmission

    gateway = DagsterGateway("127.0.0.1", stack.port, timeout_s=60)
    config = {"work_id": "w", "shot_id": "twice", "prompt": "shot twice", "seed": 1}
    run_config = {"ops": {"condition_op": {"config": config}}}
    step0 = RunSubmission("r2v", run_config, {VERSION_TAG: "v-twice", KIND_TAG: "r2v"})
    first = gateway.submit(step0.job_name, step0.run_config, step0.tags)
    # Again alone, then twice in one document (two launches the webserver takes one after another).
    assert gateway.submit(step0.job_name, step0.run_config, step0.tags) == first
    assert gateway.submit_many([step0, step0]) == [first, first]
    # Another step of the same job is not a duplicate.
    step1 = RunSubmission("r2v", run_config, {**step0.tags, STEP_TAG: "1"})
    [other] = gateway.submit_many([step1])
    assert other != first
    assert stack.wait([first, other]) == [DagsterRunStatus.SUCCESS] * 2, stack.log("daemon")
    with stack.instance() as instance:
        runs = [
            r.dagster_run
            for r in instance.get_run_records()
            if r.dagster_run.tags.get(VERSION_TAG) == "v-twice"
        ]
        # The run that has the step ran once.
        assert len(instance.get_records_for_run(first, of_type=DagsterEventType.RUN_SUCCESS).records) == 1
    duplicates = [r for r in runs if r.run_id not in (first, other)]
    assert len(duplicates) == 3
    for run in duplicates:  # canceled before the queue, never given to a worker
        assert run.status == DagsterRunStatus.CANCELED and run.tags[DUPLICATE_OF_TAG] == first
        assert WORKER_TAG not in run.tags


@pytest.mark.slow
def test_an_offer_answered_after_the_run_went_to_another_worker_is_not_run(stack):
    """The launcher binds a run to a worker, then offers it; a worker that answers too late (it was
    stopped, or cut off) finds the run bound to another and leaves it alone."""
    import httpx

    from contracts.worker import RUNS_PATH
    from orchestration.launcher import worker_auth_headers
    from orchestration.queue_control import QueueControl

    control = QueueControl(stack.state)
    control.pause("test")  # the run stays queued: nobody but this test offers it
    try:
        run_id = stack.submit("late-offer")
        wait_for(lambda: stack.client.get_run_status(run_id) == DagsterRunStatus.QUEUED, 30, "queued")
        workers = {r.name: r for r in read_workers(stack.state, "device")}
        late, bound = workers["cpu-0"], workers["cpu-1"]
        with stack.instance() as instance:  # as the launcher bound it to cpu-1 after giving up on cpu-0
            instance.add_run_tags(run_id, {WORKER_TAG: bound.name, BOOT_TAG: bound.boot_id})
        offer = {"run_id": run_id, "resume": False}
        answer = httpx.post(late.url + RUNS_PATH, json=offer, headers=worker_auth_headers())
        assert answer.status_code == 202 and answer.json()["accepted"], answer.text
        wait_for(lambda: "not run here" in stack.log("worker-cpu-0"), 30, "the late offer refused")
        wait_for(lambda: stack.workers()["cpu-0"]["state"] == "idle", 30, "cpu-0 idle")
        with stack.instance() as instance:
            run = instance.get_run_by_id(run_id)
            assert run.status == DagsterRunStatus.QUEUED  # untouched: nothing of cpu-0's written
            assert run.tags[WORKER_TAG] == bound.name and LOADS_TAG not in run.tags
            assert not instance.get_records_for_run(run_id, of_type=DagsterEventType.STEP_START).records
    finally:
        control.resume()
    assert stack.wait([run_id], timeout=120) == [DagsterRunStatus.SUCCESS]  # then as usual


@pytest.mark.slow
def test_cancel_running_run_keeps_worker_and_model(stack):
    before = stack.workers()
    long_run = stack.submit("long", width=256, height=256, num_frames=33)  # ~45 s if left alone
    deadline = time.monotonic() + 30
    while stack.client.get_run_status(long_run) != DagsterRunStatus.STARTED:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    time.sleep(1.0)
    asked = time.monotonic()
    stack.client.terminate_run(long_run)
    assert stack.wait([long_run], timeout=20) == [DagsterRunStatus.CANCELED]
    assert time.monotonic() - asked < 10

    name = stack.instance().get_run_by_id(long_run).tags[WORKER_TAG]
    after = stack.workers()
    assert after[name]["pid"] == before[name]["pid"] and after[name]["boot_id"] == before[name]["boot_id"]

    # Two runs at once: the first free worker (the one just used) takes one of them.
    next_runs = [stack.submit("n1"), stack.submit("n2")]
    assert stack.wait(next_runs) == [DagsterRunStatus.SUCCESS] * 2
    runs = [stack.instance().get_run_by_id(r) for r in next_runs]
    assert name in {r.tags[WORKER_TAG] for r in runs}
    assert all(w["loads"] == 1 for w in stack.workers().values())  # no reload after the cancel


def _succeeded_worker_runs(stack: Stack, at_least: int = 1) -> list:
    """Finished r2v runs that went through a device worker (submits one if the file ran partially)."""
    with stack.instance() as instance:
        runs = [
            r.dagster_run
            for r in instance.get_run_records()
            if GPU_TAG in r.dagster_run.tags
            and WORKER_TAG in r.dagster_run.tags
            and r.dagster_run.status == DagsterRunStatus.SUCCESS
        ]
    if len(runs) < at_least:
        run_ids = [first_submit(stack, f"extra-{i}") for i in range(at_least - len(runs))]
        assert stack.wait(run_ids) == [DagsterRunStatus.SUCCESS] * len(run_ids), stack.log("daemon")
        return _succeeded_worker_runs(stack, at_least)
    return runs


@pytest.mark.slow
def test_stage_tags_record_the_sequence_with_times_and_progress(stack):
    runs = _succeeded_worker_runs(stack)
    tiers = (stages.KEEPING_ON_GPU, stages.STAGING_ON_CPU, stages.UNLOADING)
    for run in runs:
        times = events.stage_times(run.tags)  # in the spec's order
        seen = list(times)
        miss = stages.CONDITIONING in times  # a conditioning-cache miss also places the generator
        tier = [s for s in seen if s in tiers]
        expected = [stages.CLAIMED, stages.VALIDATING, stages.CACHE_LOOKUP]
        expected += [*tier, stages.CONDITIONING] if miss else []
        expected += [stages.INFERRING, stages.DECODING, stages.WRITING, stages.SUCCEEDED]
        assert seen == expected, (run.run_id, times)
        assert len(tier) == (1 if miss else 0)
        stamps = list(times.values())
        assert stamps == sorted(stamps), times  # the spec's order is the order they happened in
        assert run.tags[STAGE_TAG] == stages.SUCCEEDED
        assert float(run.tags[LAUNCHED_AT_TAG]) <= times[stages.VALIDATING]
        progress = events.progress(run.tags)  # the last one written: decoded pieces
        assert progress is not None and progress["stage"] == stages.DECODING, run.tags
        assert progress["total"] > 0 and progress["done"] == progress["total"]
    assert any(stages.CONDITIONING in events.stage_times(r.tags) for r in runs)


@pytest.mark.slow
def test_worker_status_reports_admission_plan_device_and_weights(stack):
    runs = _succeeded_worker_runs(stack)
    statuses = stack.workers()
    assert set(statuses) == {"cpu-0", "cpu-1"}
    for name, status in statuses.items():
        assert status["device"] == name.replace("-", ":")
        assert status["nice"] == 10  # CPU workers yield the CPU to the control plane (workers.cpu_nice)
        assert status["weight_location"] == "cpu" and status["weights_loaded"]
        plan = status["admission_plan"]
        assert plan["verdict"] == "admit", plan
        assert plan["dit_residency"]["mode"] == "cpu"  # a CPU device: the DiT stays in host RAM
        assert plan["gpu"] is None and plan["ram"]["needed_gib"] <= plan["ram"]["available_gib"]
        assert plan["weights"]["source"] == "measured"  # warm: the loaded tensors were counted
        # The server YAML's policy, and what it chose when the worker placed the weights.
        assert status["residency_policy"] == "auto"
        assert status["dit_residency"]["policy"] == "auto" and status["dit_residency"]["mode"] == "cpu"
    # Each run carries the plan its worker admitted it with.
    tagged = json.loads(runs[0].tags[ADMISSION_TAG])
    assert tagged["verdict"] == "admit" and "dit_residency" in tagged


def test_the_worker_protocol_is_typed_both_ways(stack):
    """GET /status reads as contracts.worker.WorkerStatus; an offer that is not a RunOffer is a 400
    naming what is wrong (it crashed the handler before), and the worker goes on as it was."""
    import httpx

    from contracts.worker import RUNS_PATH
    from orchestration.launcher import worker_auth_headers, worker_status

    for record in read_workers(stack.state, "device"):
        status = worker_status(record.url)
        assert (status.name, status.boot_id, status.pool) == (record.name, record.boot_id, "device")
        bad = httpx.post(record.url + RUNS_PATH, json={"resume": True}, headers=worker_auth_headers())
        assert bad.status_code == 400 and "run_id" in bad.json()["error"], bad.text
        after = worker_status(record.url)
        assert (after.pid, after.boot_id) == (status.pid, status.boot_id)


def _tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.mark.slow
def test_sigterm_leaves_no_orphans_and_restart_works(stack):
    tree = _tree(stack.proc.pid)
    assert len(tree) >= 5  # server, 2 workers, daemon, webserver (+ code servers)
    stack.proc.send_signal(signal.SIGTERM)
    assert stack.proc.wait(60) == 0
    deadline = time.monotonic() + 10
    while _alive(tree) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(tree), [p.cmdline() for p in _alive(tree)]

    again = start_stack(stack.config, stack.state, stack.port)  # same state dir, same port
    try:
        assert again.wait([first_submit(again, "after-restart")]) == [DagsterRunStatus.SUCCESS]
    finally:
        stop_stack(again)
        assert again.proc.returncode == 0


# -- slow: one bare worker, bound by the launcher (no webserver, no daemon) ----------------------
@pytest.mark.slow
def test_job_that_can_never_fit_fails_with_needed_and_available_figures(tmp_path, wan_checkpoint):
    """Admission on the real worker path: live RAM, a job whose activations exceed the machine."""
    from dagster import DagsterEventType, reconstructable

    from orchestration.jobs import r2v

    inference = write_inference_yaml(
        tmp_path / "inference.yaml", "wan", wan_checkpoint, tmp_path / "cache", memory={"denoise_gib": 100000}
    )
    state = tmp_path / "state"
    cfg = ServerConfig.model_validate(
        {
            "state_dir": str(state),
            "inference": {"config": str(inference)},
            "workers": {"warm": False, "devices": [{"device": "cpu", "threads": 1}]},
        }
    ).resolved()
    write_dagster_yaml(cfg)
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "DAGSTER_HOME": str(cfg.dagster_home),
        "SHOTLOOM_INFERENCE_CONFIG": str(inference),
        "SHOTLOOM_MEDIA_ROOT": str(cfg.media_root),
        "SHOTLOOM_STEP_STORAGE": str(cfg.step_storage),
    }
    with DagsterInstance.from_config(str(cfg.dagster_home)) as instance:
        instance.get_runs(limit=1)  # create the schema before the worker opens it
        log = open(tmp_path / "worker.log", "ab")  # noqa: SIM115 - closed below
        worker = subprocess.Popen(
            [sys.executable, "-m", "orchestration.worker", "--device", "cpu", "--name", "cpu-0"]
            + ["--threads", "1", "--state-dir", str(state), "--no-warm"],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            config = {"work_id": "w", "shot_id": "huge", "prompt": "too big", "seed": 1}
            run = instance.create_run_for_job(
                r2v,
                run_config={"ops": {"condition_op": {"config": config}}},
                tags=r2v.tags,
                job_code_origin=reconstructable(r2v).get_python_origin(),
            )
            instance.run_launcher.launch_run(LaunchRunContext(dagster_run=run, workspace=None))
            deadline = time.monotonic() + 60
            while not instance.get_run_by_id(run.run_id).is_finished:
                alive = worker.poll() is None
                assert time.monotonic() < deadline and alive, (tmp_path / "worker.log").read_text()
                time.sleep(0.2)
            run = instance.get_run_by_id(run.run_id)
            assert run.status == DagsterRunStatus.FAILURE
            (failure,) = instance.all_logs(run.run_id, of_type=DagsterEventType.RUN_FAILURE)
            message = failure.dagster_event.message or failure.message
            plan = json.loads(run.tags[ADMISSION_TAG])
            assert plan["verdict"] == "never"
            ram = plan["ram"]
            assert ram["needed_gib"] >= 100000 > ram["capacity_gib"] > 0
            # The message names the device and gives both figures, in GiB, as the plan has them.
            figures = re.search(r"needs ([0-9.]+) GiB RAM, ([0-9.]+) GiB capacity", message)
            assert message.startswith("Can never fit on cpu:0") and figures, message
            assert float(figures[1]) == pytest.approx(ram["needed_gib"], abs=0.06)
            assert float(figures[2]) == pytest.approx(ram["capacity_gib"], abs=0.06)
            deadline = time.monotonic() + 10  # the worker tags the stage just after the failure
            while instance.get_run_by_id(run.run_id).tags[STAGE_TAG] != stages.FAILED:
                assert time.monotonic() < deadline, instance.get_run_by_id(run.run_id).tags
                time.sleep(0.1)
            assert worker.poll() is None  # the worker survives a refused job
        finally:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(30)
            finally:
                log.close()
                if worker.poll() is None:
                    worker.kill()
        assert worker.returncode == 0
