"""One job across a group of devices (#23 point 3): a device worker that owns two CPU ranks (gloo,
Ulysses 2) beside a one-device worker, in the real service. The group is one slot in the run
queue; its shots are byte-identical to the one-device worker's for the same seed; the queue stays
FIFO and exactly-once across both; kill -9 of the group's second rank restarts the whole group and
the run it was on resumes and succeeds."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest
import yaml

from contracts.tags import WORKER_TAG
from orchestration.launcher import read_workers
from shotloom.families.wan import WanAdapter

from api_stack import launch, stop_api_stack, wait_for, wait_ready
from conftest import free_port, write_inference_yaml, write_server_yaml

pytestmark = pytest.mark.slow

GROUP, SINGLE = "cpu-g0-1", "cpu-0"
SHOT = {"work_id": "film", "prompt": "a red kite over the sea", "seed": 11, "memory_slots": []}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    root = tmp_path_factory.mktemp("group")
    # Wan T2V: its DiT has diffusers' context-parallel plan (VACE's has none).
    checkpoint = WanAdapter.build_tiny_checkpoint(root / "t2v", shape="t2v")
    sampler = {"mode": "native", "steps": 3, "guidance_scale": 4.0}
    inference = write_inference_yaml(
        root / "inference.yaml", "wan", checkpoint, root / "cache", sampler=sampler
    )
    state = root / "state"
    state.mkdir()
    devices = [
        {"device": "cpu", "threads": 1},
        {
            "device": "cpu",
            "threads": 1,
            "ids": [0, 1],
            "parallel": {"ulysses": 2, "collective_timeout_s": 120},
        },
    ]
    config = write_server_yaml(
        root / "server.yaml", state, free_port(), inference, api={"host": "127.0.0.1", "port": free_port()}
    )
    data = yaml.safe_load(config.read_text())
    data["workers"] = {"warm": True, "devices": devices, "media": 1}
    config.write_text(yaml.safe_dump(data))
    api = wait_ready(launch(config, state), timeout=240)
    yield api
    stop_api_stack(api)


def worker_status(stack, name: str) -> dict:
    [record] = [w for w in read_workers(stack.state, "device") if w.name == name]
    return httpx.get(record.url + "/status", timeout=5).json()


def group_ready(stack) -> dict:
    """The group's status once it is idle: a group that just restarted answers while it warms (its
    ranks loading the model), and a run submitted meanwhile goes to the other worker."""

    def idle():
        try:
            status = worker_status(stack, GROUP)
        except (httpx.HTTPError, ValueError):
            return None
        return status if status["state"] == "idle" else None

    return wait_for(idle, 240, "the group idle (warmed)", interval=0.2)


def submit(stack, shot_id: str, **changes) -> str:
    resp = stack.post("/r2v", {**SHOT, "shot_id": shot_id, **changes})
    assert resp.status_code == 202, resp.text
    return resp.json()["version_id"]


def wait_for_group_busy(stack, versions: list[str], timeout: float = 120) -> dict:
    """The group's status once it is on a run; on a timeout, what both workers and the submitted
    jobs were doing, then the log lines about those jobs' runs (on a slower machine, the only
    way to learn why)."""

    def group_busy():
        status = worker_status(stack, GROUP)
        return status if status["state"] == "busy" and status["run_id"] else None

    def explain() -> str:
        keys = ("state", "boot_id", "run_id", "pending_run_id", "runs_done", "group")
        facts = [f"{n}: { {k: worker_status(stack, n).get(k) for k in keys} }" for n in (GROUP, SINGLE)]
        # What the launcher goes by: each record's boot id and the age of its heartbeat.
        facts += [
            f"record {r.name}: boot {r.boot_id} beat {time.time() - r.heartbeat:.1f} s ago"
            for r in read_workers(stack.state, "device")
        ]
        runs = []
        for v in versions:
            body = stack.get(f"/version/{v}").json()
            facts.append(f"job {v}: {body.get('status')}/{body.get('stage')} run={body.get('run_id')}")
            for r in stack.runs_of(v):
                facts.append(f"  run {r.run_id} {r.job_name} {r.status} on {r.tags.get(WORKER_TAG)}")
                runs.append(r.run_id)
        for path in sorted((Path(stack.state) / "logs").glob("*.log")):
            lines = path.read_text(errors="replace").splitlines()
            needles = [*runs, "ERROR", "heartbeat", "Traceback"]
            hits = [x[:300] for x in lines if any(n in x for n in needles) and "denoise step" not in x]
            facts += [f"--- {path.name}", *hits[-12:], *lines[-3:]]
        return "\n".join(facts)

    return wait_for(group_busy, timeout, "the group to take a run", interval=0.1, explain=explain)


def video_sha(done: dict) -> str:
    [video] = [a for a in done["artifacts"] if a["kind"] == "video"]
    return video["sha256"]


def test_a_group_is_one_slot_and_makes_the_same_shot_as_one_device(stack):
    group = group_ready(stack)
    assert group["group"]["ranks"] == 2 and group["group"]["dead_ranks"] == []
    assert worker_status(stack, SINGLE)["group"] is None
    health = {w["name"]: w for w in stack.get("/health").json()["inference"]["workers"]}
    assert health[GROUP]["ready"] and health[GROUP]["group"]["parallel"] == {
        "ulysses": 2,
        "ring": 1,
        "collective_timeout_s": 120,  # the YAML's, reaching the ranks
    }
    assert health[SINGLE]["ready"] and health[SINGLE]["group"] is None

    versions = [submit(stack, f"s{i}") for i in range(6)]
    done = [stack.wait_version(v, timeout=240) for v in versions]
    assert [d["status"] for d in done] == ["succeeded"] * 6, done
    # Same request, same seed: the same bytes, whichever worker (one device or two ranks) made it.
    assert len({video_sha(d) for d in done}) == 1
    workers = []
    for v in versions:  # exactly once: one run each, succeeded
        runs = [r for r in stack.runs_of(v) if r.job_name == "r2v"]  # not its stills' run
        assert [r.status for r in runs] == ["SUCCESS"], runs
        workers.append(runs[0].tags[WORKER_TAG])
    assert set(workers) == {GROUP, SINGLE}, workers  # both slots took runs
    claimed = [d["stage_times"]["claimed"] for d in done]
    assert claimed == sorted(claimed)  # FIFO across the two slots


def test_kill_9_of_a_rank_restarts_the_group_and_the_run_resumes(stack):
    before = group_ready(stack)
    # Long enough to be caught mid-denoise on the group (two jobs: each worker takes one).
    slow = {"num_inference_steps": 60, "num_frames": 33}
    versions = [submit(stack, f"long{i}", **slow) for i in range(2)]

    busy = wait_for_group_busy(stack, versions)
    time.sleep(0.5)  # into the denoise
    os.kill(busy["group"]["follower_pids"][0], signal.SIGKILL)

    def restarted():
        try:
            status = worker_status(stack, GROUP)
        except (httpx.HTTPError, ValueError):
            return None
        return status if status["boot_id"] != before["boot_id"] else None

    after = wait_for(restarted, 120, "the group to restart", interval=0.5)
    assert after["group"]["follower_pids"] != busy["group"]["follower_pids"]
    done = [stack.wait_version(v, timeout=300) for v in versions]
    assert [d["status"] for d in done] == ["succeeded"] * 2, [(d["status"], d.get("error")) for d in done]
    assert video_sha(done[0]) == video_sha(done[1])  # same seed and request: same bytes
    interrupted = next(v for v in versions if busy["run_id"] in {r.run_id for r in stack.runs_of(v)})
    assert any(r.status == "SUCCESS" for r in stack.runs_of(interrupted) if r.job_name == "r2v")
    log = (Path(stack.state) / "logs" / f"worker-{GROUP}.log").read_text()
    assert "of its group died or fell out of step" in log


def test_a_run_cancelled_mid_denoise_stops_every_rank_and_the_group_goes_on(stack):
    before = group_ready(stack)
    versions = [submit(stack, f"cancel{i}", num_inference_steps=60, num_frames=33) for i in range(2)]

    run_id = wait_for_group_busy(stack, versions)["run_id"]
    time.sleep(0.5)
    assert stack.gateway().terminate(run_id)
    victim = next(v for v in versions if run_id in {r.run_id for r in stack.runs_of(v)})
    done = stack.wait_version(victim, timeout=120)
    assert done["status"] == "failed" and done["stage"] == "canceled", done
    # Every rank left the denoise together: the same group (no restart) makes the next shot.
    after = stack.wait_version(submit(stack, "after-cancel"), timeout=120)
    assert after["status"] == "succeeded", after
    status = worker_status(stack, GROUP)
    assert status["boot_id"] == before["boot_id"] and status["group"]["dead_ranks"] == []
    other = next(v for v in versions if v != victim)
    assert stack.wait_version(other, timeout=120)["status"] == "succeeded"


def test_kill_9_of_rank_0_takes_its_ranks_down_and_the_group_comes_back(stack):
    import psutil

    before = group_ready(stack)
    followers = before["group"]["follower_pids"]
    # Two jobs: each worker takes one.
    versions = [submit(stack, f"rank0-{i}", num_inference_steps=60, num_frames=33) for i in range(2)]

    wait_for_group_busy(stack, versions)
    os.kill(before["pid"], signal.SIGKILL)

    # Its ranks die with it (no orphan holds a device or waits in a collective) ...
    def running(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    wait_for(lambda: not any(running(p) for p in followers), 30, "the old ranks to exit")

    def restarted():
        try:
            status = worker_status(stack, GROUP)
        except (httpx.HTTPError, ValueError):
            return None
        return status if status["boot_id"] != before["boot_id"] and status["state"] != "starting" else None

    after = wait_for(restarted, 120, "the group to restart", interval=0.5)
    assert after["group"]["ranks"] == 2 and after["group"]["dead_ranks"] == []
    done = [stack.wait_version(v, timeout=300) for v in versions]  # ... and the run resumes
    assert [d["status"] for d in done] == ["succeeded"] * 2, [(d["status"], d.get("error")) for d in done]
