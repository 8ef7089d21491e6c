"""The operator's routes answer in their own terms: a re-render batch that meets a full queue is
429 with Retry-After (the trigger waits and tries again), not a server error, and queues nothing."""

from __future__ import annotations

from bare_api import bare_app

from api.store import NewJob
from settings.api import ApiConfig

SHOT = {"work_id": "w", "shot_id": "s", "prompt": "a kite"}


def test_a_rerender_that_meets_a_full_queue_is_429_with_retry_after(tmp_path):
    client, ctx = bare_app(tmp_path, api=ApiConfig(max_queue=1))
    store = ctx.store
    request = {"job_name": "r2v", "run_config": {"ops": {"condition_op": {"config": SHOT}}}}
    done = store.accept(NewJob(kind="r2v", work_id="w", shot_id="s", request=request, payload_hash="a")).job
    store.update_status(done.version_id, status="succeeded", stage="succeeded", result={"run_id": "r"})
    store.accept(
        NewJob(kind="r2v", work_id="w", shot_id="t", request=request, payload_hash="b")
    )  # the one slot

    resp = client.post("/queue/rerender", json={"works": ["w"], "shots": ["s"], "key": "nightly-1"})
    assert resp.status_code == 429, resp.text
    assert int(resp.headers["Retry-After"]) >= 1
    assert resp.json()["error"].startswith("the r2v queue is full")
    assert store.counts_by_status("r2v")["queued"] == 1  # nothing queued by the refused batch
    store.close()
