"""The operator's routes answer in their own terms: a re-render batch that meets a full queue is
429 with Retry-After (the trigger waits and tries again), not a server error, and queues nothing."""

from __future__ import annotations

from fastapi.testclient import TestClient

from api.app import create_app
from api.background import Background
from api.context import ApiContext
from api.core.jobs import JobService
from api.dagster import DagsterGateway
from api.store import NewJob, Store
from settings.api import ApiConfig
from shotloom.config import REPO_ROOT, load_inference_config

SHOT = {"work_id": "w", "shot_id": "s", "prompt": "a kite"}


def test_a_rerender_that_meets_a_full_queue_is_429_with_retry_after(tmp_path):
    api = ApiConfig(max_queue=1)
    store = Store(f"sqlite:///{tmp_path / 's.sqlite'}")
    gateway = DagsterGateway("127.0.0.1", 9)  # nothing listens: no Dagster is needed here
    inference = load_inference_config(REPO_ROOT / "configs" / "inference.wan-tiny.yaml")
    ctx = ApiContext(
        api=api,
        store=store,
        gateway=gateway,
        background=Background(store, gateway, api, registry=None),
        jobs=JobService(store, api, tmp_path / "state", tmp_path / "media"),
        media_root=tmp_path / "media",
        worker_names=[],
        inference_config="configs/inference.wan-tiny.yaml",
        inference=inference,
        residency_policy="auto",
    )
    request = {"job_name": "r2v", "run_config": {"ops": {"condition_op": {"config": SHOT}}}}
    done = store.accept(NewJob(kind="r2v", work_id="w", shot_id="s", request=request, payload_hash="a")).job
    store.update_status(done.version_id, status="succeeded", stage="succeeded", result={"run_id": "r"})
    store.accept(
        NewJob(kind="r2v", work_id="w", shot_id="t", request=request, payload_hash="b")
    )  # the one slot
    client = TestClient(create_app(ctx))

    resp = client.post("/queue/rerender", json={"works": ["w"], "shots": ["s"], "key": "nightly-1"})
    assert resp.status_code == 429, resp.text
    assert int(resp.headers["Retry-After"]) >= 1
    assert resp.json()["error"].startswith("the r2v queue is full")
    assert store.counts_by_status("r2v")["queued"] == 1  # nothing queued by the refused batch
    store.close()
