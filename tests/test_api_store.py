"""The API's service store on a real SQLite file: idempotency, races, reconciliation, queue, outbox."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest

from api.settings import ApiConfig
from api.store import IdempotencyConflict, NewJob, Store, UnknownVersion, backoff_delay, payload_hash


@pytest.fixture
def store(tmp_path):
    s = Store(ApiConfig().resolved_database_url(tmp_path / "state"))
    yield s
    s.close()


def _job(job_id=None, *, kind="r2v", work_id="w", shot_id="s1", prompt="a kite", **kw) -> NewJob:
    request = {"work_id": work_id, "shot_id": shot_id, "prompt": prompt}
    return NewJob(
        kind=kind,
        work_id=work_id,
        shot_id=shot_id,
        job_id=job_id,
        request=request,
        payload_hash=payload_hash(request),
        **kw,
    )


def test_default_url_is_a_wal_sqlite_file_under_the_state_dir(tmp_path, store):
    db = tmp_path / "state" / "api" / "service.sqlite"
    assert store.url == f"sqlite:///{db}"
    store.accept(_job())
    assert db.is_file()
    with sqlite3.connect(db) as c:
        assert c.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        tables = {r[0] for r in c.execute("select name from sqlite_master where type='table'")}
    assert {"jobs", "idempotency_keys", "artifacts", "input_assets", "callback_outbox"} <= tables


def test_payload_hash_is_canonical():
    assert payload_hash({"a": 1, "b": [1, 2]}) == payload_hash({"b": [1, 2], "a": 1})
    assert payload_hash({"a": 1}) != payload_hash({"a": 2})


def test_accept_is_idempotent_per_job_id(store):
    first = store.accept(_job("job-1", callback_url="http://cb/x", callback_context={"k": 1}))
    assert first.created and len(first.version_id) == 32
    assert first.job.status == "queued" and first.job.stage == "queued" and first.job.submitted_at is None
    again = store.accept(_job("job-1"))
    assert not again.created and again.version_id == first.version_id
    assert again.job.callback_url == "http://cb/x"
    with pytest.raises(IdempotencyConflict) as e:
        store.accept(_job("job-1", prompt="something else"))
    assert e.value.version_id == first.version_id
    with pytest.raises(IdempotencyConflict):  # same key reused for the other kind
        store.accept(_job("job-1", kind="merge"))
    # No job_id: every request is a new version.
    assert store.accept(_job()).version_id != store.accept(_job()).version_id


def test_concurrent_accepts_with_one_job_id_make_one_version(store):
    results, errors = [], []
    barrier = threading.Barrier(8)

    def submit():
        barrier.wait()
        try:
            results.append(store.accept(_job("race")))
        except Exception as e:  # pragma: no cover - the assertion below shows it
            errors.append(e)

    threads = [threading.Thread(target=submit) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len({r.version_id for r in results}) == 1
    assert sum(r.created for r in results) == 1
    assert store.counts_by_status("r2v")["queued"] == 1


def test_unsubmitted_then_submitted_and_following_retries(store):
    a = store.accept(_job("a")).version_id
    b = store.accept(_job("b")).version_id
    assert [j.version_id for j in store.unsubmitted()] == [a, b]
    assert store.mark_submitted(a, "run-1")
    assert not store.mark_submitted(a, "run-other")  # already submitted: kept
    assert [j.version_id for j in store.unsubmitted()] == [b]
    assert [j.version_id for j in store.unfinished()] == [a]
    job = store.get(a)
    assert job.run_id == job.root_run_id == "run-1" and job.submitted_at is not None
    job = store.follow_run(a, "run-2")
    assert job.run_id == "run-2" and job.root_run_id == "run-1"
    assert store.by_run_id("run-2").version_id == a
    assert store.by_run_id("run-1").version_id == a
    assert store.get("nope") is None
    with pytest.raises(UnknownVersion):
        store.mark_submitted("nope", "r")


def test_status_updates_and_queue_positions(store):
    ids = [store.accept(_job(shot_id=f"s{i}")).version_id for i in range(3)]
    merge = store.accept(_job(kind="merge", shot_id=None)).version_id
    assert [store.queue_position(v) for v in ids] == [1, 2, 3]
    assert store.queue_position(merge) == 1  # its own kind's queue
    store.update_status(ids[0], status="running", stage="claimed")
    assert store.queue_position(ids[0]) is None
    assert [store.queue_position(v) for v in ids[1:]] == [1, 2]
    done = store.update_status(ids[0], status="succeeded", stage="succeeded", result={"video": "x.mp4"})
    assert done.finished_at is not None and done.result == {"video": "x.mp4"} and done.error is None
    # A finished job does not move back (a stale poll cannot resurrect it).
    assert store.update_status(ids[0], status="running").status == "succeeded"
    failed = store.update_status(ids[1], status="failed", stage="failed", error="boom")
    assert failed.error == "boom"
    assert store.queue_position(ids[2]) == 1
    assert store.counts_by_status("r2v") == {"queued": 1, "running": 0, "succeeded": 1, "failed": 1}
    assert store.counts_by_status("merge") == {"queued": 1, "running": 0, "succeeded": 0, "failed": 0}
    with pytest.raises(ValueError):
        store.update_status(ids[2], status="exploded")


def test_newest_succeeded_shot(store):
    assert store.newest_succeeded_shot("w", "s1") is None
    old = store.accept(_job(shot_id="s1")).version_id
    store.update_status(old, status="succeeded")
    time.sleep(0.01)
    new = store.accept(_job(shot_id="s1", prompt="v2")).version_id
    store.update_status(new, status="succeeded")
    later_failed = store.accept(_job(shot_id="s1", prompt="v3")).version_id
    store.update_status(later_failed, status="failed")
    store.accept(_job(shot_id="s1", prompt="v4"))  # queued
    other_work = store.accept(_job(work_id="other", shot_id="s1")).version_id
    store.update_status(other_work, status="succeeded")
    assert store.newest_succeeded_shot("w", "s1").version_id == new
    assert store.newest_succeeded_shot("w", "s2") is None


def test_artifacts_and_input_assets(store):
    v = store.accept(_job("art")).version_id
    a = store.add_artifact(
        v,
        kind="video",
        role="output",
        path="r2v/w/s1/run/output.mp4",
        url_path="/media/r2v/w/s1/run/output.mp4",
        bytes=123,
        sha256="ab" * 32,
        metadata={"frames": 17},
    )
    assert (a.work_id, a.shot_id, a.metadata) == ("w", "s1", {"frames": 17})
    again = store.add_artifact(v, kind="video", role="output", path=a.path, url_path=a.url_path)
    assert again.artifact_id == a.artifact_id  # idempotent per (version, path)
    store.add_artifact(v, kind="image", role="thumbnail", path="r2v/w/s1/run/thumb.png", url_path="/m/t.png")
    assert [x.role for x in store.artifacts_for(v)] == ["output", "thumbnail"]
    assert store.get_artifact(a.artifact_id) == a
    assert store.get_artifact("missing") is None
    with pytest.raises(UnknownVersion):
        store.add_artifact("missing", kind="video", role="output", path="p", url_path="/p")

    rec = store.put_input_asset("cd" * 32, "cd/cdcd.png", "image/png", 10)
    assert store.put_input_asset("cd" * 32, "elsewhere.png", "image/png", 10) == rec
    assert store.get_input_asset("cd" * 32).path == "cd/cdcd.png"


def test_callback_outbox_schedule(store):
    v = store.accept(_job("cb")).version_id
    t0 = 1_000_000.0
    d = store.enqueue_callback(v, "http://cb/hook", {"status": "succeeded"}, now=t0)
    assert store.enqueue_callback(v, "http://cb/other", {"status": "x"}, now=t0) == d  # one per job
    assert [x.delivery_id for x in store.due_callbacks(t0)] == [d]
    assert store.due_callbacks(t0 - 1) == []

    retry_at = t0 + backoff_delay(1, 2.0)
    rec = store.record_attempt(d, ok=False, error="HTTP 500", next_attempt_at=retry_at, now=t0)
    assert (rec.status, rec.attempts, rec.last_error) == ("pending", 1, "HTTP 500")
    assert store.due_callbacks(t0 + 1) == []
    assert [x.delivery_id for x in store.due_callbacks(retry_at)] == [d]
    rec = store.record_attempt(d, ok=True, now=retry_at)
    assert (rec.status, rec.attempts, rec.delivered_at) == ("delivered", 2, retry_at)
    assert store.due_callbacks(retry_at + 100) == []

    v2 = store.accept(_job("cb2")).version_id
    d2 = store.enqueue_callback(v2, "http://cb/hook", {}, now=t0)
    assert store.record_attempt(d2, ok=False, error="refused", now=t0).status == "gave_up"
    assert store.callback_for(v2).status == "gave_up"
    assert [backoff_delay(n, 2.0) for n in (1, 2, 3)] == [2.0, 4.0, 8.0]
    assert backoff_delay(50, 2.0) == 300.0


def test_store_survives_reopen(tmp_path):
    url = ApiConfig().resolved_database_url(tmp_path)
    s1 = Store(url)
    v = s1.accept(_job("persist")).version_id
    s1.enqueue_callback(v, "http://cb", {"a": 1}, now=0.0)
    s1.close()
    s2 = Store(url)
    try:
        assert s2.accept(_job("persist")).version_id == v
        assert [j.version_id for j in s2.unsubmitted()] == [v]
        assert len(s2.due_callbacks(1.0)) == 1
    finally:
        s2.close()


def test_api_config_defaults_and_urls(tmp_path):
    cfg = ApiConfig()
    assert (cfg.host, cfg.port, cfg.max_queue, cfg.callback_max_attempts) == ("127.0.0.1", 8221, 100, 8)
    assert cfg.base_url() == "http://127.0.0.1:8221"
    assert ApiConfig(host="0.0.0.0", port=9000).base_url() == "http://127.0.0.1:9000"
    assert ApiConfig(public_url="https://api.example/").base_url() == "https://api.example"
    assert (
        ApiConfig(database_url="postgresql://u@h/db").resolved_database_url(tmp_path) == "postgresql://u@h/db"
    )
    assert cfg.inputs.max_bytes == 50 * 1024 * 1024 and cfg.inputs.max_pixels == 4096 * 4096
    policy = ApiConfig.model_validate({"inputs": {"allowed_roots": ["refs", "/abs"]}}).inputs.resolved(
        tmp_path
    )
    assert policy.allowed_roots == [(tmp_path / "refs").resolve(), Path("/abs")]
    with pytest.raises(ValueError):
        ApiConfig.model_validate({"inputs": {"fetch_url": True}})  # extra keys are refused
