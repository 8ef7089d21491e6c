"""A full disk: a small tmpfs the test mounts (root only; skipped with the reason elsewhere).

Under the media root: a shot accepted while there was room fails when its MP4 cannot be written,
with the path and the room left in its error, and nothing half-written is kept or served;
meanwhile new work is refused with 507 in both dialects and /health says which disk; once space is
freed, the service takes work again by itself.

Under the state directory (the service's store and Dagster's storage on SQLite, the step outputs):
the shot running waits at its next write until there is room again and goes on, run once; nobody
takes the worker's silence for its death meanwhile."""

from __future__ import annotations

import io
import os
import time
from pathlib import Path

import pytest

from shotloom import stages

from api_stack import start_api_stack, stop_api_stack, wait_for
from conftest import fill, small_disk_at

MIN_FREE_MB = 2


@pytest.fixture(scope="module")
def small_disk(tmp_path_factory):
    with small_disk_at(tmp_path_factory.mktemp("small-disk"), "16m") as path:
        yield path


@pytest.fixture(scope="module")
def stack(tmp_path_factory, wan_checkpoint, small_disk):
    root = tmp_path_factory.mktemp("disk-full")
    s = start_api_stack(
        root, wan_checkpoint, in_process=True, media_root=str(small_disk), api={"min_free_mb": MIN_FREE_MB}
    )
    yield s
    stop_api_stack(s)


def shot(n: int) -> dict:
    return {"work_id": "disk", "shot_id": f"s{n}", "prompt": f"shot {n}", "memory_slots": [], "seed": n}


def test_a_full_media_disk_fails_the_write_cleanly_refuses_new_work_and_recovers(stack, small_disk):
    accepted = stack.post("/r2v", shot(1))
    assert accepted.status_code == 202, accepted.text
    version = accepted.json()["version_id"]
    filler = fill(small_disk)  # the disk fills up while the shot is generated

    failed = stack.wait_version(version)
    assert failed["status"] == "failed", failed
    assert "no space left to write" in failed["error"] and "output.mp4" in failed["error"], failed["error"]
    # Nothing half-written kept, indexed or served.
    assert failed.get("video_url") is None and not failed.get("artifacts"), failed
    leftovers = [p for p in small_disk.rglob("*") if p.is_file() and p != filler]
    assert not [p for p in leftovers if p.suffix in (".mp4", ".part") or p.name.endswith(".part")], leftovers

    # The service says why and refuses new work in both dialects, before queueing anything.
    health = stack.get("/health")
    assert health.status_code == 503 and health.json()["ready"]["disk"] is False, health.text
    media = next(d for d in health.json()["disk"] if d["name"] == "media_root")
    assert media["ok"] is False and media["free_bytes"] < MIN_FREE_MB << 20
    refused = stack.post("/r2v", shot(2))
    assert refused.status_code == 507, refused.text
    assert "media_root" in refused.json()["error"] and "min_free_mb" in refused.json()["error"]
    v1 = stack.client.post(stack.base + "/v1/videos", json={"prompt": "a kite"})
    assert v1.status_code == 507 and v1.json()["error"]["code"] == "insufficient_storage", v1.text
    counts = stack.get("/health").json()["queues"]["r2v"]
    assert (counts["queued"], counts["running"], counts["failed"]) == (0, 0, 1)

    # Space is back: the service goes on by itself.
    os.unlink(filler)
    wait_for(lambda: stack.get("/health").status_code == 200, 30, "/health ok again")
    again = stack.post("/r2v", shot(2))
    assert again.status_code == 202, again.text
    done = stack.wait_version(again.json()["version_id"])
    assert done["status"] == "succeeded", done

    import av

    path = next(small_disk.rglob("output.mp4"))
    with av.open(str(path)) as container:
        assert sum(1 for _ in container.decode(video=0)) == done["result"]["frames"] > 0


# -- the state directory: the stores and Dagster's storage (SQLite), the step outputs, the logs ------
HEARTBEAT_TIMEOUT_S = 4


@pytest.fixture(scope="module")
def state_stack(tmp_path_factory, wan_checkpoint):
    """The whole service (worker processes) with its state directory on a small tmpfs of its own."""
    root = tmp_path_factory.mktemp("state-full")
    with small_disk_at(root / "state", "32m") as state:
        s = start_api_stack(
            root,
            wan_checkpoint,
            workers=1,
            media_root=str(root / "media"),
            api={"min_free_mb": MIN_FREE_MB},
            sampler={"mode": "native", "steps": 4, "guidance_scale": 4.0},
            runtime={"heartbeat_timeout_seconds": HEARTBEAT_TIMEOUT_S},
        )
        yield s, state
        stop_api_stack(s)


@pytest.mark.slow  # the whole service, timed by its heartbeats: run alone
def test_a_full_state_disk_pauses_the_running_shot_refuses_new_work_and_it_goes_on_once_freed(state_stack):
    stack, state = state_stack
    accepted = stack.post("/r2v", {**shot(1), "num_inference_steps": 40})
    assert accepted.status_code == 202, accepted.text
    version = accepted.json()["version_id"]
    wait_for(
        lambda: stack.get(f"/version/{version}").json().get("stage") == stages.INFERRING,
        60,
        "the shot to be denoised",
        interval=0.1,
    )
    filler = fill(state)  # Dagster's storage, the service's store, the step outputs: no room

    # Longer than the heartbeat timeout: nobody may judge the worker dead (its beats cannot be
    # written either) and run the shot a second time elsewhere.
    time.sleep(3 * HEARTBEAT_TIMEOUT_S)
    health = stack.get("/health")
    assert health.status_code == 503 and health.json()["ready"]["disk"] is False, health.text
    disk = next(d for d in health.json()["disk"] if d["name"] == "state_dir")
    assert disk["ok"] is False, disk
    refused = stack.post("/r2v", shot(2))
    assert refused.status_code == 507, refused.text
    assert "state_dir" in refused.json()["error"], refused.text
    during = stack.get(f"/version/{version}").json()
    assert during["status"] == "running", during  # neither failed nor lost: waiting for room

    os.unlink(filler)
    done = stack.wait_version(version)
    worker_log = (state / "logs" / "worker-cpu-0.log").read_text(errors="replace")
    assert done["status"] == "succeeded", (done["stage"], done["error"], worker_log[-3000:])
    # Exactly once: one run, each step of it once (its denoise was not started again).
    [run] = [r for r in stack.runs_of(version) if r.job_name == "r2v"]
    assert run.status == "SUCCESS", run
    steps = step_successes(state, run.run_id)
    assert steps == {"condition_op": 1, "denoise_op": 1, "decode_op": 1, "write_op": 1}, steps
    import av

    mp4 = stack.client.get(done["video_url"])
    assert mp4.status_code == 200, mp4.text
    with av.open(io.BytesIO(mp4.content)) as container:
        assert sum(1 for _ in container.decode(video=0)) == done["result"]["frames"] > 0

    wait_for(lambda: stack.get("/health").status_code == 200, 30, "/health ok again")
    again = stack.post("/r2v", shot(2))
    assert again.status_code == 202, again.text
    assert stack.wait_version(again.json()["version_id"])["status"] == "succeeded"


def step_successes(state: Path, run_id: str) -> dict[str, int]:
    """How many times each step of the run succeeded, in Dagster's event log under ``state``."""
    from collections import Counter

    from dagster import DagsterEventType, DagsterInstance

    with DagsterInstance.from_config(str(state / "dagster_home")) as instance:
        records = instance.get_records_for_run(run_id, of_type=DagsterEventType.STEP_SUCCESS).records
    return dict(Counter(r.event_log_entry.step_key for r in records))
