"""kill -9 of the whole service while jobs are queued and running, then a start on the same state.

Every accepted job completes, a finished job is neither rerun nor changed, its pending callback is
delivered after the restart, and a job that was accepted but never submitted (the process died
between answering and submitting) is submitted at start.
"""

from __future__ import annotations

import pytest
import yaml

from api.core.jobs import JobService
from api.dagster import DagsterGateway
from api.r2v.protocol import R2VRequest
from api.store import Store
from contracts.tags import VERSION_TAG
from settings.api import ApiConfig

from api_stack import kill_everything, launch, wait_for, wait_ready, write_server_yaml
from test_api_http import Receiver, shot

pytestmark = pytest.mark.slow


def test_kill_9_of_everything_loses_nothing_and_reruns_nothing(tmp_path, wan_checkpoint):
    receiver = Receiver(refuse=10_000)  # down until the restart
    config, state = write_server_yaml(tmp_path, wan_checkpoint, api={"callback_backoff_seconds": 0.2})
    settings = yaml.safe_load(config.read_text())
    stack = wait_ready(launch(config, state))
    try:
        done = stack.post("/r2v", shot("a", job_id="a-v1", callback_url=receiver.url)).json()["version_id"]
        before = stack.wait_version(done)
        assert before["status"] == "succeeded"
        wait_for(lambda: receiver.attempts, 30, "a first (refused) callback attempt")

        # Longer jobs, more than the two workers: a /v1 video and an r2v shot running at the kill,
        # the rest queued (/v1 videos are the same durable jobs as r2v shots).
        at_kill = {"prompt": "v1 at the kill", "size": "96x96", "seconds": "2"}
        running = stack.post("/v1/videos", at_kill).json()
        long = {"num_frames": 33, "width": 96, "height": 96}
        pending = [stack.post("/r2v", shot(f"p{i}", **long)).json()["version_id"] for i in range(4)]
        videos = [
            stack.post("/v1/videos", {"prompt": f"v1 clip {i}", "size": "64x64", "seconds": "1"}).json()
            for i in range(2)
        ]
        pending += [v["shotloom"]["version_id"] for v in videos]
        wait_for(
            lambda: (
                stack.get(f"/version/{pending[0]}").json()["status"] == "running"
                and stack.get(f"/v1/videos/{running['id']}").json()["status"] == "in_progress"
            ),
            60,
            "a running /v1 video and a running r2v shot",
        )
        assert stack.get(f"/v1/videos/{running['id']}").json()["status"] == "in_progress"  # at the kill
        kill_everything(stack)
        videos.insert(0, running)
        pending.insert(0, running["shotloom"]["version_id"])

        # Accepted while the service was down, as if the API died between answering and submitting.
        api_cfg = ApiConfig.model_validate(settings["api"])
        store = Store(api_cfg.resolved_database_url(state))
        orphan = JobService(store, api_cfg, state, state / "media").accept_shot(
            R2VRequest.model_validate(shot("orphan")).to_spec()
        )
        store.close()

        receiver.refuse = 0
        stack = wait_ready(launch(config, state))
        for vid in [*pending, orphan.job.version_id]:
            assert stack.wait_version(vid, timeout=240)["status"] == "succeeded", vid
        statuses = [stack.get(f"/version/{v}").json() for v in pending]
        # The runs the kill interrupted were put back in the FIFO, visibly.
        assert any("recovered" in s["stage_times"] for s in statuses), statuses
        assert "recovered" in statuses[0]["stage_times"], statuses[0]  # the /v1 video running at the kill

        for video in videos:  # completed, not failed with server_restarted
            body = stack.get(f"/v1/videos/{video['id']}").json()
            assert body["status"] == "completed" and body["progress"] == 100, body
            assert stack.get(f"/v1/videos/{video['id']}/content").headers["content-type"] == "video/mp4"

        after = stack.get(f"/version/{done}").json()
        for key in ("status", "run_id", "video_url", "artifacts", "finished_at"):
            assert after[key] == before[key], key
        gateway = DagsterGateway("127.0.0.1", settings["webserver"]["port"])
        # never run twice: its generation, then its stills on the media worker, once each
        jobs = sorted(r.job_name for r in gateway.find_runs_by_tag(VERSION_TAG, done))
        assert jobs == ["r2v", "shot_stills"]
        for vid in [*pending, orphan.job.version_id]:
            runs = gateway.find_runs_by_tag(VERSION_TAG, vid)
            assert [r.status for r in runs if r.job_name == "shot_stills"] == ["SUCCESS"], vid
            roots = [r for r in runs if not r.root_run_id and r.job_name == "r2v"]
            # Run once (retries keep the root's id). A submit the kill cut short can leave a run
            # created but never enqueued: the follower cancels it (never started) and submits anew.
            # (Dagster stamps a start time on a run canceled before it started, so go by status.)
            seen = [(r.run_id, r.status, r.creation_time, r.start_time) for r in roots]
            assert [r.status for r in roots if r.status != "CANCELED"] == ["SUCCESS"], (vid, seen)

        wait_for(
            lambda: any(d["body"]["remote_task_id"] == done for d in receiver.delivered), 30, "a callback"
        )
        ids = {a["delivery_id"] for a in receiver.attempts if a["body"]["remote_task_id"] == done}
        assert len(ids) == 1  # the same durable delivery, retried across the restart
    finally:
        receiver.close()
        kill_everything(stack)
