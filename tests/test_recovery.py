"""Crash recovery of the whole service, with real kills (``kill -9``).

One stack from server.py (2 CPU workers, 1 thread each, run monitoring polled every
second) on temp state and free ports. server.py restarts any child that dies:

* a device worker killed mid-run: run monitoring sees the worker's boot id change (or
  its pid gone) and resumes the run on a worker under the same run id; the launcher
  marks it with stage ``recovered``;
* the daemon and the webserver killed while runs wait in the queue: queued runs live
  in run storage, so the restarted daemon launches every one of them.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import time
from collections.abc import Iterator

import psutil
import pytest
from dagster import DagsterEventType, DagsterRunStatus
from dagster._daemon.monitoring.run_monitoring import RESUME_RUN_LOG_MESSAGE

from contracts import events
from contracts.tags import BOOT_TAG, LAUNCHED_AT_TAG, PID_TAG, STAGE_AT_PREFIX, STAGE_TAG, WORKER_TAG
from orchestration.registry import CLAIM_PREFIX
from shotloom import stages

from conftest import (
    Stack,
    first_submit,
    free_port,
    start_stack,
    stop_stack,
    write_inference_yaml,
    write_server_yaml,
)

pytestmark = pytest.mark.slow

# ~15 s on one thread: conditioning ~7 s, 100 denoise steps ~2 s, tiled decode ~5 s. Long enough to
# kill a worker while it infers or decodes.
LONG = {"width": 128, "height": 128, "num_frames": 33}
SIGMAS = [round(1.0 - i * 0.0098, 4) for i in range(100)]  # 1.0 ... 0.0298, strictly descending


@pytest.fixture(scope="module")
def stack(tmp_path_factory, wan_checkpoint) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("recovery")
    inference = write_inference_yaml(
        root / "inference.yaml",
        "wan",
        wan_checkpoint,
        root / "cache",
        sampler={"sigmas": SIGMAS, "shift": 1.0},
    )
    port = free_port()
    state = root / "state"
    state.mkdir()
    config = write_server_yaml(
        root / "server.yaml",
        state,
        port,
        inference,
        monitoring={"poll_interval_seconds": 1},
        # A frozen worker is declared dead within seconds (the test that stops one waits that out).
        runtime={
            "orphan_scan_seconds": 1,
            "handover_grace_seconds": 3,
            "heartbeat_seconds": 1,
            "heartbeat_timeout_seconds": 5,
        },
    )
    stack = start_stack(config, state, port)
    try:
        yield stack
    finally:
        stop_stack(stack)


def _wait_for(predicate, timeout: float, what: str, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(interval)


def _suspend_outside_transactions(proc: psutil.Process, stack: Stack) -> None:
    """SIGSTOP ``proc`` at a moment it holds no SQLite lock on the instance's storage (stopped
    inside a transaction it would lock every other process out)."""
    dbs = list((stack.state / "dagster_home" / "storage").rglob("*.db"))

    def unlocked(db) -> bool:
        con = sqlite3.connect(db, timeout=0.2)
        try:
            con.execute("BEGIN EXCLUSIVE")
            con.rollback()
            return True
        except sqlite3.OperationalError:
            return False
        finally:
            con.close()

    for _ in range(100):
        proc.suspend()
        if all(unlocked(db) for db in dbs):
            return
        proc.resume()
        time.sleep(0.05)
    raise AssertionError("could not stop the process outside a storage transaction")


def _all_idle(stack: Stack) -> bool:
    states = stack.workers()
    return len(states) == stack.n_workers and all(s["state"] == "idle" for s in states.values())


def test_worker_killed_mid_decode_resumes_from_the_last_finished_step_under_the_same_identity(stack):
    run_id = first_submit(stack, "crash", **LONG)
    with stack.instance() as instance:

        def mid_decode():
            run = instance.get_run_by_id(run_id)
            assert not run.is_finished, (run.status, stack.log("daemon"))
            return run if run.tags.get(STAGE_TAG) == stages.DECODING else None

        run = _wait_for(mid_decode, 90, "the run to reach decoding", interval=0.1)
        name, pid, boot = run.tags[WORKER_TAG], int(run.tags[PID_TAG]), run.tags[BOOT_TAG]
        stage_at_kill = run.tags[STAGE_TAG]
        os.kill(pid, signal.SIGKILL)
        killed_at = time.time()

        # server.py restarts the worker (same name, new process, new boot id).
        def restarted():
            status = stack.workers().get(name)
            return status if status and status["boot_id"] != boot else None

        status = _wait_for(restarted, 60, f"{name} to come back", interval=0.3)
        assert status["pid"] != pid and not psutil.pid_exists(pid)
        assert f"worker-{name} exited with -9; restarting" in stack.log()

        assert stack.wait_stored([run_id], timeout=120)[0] is not None
        # Resumed under the same run id (DESIGN.md); a retry would be a new run whose root is this one.
        # (Its worker stamps the last stage just after Dagster records the end.)
        final = _wait_for(
            lambda: (r := instance.get_run_by_id(run_id)).tags.get(STAGE_TAG) in stages.TERMINAL and r,
            30,
            "the run's last stage",
        )
        assert final.status == DagsterRunStatus.SUCCESS, (stage_at_kill, stack.log(f"worker-{name}"))
        assert final.run_id == run_id, "resumed by run monitoring, not retried as a new run"

        times = events.stage_times(final.tags)
        assert stages.RECOVERED in times, final.tags
        assert killed_at - 1 <= times[stages.RECOVERED] <= times[stages.SUCCEEDED]
        assert final.tags[STAGE_TAG] == stages.SUCCEEDED
        # Resumed by run monitoring.
        resumes = instance.all_logs(run_id, of_type=DagsterEventType.ENGINE_EVENT)
        assert any(e.message == RESUME_RUN_LOG_MESSAGE for e in resumes)
        assert final.tags[BOOT_TAG] != boot  # bound to a live worker this time
        # From the last finished step: conditioning and denoise ran once (their outputs were
        # loaded back from the step storage), decode ran again.
        starts = [e.step_key for e in instance.all_logs(run_id, of_type=DagsterEventType.STEP_START)]
        assert starts.count("condition_op") == 1 and starts.count("denoise_op") == 1, starts
        assert starts.count("decode_op") == 2 and starts.count("write_op") == 1, starts
        # The shot was written once, under the surviving run id.
        media = stack.state / "media" / "r2v" / "w" / "crash"
        assert [p.parent.name for p in media.glob("*/output.mp4")] == [final.run_id]
    print(
        f"killed {name} in {stage_at_kill}; resumed on {final.tags[WORKER_TAG]} after "
        f"{times[stages.RECOVERED] - killed_at:.1f}s; succeeded {times[stages.SUCCEEDED] - killed_at:.1f}s "
        "after the kill"
    )


def test_daemon_and_webserver_killed_lose_no_queued_run(stack):
    _wait_for(lambda: _all_idle(stack), 60, "idle workers", interval=0.3)
    run_ids = [first_submit(stack, "q0")] + [stack.submit(f"q{i}") for i in range(1, 5)]  # ~3 s each
    with stack.instance() as instance:

        def both_busy():
            runs = [instance.get_run_by_id(r) for r in run_ids]
            started = [r for r in runs if r.status == DagsterRunStatus.STARTED]
            return runs if len(started) == stack.n_workers else None

        # Both slots taken: the daemon is not in the middle of a launch when it dies.
        runs = _wait_for(both_busy, 60, "two runs to start")
        queued = [r.run_id for r in runs if r.status == DagsterRunStatus.QUEUED]
        assert queued, [r.status for r in runs]

        children = stack.children()
        daemon, web = children["daemon"], children["webserver"]
        helpers = daemon.children(recursive=True) + web.children(recursive=True)  # their code servers
        daemon.kill()
        web.kill()
        killed_at = time.monotonic()

        def restarted():
            now = stack.children()
            if now.get("daemon") and now.get("webserver"):
                return now if (now["daemon"].pid, now["webserver"].pid) != (daemon.pid, web.pid) else None
            return None

        again = _wait_for(restarted, 30, "daemon and webserver to be restarted", interval=0.3)
        assert again["daemon"].pid != daemon.pid and again["webserver"].pid != web.pid
        statuses = stack.wait_stored(run_ids, timeout=150)
        assert statuses == [DagsterRunStatus.SUCCESS] * len(run_ids), (statuses, stack.log("daemon"))
        done_at = time.monotonic()

        # The queued ones were launched by the new daemon, oldest first.
        launched = [float(instance.get_run_by_id(r).tags[LAUNCHED_AT_TAG]) for r in queued]
        assert launched == sorted(launched)
    _wait_for(stack.webserver_up, 60, "the webserver", interval=0.5)
    assert [stack.client.get_run_status(r) for r in run_ids] == [DagsterRunStatus.SUCCESS] * len(run_ids)
    assert "daemon exited with -9; restarting" in stack.log()
    assert "webserver exited with -9; restarting" in stack.log()
    left = [p for p in helpers if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    print(
        f"{len(queued)} queued at the kill; all {len(run_ids)} done {done_at - killed_at:.1f}s after it; "
        f"code servers of the killed processes still alive: {[p.pid for p in left]}"
    )


def test_run_bound_to_a_worker_but_never_handed_over_is_taken_back(stack):
    """The daemon died between binding a run (tags first) and POSTing it to the worker: run
    monitoring would only time the STARTING run out; the idle worker takes it back itself."""
    from dagster._core.events import DagsterEvent

    _wait_for(lambda: _all_idle(stack), 60, "idle workers", interval=0.3)
    daemon = stack.children()["daemon"]
    _suspend_outside_transactions(daemon, stack)  # no dequeue, no launch: the run stays as left
    try:
        run_id = first_submit(stack, "handover")
        boot = stack.workers()["cpu-0"]["boot_id"]
        with stack.instance() as instance:
            bound = time.time() - 60  # bound a minute ago, never handed over
            instance.add_run_tags(
                run_id,
                {WORKER_TAG: "cpu-0", BOOT_TAG: boot, LAUNCHED_AT_TAG: f"{bound:.3f}", PID_TAG: "0"}
                | events.stage_tags(stages.CLAIMED, at=bound),
            )
            instance.report_dagster_event(
                DagsterEvent(event_type_value=DagsterEventType.RUN_STARTING.value, job_name="r2v"), run_id
            )
            assert instance.get_run_by_id(run_id).status == DagsterRunStatus.STARTING
        [status] = stack.wait_stored([run_id], timeout=60)
        assert status == DagsterRunStatus.SUCCESS, stack.log("worker-cpu-0")
        with stack.instance() as instance:
            tags = instance.get_run_by_id(run_id).tags
        assert tags[WORKER_TAG] == "cpu-0" and STAGE_AT_PREFIX + stages.RECOVERED in tags
    finally:
        daemon.resume()


def test_run_marked_starting_but_never_bound_is_taken_by_an_idle_worker(stack):
    """The daemon died after marking a run STARTING and before binding it to any worker."""
    from dagster._core.events import DagsterEvent

    _wait_for(lambda: _all_idle(stack), 60, "idle workers", interval=0.3)
    daemon = stack.children()["daemon"]
    _suspend_outside_transactions(daemon, stack)
    try:
        run_id = first_submit(stack, "unbound")
        with stack.instance() as instance:
            instance.report_dagster_event(
                DagsterEvent(event_type_value=DagsterEventType.RUN_STARTING.value, job_name="r2v"), run_id
            )
        [status] = stack.wait_stored([run_id], timeout=60)
        assert status == DagsterRunStatus.SUCCESS
        with stack.instance() as instance:
            tags = instance.get_run_by_id(run_id).tags
            # Exactly one worker claimed it, in the shared storage (any host's worker could have).
            claim = instance.run_storage.get_cursor_values({CLAIM_PREFIX + run_id})
        assert tags[WORKER_TAG] in ("cpu-0", "cpu-1") and STAGE_AT_PREFIX + stages.RECOVERED in tags
        assert claim == {CLAIM_PREFIX + run_id: tags[WORKER_TAG]}
    finally:
        daemon.resume()


def test_a_worker_stopped_past_its_heartbeat_timeout_wakes_to_find_its_run_taken_and_writes_nothing(stack):
    """A worker frozen (SIGSTOP: a swapping host, a debugger) past the heartbeat timeout is declared
    dead and its run taken over; the other worker is busy, so the takeover waits for it. The
    frozen worker wakes meanwhile: it must not finish the run the other worker then runs again
    (the fault soak saw a step run twice so). It finds the run taken at its next write, exits
    before it, and comes back as a fresh worker; the run succeeds once, each step once."""
    from contracts.tags import TAKEOVER_BOOT

    _wait_for(lambda: _all_idle(stack), 60, "idle workers", interval=0.3)
    frozen_run = first_submit(stack, "frozen", **LONG)
    other_run = stack.submit("busy", **LONG)  # keeps the other worker busy past the takeover
    with stack.instance() as instance:

        def both_running():
            runs = [instance.get_run_by_id(r) for r in (frozen_run, other_run)]
            bound = all(r.status == DagsterRunStatus.STARTED and r.tags.get(PID_TAG) for r in runs)
            return runs if bound else None

        run, other = _wait_for(both_running, 90, "both runs started, one per worker")
        name, boot = run.tags[WORKER_TAG], run.tags[BOOT_TAG]
        assert other.tags[WORKER_TAG] != name
        worker = psutil.Process(int(run.tags[PID_TAG]))
        _suspend_outside_transactions(worker, stack)
        try:

            def revoked():
                tags = instance.get_run_by_id(frozen_run).tags
                return tags if tags.get(BOOT_TAG, "").startswith(TAKEOVER_BOOT) else None

            # Declared dead (heartbeat timeout 5 s, monitoring every second): the takeover takes
            # the run from it at once, before any worker is idle to take it.
            _wait_for(revoked, 40, "the takeover to take the run from the frozen worker")
            assert not instance.get_run_by_id(other_run).is_finished, "the other worker was meant to be busy"
        finally:
            worker.resume()

        def fresh():
            status = stack.workers().get(name)
            return status if status and status["boot_id"] != boot else None

        _wait_for(fresh, 90, f"{name} back as a fresh worker")
        assert stack.wait_stored([frozen_run, other_run], timeout=180) == [DagsterRunStatus.SUCCESS] * 2
        log = (stack.state / "logs" / f"worker-{name}.log").read_text(errors="replace")
        assert f"{name}: fenced" in log, log[-4000:]
        assert f"worker-{name} exited with 75; restarting" in stack.log()
        final = instance.get_run_by_id(frozen_run)
        assert final.tags[BOOT_TAG] not in (boot,) and not final.tags[BOOT_TAG].startswith(TAKEOVER_BOOT)
        successes = [e.step_key for e in instance.all_logs(frozen_run, of_type=DagsterEventType.STEP_SUCCESS)]
        assert sorted(successes) == sorted(set(successes)), successes  # each step once
        assert {"condition_op", "denoise_op", "decode_op", "write_op"} <= set(successes), successes
        assert len(instance.all_logs(frozen_run, of_type=DagsterEventType.RUN_SUCCESS)) == 1
    media = stack.state / "media" / "r2v" / "w" / "frozen"
    assert [p.parent.name for p in media.glob("*/output.mp4")] == [frozen_run]
