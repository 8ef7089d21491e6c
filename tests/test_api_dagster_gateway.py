"""api.dagster's gateway against a real dagster-webserver (stock launcher, sqlite, a toy code location)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from api.dagster import DagsterGateway, DagsterGatewayError, DagsterUnavailable, RunInfo, own_error
from api.dagster import gateway as dagster_client

pytestmark = pytest.mark.slow

TOY_DEFS = textwrap.dedent(
    """
    import time

    from dagster import AssetMaterialization, Definitions, Failure, MetadataValue, job, op
    from dagster import in_process_executor


    @op
    def make(context):
        context.log_event(
            AssetMaterialization(
                asset_key=["shots", "s1"],
                partition="p1",
                metadata={
                    "path": MetadataValue.path("/media/s1/output.mp4"),
                    "frames": 17,
                    "bytes": 2**40,
                    "fps": 16.5,
                    "ok": True,
                    "note": "hello",
                    "info": MetadataValue.json({"a": [1, 2], "b": None}),
                    "url": MetadataValue.url("http://x/y"),
                    "nothing": None,
                },
            )
        )
        return 1


    @op
    def after(x):
        return x + 1


    @job(executor_def=in_process_executor)
    def ok_job():
        after(make())


    @op
    def boom():
        raise Failure(description="the boom op failed on purpose", metadata={"why": "test"})


    @job(executor_def=in_process_executor)
    def fail_job():
        boom()


    def fit(width, height):  # deep in the engine, as PIL's resize is
        if width <= 0 or height <= 0:
            raise ValueError("height and width must be > 0")


    class FitError(Exception):  # a project's own error type: its module path is not news to a client
        pass


    @op
    def crash():
        fit(0, 64)


    @op
    def reraise():
        try:
            fit(0, 64)
        except ValueError as exc:
            raise FitError("memory[0].image: a 1x1 image cannot make a 64x64 frame") from exc


    @job(executor_def=in_process_executor)
    def crash_job():
        crash()


    @job(executor_def=in_process_executor)
    def reraise_job():
        reraise()


    @op
    def sleepy():
        for _ in range(300):
            time.sleep(0.1)


    @job(executor_def=in_process_executor)
    def slow_job():
        sleepy()


    defs = Definitions(jobs=[ok_job, fail_job, crash_job, reraise_job, slow_job])
    """
)

# The stock launcher, and the stock coordinator that launches at once: dagster 1.13's default
# coordinator is the queued one, which needs the daemon.
DAGSTER_YAML = """
storage:
  sqlite:
    base_dir: {home}/storage
run_coordinator:
  module: dagster._core.run_coordinator
  class: DefaultRunCoordinator
telemetry:
  enabled: false
"""

WORKSPACE_YAML = """
load_from:
  - python_file:
      relative_path: toy_defs.py
      location_name: toy
      working_directory: {root}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def webserver(tmp_path_factory):
    root = tmp_path_factory.mktemp("dagster_gql")
    home = root / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text(DAGSTER_YAML.format(home=home))
    (root / "toy_defs.py").write_text(TOY_DEFS)
    (root / "workspace.yaml").write_text(WORKSPACE_YAML.format(root=root))
    port = free_port()
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "DAGSTER_HOME": str(home),
        "OMP_NUM_THREADS": "1",
    }
    log_path = root / "webserver.log"
    log = open(log_path, "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "dagster_webserver", "-h", "127.0.0.1", "-p", str(port)]
        + ["-w", "workspace.yaml"],
        cwd=root,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        gateway = DagsterGateway("127.0.0.1", port)
        deadline = time.monotonic() + 60
        while not gateway.ping():
            assert proc.poll() is None, log_path.read_text()[-4000:]
            assert time.monotonic() < deadline, "webserver not ready:\n" + log_path.read_text()[-4000:]
            time.sleep(0.3)
        yield port, log_path
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
        except ProcessLookupError:
            pass
        log.close()


@pytest.fixture
def gateway(webserver) -> DagsterGateway:
    port, _ = webserver
    # A launchRun costs this webserver about 1.3 s on a 2-core CI machine: a batch of six can
    # pass the 10 s default under load (what these tests assert is not latency).
    return DagsterGateway("127.0.0.1", port, timeout_s=60)


def wait_finished(gateway: DagsterGateway, run_ids: list[str], log_path: Path, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        runs = gateway.runs(run_ids)
        if len(runs) == len(run_ids) and all(r.finished for r in runs.values()):
            return runs
        assert time.monotonic() < deadline, f"{runs}\n{log_path.read_text()[-4000:]}"
        time.sleep(0.2)


def test_ping_location_and_daemon_health(gateway):
    assert gateway.ping()
    loc = gateway.location()
    assert (loc.location_name, loc.repository_name) == ("toy", "__repository__")
    assert set(loc.jobs) == {"ok_job", "fail_job", "crash_job", "reraise_job", "slow_job"}
    # no daemon runs: the required daemons (sensor, scheduler, backfill, ...) have no heartbeat
    assert gateway.daemon_healthy() is False
    assert any(s.required and s.healthy is False for s in gateway.daemon_statuses())
    # the immediate coordinator does not need the queued-run daemon: nothing required to judge
    assert gateway.daemon_healthy(["QUEUED_RUN_COORDINATOR"]) is None


def test_unreachable_and_unknown_location(webserver):
    port, _ = webserver
    down = DagsterGateway("127.0.0.1", free_port(), timeout_s=2)
    assert down.ping() is False
    assert down.daemon_healthy() is None
    with pytest.raises(DagsterUnavailable):
        down.runs(["x"])
    with pytest.raises(DagsterUnavailable):
        down.submit("ok_job", {}, {})
    elsewhere = DagsterGateway("127.0.0.1", port, location_name="nope")
    assert elsewhere.ping() is False
    with pytest.raises(DagsterUnavailable):
        elsewhere.location()


def test_submit_runs_materializations_and_tag_lookup(gateway, webserver):
    _, log_path = webserver
    version = uuid.uuid4().hex
    run_id = gateway.submit("ok_job", {}, {"shotloom/version": version, "shotloom/kind": "shot"})
    assert isinstance(run_id, str) and len(run_id) == 36
    info = wait_finished(gateway, [run_id], log_path)[run_id]
    assert isinstance(info, RunInfo)
    assert info.status == "SUCCESS", log_path.read_text()[-4000:]
    assert info.job_name == "ok_job"
    assert info.tags["shotloom/version"] == version and info.tags["shotloom/kind"] == "shot"
    assert info.creation_time <= info.start_time <= info.end_time
    assert info.create_time == info.creation_time
    assert info.root_run_id is None and info.parent_run_id is None
    assert info.failure_message is None and info.step_failures == () and info.error_summary() is None

    [mat] = gateway.materializations(run_id)
    assert mat.asset_key == ("shots", "s1") and mat.partition == "p1" and mat.step_key == "make"
    assert mat.metadata == {
        "path": "/media/s1/output.mp4",
        "frames": 17,
        "bytes": 2**40,  # beyond GraphQL's 32-bit Int: read from intRepr
        "fps": 16.5,
        "ok": True,
        "note": "hello",
        "info": {"a": [1, 2], "b": None},
        "url": "http://x/y",
        "nothing": None,
    }
    assert abs(mat.timestamp - info.end_time) < 60

    [found] = gateway.find_runs_by_tag("shotloom/version", version)
    assert found.run_id == run_id and found.status == "SUCCESS"
    assert gateway.find_runs_by_tag("shotloom/version", "no-such-version") == []
    assert gateway.retries_of(run_id) == []
    counts = gateway.queue_counts({"shotloom/version": version})
    assert counts["SUCCESS"] == 1 and sum(counts.values()) == 1

    # unknown ids are left out, not errors
    assert set(gateway.runs([run_id, str(uuid.uuid4())])) == {run_id}
    with pytest.raises(DagsterGatewayError) as err:
        gateway.materializations(str(uuid.uuid4()))
    assert err.value.kind == "RunNotFoundError"


def test_failed_run_reports_failure_and_retries_are_found(gateway, webserver, monkeypatch):
    _, log_path = webserver
    version = uuid.uuid4().hex
    run_id = gateway.submit("fail_job", {}, {"shotloom/version": version})
    info = wait_finished(gateway, [run_id], log_path)[run_id]
    assert info.status == "FAILURE"
    assert info.failure_reason == "STEP_FAILURE"
    assert "fail_job" in info.failure_message
    [step] = info.step_failures
    assert step.step_key == "boom" and step.class_name == "Failure"
    assert step.description == "the boom op failed on purpose"
    assert "the boom op failed on purpose" in step.message
    assert info.error_summary() == "boom: the boom op failed on purpose"
    assert gateway.runs([run_id])[run_id] == info  # second read comes from the failure cache
    # the log is read in pages (GraphQL cannot filter a run's events by type)
    monkeypatch.setattr(dagster_client, "_EVENT_PAGE", 3)
    assert DagsterGateway("127.0.0.1", gateway.port).runs([run_id])[run_id] == info

    # a re-execution (what the retry daemon does) gets a new id and points back to its root
    data = gateway.execute(
        """
        mutation Reexecute($params: ReexecutionParams!) {
          launchRunReexecution(reexecutionParams: $params) {
            __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message }
          }
        }""",
        {"params": {"parentRunId": run_id, "strategy": "FROM_FAILURE"}},
    )
    assert data["launchRunReexecution"]["__typename"] == "LaunchRunSuccess", data
    retry_id = data["launchRunReexecution"]["run"]["runId"]
    [retry] = gateway.retries_of(run_id)
    assert retry.run_id == retry_id
    assert retry.root_run_id == run_id and retry.parent_run_id == run_id
    assert {r.run_id for r in gateway.find_runs_by_tag("shotloom/version", version)} == {run_id, retry_id}
    monkeypatch.setattr(dagster_client, "_PAGE", 1)  # tag queries page by run-id cursor
    assert [r.run_id for r in gateway.find_runs_by_tag("shotloom/version", version)] == [retry_id, run_id]
    retry = wait_finished(gateway, [retry_id], log_path)[retry_id]
    assert retry.status == "FAILURE" and retry.error_summary() == "boom: the boom op failed on purpose"


def test_a_failed_op_reports_its_own_error_not_dagsters_wrapper(gateway, webserver):
    # An op that raises (no dagster Failure): Dagster records DagsterExecutionStepExecutionError
    # ("Error occurred while executing op ...") with the op's exception as its cause.
    _, log_path = webserver
    crash_id = gateway.submit("crash_job", {}, {"shotloom/version": uuid.uuid4().hex})
    reraise_id = gateway.submit("reraise_job", {}, {"shotloom/version": uuid.uuid4().hex})
    runs = wait_finished(gateway, [crash_id, reraise_id], log_path)
    crash, reraise = runs[crash_id], runs[reraise_id]
    assert crash.status == reraise.status == "FAILURE"
    [step] = crash.step_failures
    assert step.class_name == "DagsterExecutionStepExecutionError" and step.description is None
    assert "Error occurred while executing op" in step.message  # what clients were told before
    assert step.cause == "ValueError: height and width must be > 0"
    assert crash.error_summary() == "crash: ValueError: height and width must be > 0"
    # The op's own error is the one it raised, not the innermost cause; without its module path.
    assert (
        reraise.error_summary() == "reraise: FitError: memory[0].image: a 1x1 image cannot make a 64x64 frame"
    )
    assert "Dagster" not in crash.error_summary() + reraise.error_summary()


def test_own_error_reads_the_cause_chain():
    wrapper = {
        "message": "dagster._core.errors.DagsterExecutionStepExecutionError: "
        'Error occurred while executing op "x":\n',
        "className": "DagsterExecutionStepExecutionError",
    }
    assert own_error(None) is None and own_error({}) is None
    assert own_error({**wrapper, "causes": [{"message": "KeyError: 'w'\n", "className": "KeyError"}]}) == (
        "KeyError: 'w'"
    )
    assert own_error({**wrapper, "causes": [{"message": "RuntimeError\n", "className": "RuntimeError"}]}) == (
        "RuntimeError"
    )
    # Dagster's own error with no cause under it is the error.
    assert own_error({**wrapper, "causes": []}).startswith(
        "DagsterExecutionStepExecutionError: Error occurred"
    )
    # A message that does not start with its class is kept whole.
    assert own_error({"message": "worker lost", "className": "Exception"}) == "worker lost"


def test_the_graphql_gateway_and_the_in_process_one_answer_the_same_protocol():
    """The API reaches Dagster through api.dagster.Gateway only; the serving tests' in-process
    gateway (tests/inprocess_dagster.py) answers each of its methods with the same parameters."""
    import inspect

    from inprocess_dagster import InProcessDagster

    from api.dagster import Gateway

    methods = [n for n, f in vars(Gateway).items() if inspect.isfunction(f) and not n.startswith("_")]
    assert len(methods) == 11, methods

    def parameters(cls, name: str) -> list[tuple[str, object]]:
        return [(p.name, p.default) for p in inspect.signature(getattr(cls, name)).parameters.values()]

    for name in methods:
        for impl in (DagsterGateway, InProcessDagster):
            assert parameters(impl, name) == parameters(Gateway, name), (impl, name)


def test_terminate_long_run(gateway, webserver):
    _, log_path = webserver
    run_id = gateway.submit("slow_job", {}, {"shotloom/version": uuid.uuid4().hex})
    # the stock launcher returns with the run STARTING, which Dagster refuses to terminate;
    # terminate() waits for STARTED
    assert gateway.terminate(run_id) is True
    info = wait_finished(gateway, [run_id], log_path, timeout=20)[run_id]
    assert info.status == "CANCELED"
    assert info.end_time - info.start_time < 20  # the op would sleep 30 s
    assert gateway.terminate(run_id) is False  # finished
    assert gateway.terminate(str(uuid.uuid4())) is False  # unknown


def test_submit_errors_are_typed(gateway):
    with pytest.raises(DagsterGatewayError) as err:
        gateway.submit("no_such_job", {}, {})
    assert err.value.kind == "PipelineNotFoundError"
    assert not isinstance(err.value, DagsterUnavailable)
    with pytest.raises(DagsterGatewayError) as err:
        gateway.submit("ok_job", {"ops": {"not_an_op": {"config": {}}}}, {})
    assert err.value.kind == "RunConfigValidationInvalid"
    assert "not_an_op" in str(err.value)
    with pytest.raises(DagsterGatewayError) as err:
        gateway.execute("{ noSuchField }")
    assert "noSuchField" in str(err.value)


def test_a_batch_of_submissions_enters_the_queue_in_order_each_with_its_own_answer(gateway):
    from api.dagster import RunSubmission

    batch = [
        RunSubmission("ok_job", {}, {"shotloom/version": uuid.uuid4().hex, "n": str(n)}) for n in range(5)
    ]
    batch.insert(2, RunSubmission("no_such_job", {}, {}))
    answers = gateway.submit_many(batch)
    assert isinstance(answers[2], DagsterGatewayError) and answers[2].kind == "PipelineNotFoundError"
    run_ids = [a for a in answers if isinstance(a, str)]
    assert len(run_ids) == 5
    runs = gateway.runs(run_ids)
    assert [runs[r].tags["n"] for r in run_ids] == [str(n) for n in range(5)]
    created = [runs[r].create_time for r in run_ids]
    assert created == sorted(created)  # created (so queued) in the order given
    assert gateway.submit_many([]) == []


def test_one_gateway_serves_many_threads(gateway):
    run_ids = [r.run_id for r in gateway._runs_where({}, limit=5)]
    clients = set()
    lock = threading.Lock()

    def work(_):
        with lock:
            clients.add(id(gateway.client))
        assert gateway.ping()
        return gateway.runs(run_ids)

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(work, range(40)))
    assert all(set(r) == set(run_ids) for r in results)
    assert len(clients) > 1  # one client per thread: gql refuses concurrent use of one
