"""Device workers behind DeviceRunLauncher.

Fast tests pin the private Dagster APIs the worker relies on, the generated
dagster.yaml and the launcher's health answers. The slow ones run the whole stack
from server.py (2 CPU workers, 1 thread each) in file order; the last one stops it
with SIGTERM and starts it again on the same state dir.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest
import yaml
from conftest import write_inference_yaml
from dagster import DagsterInstance, DagsterRunStatus
from dagster_graphql import DagsterGraphQLClient

from orchestration.launcher import (
    BOOT_TAG,
    GPU_TAG,
    LAUNCHED_AT_TAG,
    LOADS_TAG,
    PID_TAG,
    WORKER_TAG,
    DeviceRunLauncher,
    WorkerRecord,
    read_workers,
    workers_dir,
)
from orchestration.server_config import ServerConfig

REPO = Path(__file__).resolve().parent.parent
LOCATION = {"repository_location_name": "orchestration.definitions", "repository_name": "__repository__"}
DONE = (DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED)


# -- fast ----------------------------------------------------------------------
def test_private_dagster_apis_the_worker_uses_are_unchanged():
    """core_execute_run & co. are private: fail loudly here when a Dagster upgrade moves them."""
    import inspect

    import dagster
    from dagster._grpc.impl import core_execute_run
    from dagster._utils.hosted_user_process import recon_job_from_origin
    from dagster._utils.interrupts import capture_interrupts, setup_interrupt_handlers

    assert dagster.__version__ == "1.13.28"
    params = list(inspect.signature(core_execute_run).parameters)
    assert params == ["recon_job", "dagster_run", "instance", "inject_env_vars", "resume_from_failure"]
    assert list(inspect.signature(recon_job_from_origin).parameters) == ["origin"]
    assert callable(capture_interrupts) and callable(setup_interrupt_handlers)
    # The worker sees SIGTERM through the wakeup fd because Dagster re-maps SIGTERM's handler:
    assert "SIGTERM" in inspect.getsource(setup_interrupt_handlers)


def test_launcher_imports_without_torch():
    code = (
        "import sys, orchestration.launcher, orchestration.server_config; assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


def test_generated_dagster_yaml_builds_the_instance(tmp_path):
    cfg = ServerConfig.model_validate(
        {
            "state_dir": str(tmp_path),
            "inference": {"config": "configs/inference.wan-tiny.yaml"},
            "workers": {"devices": [{"device": "cpu", "threads": 1}, {"device": "cpu"}, {"device": 1}]},
        }
    ).resolved()
    assert cfg.worker_names() == ["cpu-0", "cpu-1", "cuda-1"]
    cfg.write_dagster_yaml()
    with DagsterInstance.from_config(str(cfg.dagster_home)) as instance:
        assert isinstance(instance.run_launcher, DeviceRunLauncher)
        assert instance.run_launcher.supports_check_run_worker_health
        coordinator = instance.run_coordinator
        assert coordinator.dequeue_interval_seconds == 1
        assert coordinator.get_run_queue_config().tag_concurrency_limits == [{"key": GPU_TAG, "limit": 3}]
        assert instance.run_monitoring_enabled and instance.run_monitoring_max_resume_run_attempts > 0
    shipped = ServerConfig.load(REPO / "configs" / "server.cpu.yaml")
    assert [(d.device, d.threads) for d in shipped.workers.devices] == [("cpu", 1), ("cpu", 1)]
    assert shipped.inference.config == REPO / "configs" / "inference.wan-tiny.yaml"


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
        record = WorkerRecord("cpu-0", f"http://127.0.0.1:{dead_port}", os.getpid(), "boot-a", "cpu:0")
        record.write(workers_dir(tmp_path))
        result = health(bound)  # alive pid, endpoint not answering: transient, not a failure
        assert result.status == WorkerStatus.RUNNING and result.transient
        assert health({**bound, BOOT_TAG: "boot-old"}).status == WorkerStatus.FAILED  # restarted


# -- slow: the whole stack -----------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Stack:
    proc: subprocess.Popen
    config: Path
    state: Path
    port: int
    client: DagsterGraphQLClient

    def log(self, name: str = "server") -> str:
        path = self.state / "logs" / f"{name}.log" if name != "server" else self.state / "server.out"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def workers(self) -> dict[str, dict]:
        out = {}
        for record in read_workers(self.state):
            try:
                with urllib.request.urlopen(record.url + "/status", timeout=2) as resp:
                    out[record.name] = json.loads(resp.read())
            except OSError:
                pass
        return out

    def instance(self) -> DagsterInstance:
        return DagsterInstance.from_config(str(self.state / "dagster_home"))

    def submit(self, shot_id: str, **shot) -> str:
        config = {"work_id": "w", "shot_id": shot_id, "prompt": f"shot {shot_id}", "seed": 1, **shot}
        return self.client.submit_job_execution(
            "r2v", run_config={"ops": {"condition_op": {"config": config}}}, **LOCATION
        )

    def wait(self, run_ids: list[str], timeout: float = 90) -> list[DagsterRunStatus]:
        deadline = time.monotonic() + timeout
        while True:
            statuses = [self.client.get_run_status(r) for r in run_ids]
            if all(s in DONE for s in statuses) or time.monotonic() > deadline:
                return statuses
            time.sleep(0.5)


def start_stack(config: Path, state: Path, port: int) -> Stack:
    out = open(state / "server.out", "ab")  # noqa: SIM115 - lives as long as the process
    proc = subprocess.Popen(
        [sys.executable, "server.py", "--config", str(config)],
        cwd=REPO,
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    stack = Stack(proc, config, state, port, DagsterGraphQLClient("127.0.0.1", port_number=port))
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:
        assert proc.poll() is None, stack.log()
        try:
            up = httpx.get(f"http://127.0.0.1:{port}/server_info", timeout=2).status_code == 200
        except httpx.HTTPError:
            up = False
        workers = stack.workers()
        if up and len(workers) == 2 and all(w["state"] == "idle" for w in workers.values()):
            return stack
        time.sleep(1)
    raise AssertionError("stack did not come up\n" + stack.log() + stack.log("webserver"))


def stop_stack(stack: Stack) -> None:
    if stack.proc.poll() is None:
        os.killpg(stack.proc.pid, signal.SIGTERM)
        try:
            stack.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(stack.proc.pid, signal.SIGKILL)


def first_submit(stack: Stack, shot_id: str, **shot) -> str:
    deadline = time.monotonic() + 90
    while True:  # the code location may still be loading
        try:
            return stack.submit(shot_id, **shot)
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


@pytest.fixture(scope="module")
def stack(tmp_path_factory, wan_checkpoint) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("server")
    inference = write_inference_yaml(root / "inference.yaml", "wan", wan_checkpoint, root / "cache")
    port = free_port()
    state = root / "state"
    state.mkdir()
    config = root / "server.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "state_dir": str(state),
                "webserver": {"host": "127.0.0.1", "port": port},
                "inference": {"config": str(inference)},
                "workers": {"warm": True, "devices": [{"device": "cpu", "threads": 1}] * 2},
                "monitoring": {"poll_interval_seconds": 2},
            }
        )
    )
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
        runs = [r.dagster_run for r in instance.get_run_records() if WORKER_TAG in r.dagster_run.tags]
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
def test_merge_run_takes_the_stock_launcher_path(stack):
    media = stack.state / "media"
    inputs = [next((media / "r2v" / "w" / s).glob("*/output.mp4")) for s in ("s0", "s1")]
    config = {"work_id": "w", "inputs": [str(p.relative_to(media)) for p in inputs], "shot_ids": ["s0", "s1"]}
    run_id = stack.client.submit_job_execution(
        "merge", run_config={"ops": {"merge_op": {"config": config}}}, **LOCATION
    )
    assert stack.wait([run_id], timeout=120) == [DagsterRunStatus.SUCCESS], stack.log("daemon")
    run = stack.instance().get_run_by_id(run_id)
    assert GPU_TAG not in run.tags and WORKER_TAG not in run.tags  # no device worker for a merge
    assert list((media / "merge" / "w").glob("*/film.mp4"))


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
