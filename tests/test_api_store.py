"""The API's service store on a real SQLite file and on a real (throwaway) PostgreSQL server: idempotency,
races, reconciliation, queue, outbox. Every ``store``/``db_url`` test runs once per backend."""

from __future__ import annotations

import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest

from api.store import IdempotencyConflict, NewJob, Store, UnknownVersion, backoff_delay, payload_hash
from api.store import jobs as store_module
from settings.api import ApiConfig

import pg


@pytest.fixture(scope="module")
def pg_server():
    """One throwaway PostgreSQL cluster for this module (skipped where initdb/pg_ctl are missing)."""
    reason = pg.missing_reason()
    if reason:
        pytest.skip(reason)
    server = pg.start()
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path) -> str:
    """A fresh, empty store URL: the default SQLite file, or a new schema on the test PostgreSQL."""
    if request.param == "sqlite":
        return ApiConfig().resolved_database_url(tmp_path / "state")
    return request.getfixturevalue("pg_server").fresh_url()


@pytest.fixture
def store(db_url):
    s = Store(db_url)
    yield s
    s.close()


@pytest.fixture
def sqlite_store(tmp_path):
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


def test_default_url_is_a_wal_sqlite_file_under_the_state_dir(tmp_path, sqlite_store):
    db = tmp_path / "state" / "api" / "service.sqlite"
    assert sqlite_store.url == f"sqlite:///{db}"
    sqlite_store.accept(_job())
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
    assert store.unfinished_runs() == {"run-1": a}  # what the follower polls, without the rows
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
    assert store.counts_by_status("r2v") == {
        "queued": 1,
        "running": 0,
        "succeeded": 1,
        "failed": 1,
        "cancelled": 0,
    }
    assert store.counts_by_status("merge") == {
        "queued": 1,
        "running": 0,
        "succeeded": 0,
        "failed": 0,
        "cancelled": 0,
    }
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


def test_a_claimed_callback_attempt_is_nobody_elses_until_its_lease_ends(store):
    t0 = 2_000_000.0
    v = store.accept(_job("claim")).version_id
    d = store.enqueue_callback(v, "http://cb/hook", {}, now=t0)
    assert store.claim_callbacks([], t0 + 40, now=t0) == []
    [claimed] = store.claim_callbacks([d], t0 + 40, now=t0)
    assert (claimed.delivery_id, claimed.attempts) == (d, 0)
    assert store.claim_callbacks([d], t0 + 40, now=t0 + 1) == []  # taken: another process gets none
    assert store.due_callbacks(t0 + 39) == []
    # The process that claimed it died mid-attempt: due again when the lease ends.
    assert [x.delivery_id for x in store.claim_callbacks([d], t0 + 80, now=t0 + 40)] == [d]
    store.record_attempt(d, ok=True, now=t0 + 41)
    assert store.claim_callbacks([d], t0 + 200, now=t0 + 100) == []  # delivered: never again


def test_a_jobs_outcome_and_its_callback_are_recorded_together_or_not_at_all(store):
    v = store.accept(_job("outcome", callback_url="http://cb/hook")).version_id

    def broken(_job):  # the process or the database failing between the two writes
        raise ConnectionError("gone")

    with pytest.raises(ConnectionError):
        store.update_status(v, status="succeeded", callback=broken)
    assert store.get(v).status == "queued" and store.callback_for(v) is None  # neither
    record = store.update_status(v, status="succeeded", callback=lambda job: {"status": job.status})
    assert record.status == "succeeded" and store.callback_for(v).payload == {"status": "succeeded"}
    # Once: a later change of the finished job queues nothing more.
    store.update_status(v, status="succeeded", stage="done", callback=lambda job: {"again": True})
    assert store.callback_for(v).payload == {"status": "succeeded"}
    no_hook = store.accept(_job("no-hook")).version_id
    store.update_status(no_hook, status="failed", callback=lambda job: {"x": 1})
    assert store.callback_for(no_hook) is None  # it asked for none


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


def test_store_survives_reopen(db_url):
    url = db_url
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


# -- what differs between SQLite and PostgreSQL: row locks, JSON, 64-bit sizes, collation, races -----


def _together(n: int, fn):
    """Run ``fn(i)`` for i in 0..n-1 on n threads released at once; their results in order."""
    barrier = threading.Barrier(n)

    def call(i):
        barrier.wait()
        return fn(i)

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(call, range(n)))


def test_live_column_round_trips_and_is_kept(store):
    v = store.accept(_job("live")).version_id
    assert store.get(v).live is None
    live = {
        "run_status": "STARTED",
        "stage_times": {"claimed": 1_700_000_000.125, "denoise": 1_700_000_012.5},
        "progress": {"step": 3, "steps": 8, "fraction": 0.375},
        "worker": {"name": "w0", "device": "cuda:0", "tags": ["warm", "ünïcode ✓"]},
        "empty": None,
    }
    rec = store.update_status(v, status="running", stage="denoise", live=live)
    assert rec.live == live and store.get(v).live == live
    kept = store.update_status(v, stage="decode")  # live left out: kept
    assert (kept.stage, kept.live) == ("decode", live)
    assert store.update_status(v, live={"run_status": "STARTED"}).live == {"run_status": "STARTED"}
    assert store.update_status(v, live=None).live is None
    assert store.get(v).live is None


def test_idempotent_version(store):
    assert store.idempotent_version("nope") is None
    acc = store.accept(_job("known", kind="merge", shot_id=None))
    assert store.idempotent_version("known") == (acc.version_id, acc.job.payload_hash, "merge")


def test_row_locks_serialize_concurrent_writers(store):
    """read-modify-write methods lock the row: on PostgreSQL without FOR UPDATE these lose updates."""
    v = store.accept(_job("locks")).version_id
    won = _together(8, lambda i: store.mark_submitted(v, f"run-{i}"))
    assert sum(won) == 1
    assert store.get(v).run_id == f"run-{won.index(True)}"

    d = store.enqueue_callback(v, "http://cb/hook", {}, now=1.0)
    _together(8, lambda i: store.record_attempt(d, ok=False, error=f"e{i}", next_attempt_at=2.0 + i))
    assert store.get_callback(d).attempts == 8


def test_concurrent_idempotent_inserts(store):
    """Racing inserts of one artifact path, input digest or callback all end with the first record."""
    v = store.accept(_job("dup")).version_id
    arts = _together(
        6, lambda i: store.add_artifact(v, kind="video", role="output", path="o.mp4", url_path="/o")
    )
    assert len({a.artifact_id for a in arts}) == 1 and len(store.artifacts_for(v)) == 1
    assets = _together(6, lambda i: store.put_input_asset("ef" * 32, f"p{i}.png", "image/png", 5))
    assert len(set(assets)) == 1 and store.get_input_asset("ef" * 32) == assets[0]
    ids = _together(6, lambda i: store.enqueue_callback(v, f"http://cb/{i}", {"i": i}))
    assert len(set(ids)) == 1 and store.callback_for(v).delivery_id == ids[0]


def test_ties_in_created_at_break_on_version_id(store, monkeypatch):
    """The FIFO order is (created_at, version_id): a row-value comparison on both backends."""
    monkeypatch.setattr(store_module, "time", SimpleNamespace(time=lambda: 1_700_000_000.123456))
    order = ["b" * 32, "0" * 32, "c" * 32, "a" * 32, "9" * 32]
    for i, vid in enumerate(order):
        store.accept(_job(shot_id=f"s{i}", version_id=vid))
    expected = sorted(order)
    assert [j.version_id for j in store.unsubmitted()] == expected
    assert [store.queue_position(v) for v in expected] == [1, 2, 3, 4, 5]
    assert store.get(order[0]).created_at == 1_700_000_000.123456  # float timestamps round-trip exactly


def test_large_sizes_long_ids_and_fractional_times(store):
    long_id = "ü" * 200 + "x" * 55  # the API allows 255 characters (not bytes)
    acc = store.accept(_job(long_id, work_id=long_id, shot_id=long_id, prompt="ß" * 5000))
    assert store.accept(_job(long_id, work_id=long_id, shot_id=long_id, prompt="ß" * 5000)).created is False
    job = store.get(acc.version_id)
    assert (job.job_id, job.work_id, job.shot_id) == (long_id, long_id, long_id)
    big = 5 * 1024**3  # past a 32-bit INTEGER
    art = store.add_artifact(
        acc.version_id, kind="video", role="output", path="m.mp4", url_path="/m", bytes=big
    )
    assert art.bytes == big and store.get_artifact(art.artifact_id).bytes == big
    assert store.put_input_asset("aa" * 32, "a.bin", "video/mp4", big).bytes == big
    t0 = 1_700_000_000.000001
    d = store.enqueue_callback(acc.version_id, "http://cb", {"n": 1}, now=t0)
    assert [x.delivery_id for x in store.due_callbacks(t0)] == [d]
    assert store.due_callbacks(t0 - 1e-6) == []


def test_schema_creation_is_safe_when_processes_start_together(db_url):
    stores = _together(4, lambda i: Store(db_url))
    try:
        v = stores[0].accept(_job("schema")).version_id
        assert all(s.get(v) is not None for s in stores)
    finally:
        for s in stores:
            s.close()


def test_bare_postgresql_url_uses_the_pinned_driver(pg_server):
    """SQLAlchemy 2.1 maps a bare postgresql:// to psycopg 3, the driver pyproject pins."""
    url = pg_server.fresh_url().replace("postgresql+psycopg://", "postgresql://", 1)
    s = Store(url)
    try:
        assert s.url == url and s.engine.dialect.driver == "psycopg"
        assert s.accept(_job("bare")).created
    finally:
        s.close()


def test_version_bodies_follow_every_change_they_show_and_only_those(store):
    """GET /version bodies are cached (pollers hit them hard); each change a body shows rebuilds it:
    its own row or artifacts, or, while queued, any job entering or leaving its queue. A queue
    change re-reads positions once for every queue, not each queued job's row."""
    import json

    from api.r2v.views import version_views

    ids = [store.accept(_job(shot_id=f"s{i}")).version_id for i in range(3)]
    views = version_views(store, "http://api", 100)
    reads: list[str] = []
    job_view = store.job_view
    store.job_view = lambda v: reads.append(v) or job_view(v)

    def body(v: str) -> dict:
        return json.loads(views.get(v))

    assert [body(v)["queue_position"] for v in ids] == [1, 2, 3]
    assert views.get(ids[2]) is views.get(ids[2]) and reads == ids  # cached, read once each

    store.update_status(ids[0], live={"progress": {"stage": "validating", "done": 1, "total": 2}})
    assert views.get(ids[2]) is views.get(ids[2]) and len(reads) == 3  # another job's row changed
    assert body(ids[0])["progress"] == {"stage": "validating", "done": 1, "total": 2}

    reads.clear()
    store.update_status(ids[0], status="running", stage="claimed")  # leaves the queue
    assert [body(v)["queue_position"] for v in ids[1:]] == [1, 2] and reads == []  # positions only
    assert (body(ids[0])["status"], body(ids[0])["queue_position"]) == ("running", None)

    store.add_artifact(ids[0], kind="video", role="output", path="r2v/a.mp4", url_path="/media/r2v/a.mp4")
    assert [a["url"] for a in body(ids[0])["artifacts"]] == ["http://api/media/r2v/a.mp4"]
    newer = store.accept(_job(shot_id="s9")).version_id  # enters the queue behind the others
    assert body(newer)["queue_position"] == 3 and body(ids[2])["queue_position"] == 2
    assert store.queue_positions() == {v: store.queue_position(v) for v in (ids[1], ids[2], newer)}
    assert views.get("missing") is None


def test_a_view_with_a_max_age_is_rendered_again_once_it_is_older(store, monkeypatch):
    """Fields that move with the clock (an ETA) bound how long a rendered view stays good."""
    from api.core import views as views_module

    v = store.accept(_job()).version_id
    renders: list[int | None] = []
    views = views_module.JobViews(
        store, lambda job, arts, pos: renders.append(pos) or pos, max_age=lambda j: 2.0
    )
    clock = [100.0]
    monkeypatch.setattr(views_module.time, "monotonic", lambda: clock[0])
    assert views.get(v) == 1 and views.get(v) == 1 and renders == [1]
    clock[0] += 2.5
    assert views.get(v) == 1 and renders == [1, 1]


def test_a_queued_body_never_shows_no_position(store):
    """The row and the positions are two reads: a job that left the queue in between (simulated
    here by a positions snapshot without it) is answered from one consistent read instead."""
    import json

    from api.r2v.views import version_views

    v = store.accept(_job()).version_id
    views = version_views(store, "http://api", 100)
    store.queue_positions = lambda: {}
    body = json.loads(views.get(v))
    assert (body["status"], body["queue_position"]) == ("queued", 1)


def test_a_write_through_one_store_reaches_the_views_another_process_cached(db_url):
    """Two API processes on one store, each with its cached GET /version bodies (here two Stores in
    one test): a write through one, to a job's row, its artifacts or the queue, is in the other's
    next body (the change counters live in the database); while nothing changes, the other answers
    from its cache."""
    import json

    from api.r2v.views import version_views

    writer, reader = Store(db_url), Store(db_url)
    try:
        views = version_views(reader, "http://api", 100)

        def body(v: str) -> dict:
            return json.loads(views.get(v))

        ids = [writer.accept(_job(shot_id=f"s{i}")).version_id for i in range(2)]
        assert [body(v)["queue_position"] for v in ids] == [1, 2]
        assert views.get(ids[1]) is views.get(ids[1])  # the cached body, not rendered again

        progress = {"stage": "validating", "done": 1, "total": 2}
        writer.update_status(ids[1], live={"progress": progress})
        assert body(ids[1])["progress"] == progress and views.get(ids[0]) is views.get(ids[0])
        writer.set_priority(ids[1], 5)  # the queue's order
        assert [body(v)["queue_position"] for v in ids] == [2, 1]
        writer.update_status(ids[1], status="running", stage="claimed")  # leaves the queue
        assert (body(ids[1])["status"], body(ids[0])["queue_position"]) == ("running", 1)
        writer.add_artifact(ids[1], kind="video", role="output", path="r2v/a.mp4", url_path="/media/a.mp4")
        assert [a["url"] for a in body(ids[1])["artifacts"]] == ["http://api/media/a.mp4"]
        newer = writer.accept(_job(shot_id="s9")).version_id  # enters the queue
        assert body(newer)["queue_position"] == 2
        writer.delete_job(ids[0])  # leaves it, and the store
        assert views.get(ids[0]) is None and body(newer)["queue_position"] == 1
        assert reader.changes(ids[0])[0] is None
    finally:
        writer.close()
        reader.close()


def test_a_queued_or_running_update_that_reaches_a_finished_job_changes_nothing(store):
    """The tracker saw a run queued, then a cancel landed before its write: the cancelled job keeps
    its stage and progress (CI once saw it cancelled with stage "queued" for ever), and no view is
    invalidated."""
    v = store.accept(_job()).version_id
    store.update_status(v, status="cancelled", stage="canceled", live={"progress": {"done": 0}})
    before = store.changes(v)
    late = store.update_status(v, status="queued", stage="queued", live={"progress": {"done": 3}})
    job = store.get(v)
    assert (job.status, job.stage, job.live.as_json()) == ("cancelled", "canceled", {"progress": {"done": 0}})
    assert (late.status, late.stage) == ("cancelled", "canceled") and store.changes(v) == before
    store.update_status(v, stage="kept")  # an update that says no status still applies
    assert store.get(v).stage == "kept"


def test_every_write_to_a_job_or_its_artifacts_bumps_its_change_counter_only(store):
    """The counters a cached view compares: the version's on every write to its row or artifacts
    (committed with the write, gone with the job), the queues' when one's membership or order moves."""
    v, other = (store.accept(_job(shot_id=s)).version_id for s in ("a", "b"))
    seen = [store.changes(v)]

    def moved(version: bool, queue: bool) -> bool:
        now = store.changes(v)
        before, seen[0] = seen[0], now
        return (now[0] != before[0], now[1] != before[1]) == (version, queue)

    assert seen[0][0] is not None and store.changes("missing")[0] is None
    store.update_status(other, stage="validating")
    assert moved(False, False)
    store.update_status(v, live={"progress": {"done": 1}})
    assert moved(True, False)
    store.set_priority(v, 3)
    assert moved(True, True)
    store.mark_submitted(v, "run-1")
    assert moved(True, False)
    store.request_cancel(v)
    assert moved(True, False)
    store.add_artifact(v, kind="video", role="output", path="o.mp4", url_path="/o")
    assert moved(True, False)
    store.update_status(v, status="running")
    assert moved(True, True)
    store.enqueue_callback(v, "http://cb", {})  # not in a view
    assert moved(False, False)
    with pytest.raises(UnknownVersion):
        store.update_status("missing", stage="x")  # rolled back: nothing counted
    assert moved(False, False)
    store.delete_job(v)
    assert store.changes(v)[0] is None


def test_a_turn_of_the_event_loop_looks_at_the_database_once(tmp_path):
    """The cached bodies one turn of the event loop answers share one look at what moved since the
    last turn (the change sequence) and read no counter of a job seen before; a write through
    another store is in the next turn's bodies (their requests arrived after it), still without a
    read per job."""
    import asyncio
    import json

    from api.r2v.views import version_views

    url = ApiConfig().resolved_database_url(tmp_path / "state")
    writer, reader = Store(url), Store(url)
    try:
        ids = [writer.accept(_job(shot_id=f"s{i}")).version_id for i in range(2)]
        views = version_views(reader, "http://api", 100)
        looks: list[str] = []
        since, changes = reader.changes_since, reader.changes
        reader.changes_since = lambda seq: looks.append("since") or since(seq)
        reader.changes = lambda v: looks.append(v) or changes(v)

        async def turns() -> None:
            first = [views.get(v) for v in ids]
            assert looks == ["since", *ids]  # first seen: each job's counter read alone
            await asyncio.sleep(0)
            looks.clear()
            assert [views.get(v) for v in ids] == first and looks == ["since"]
            writer.update_status(ids[0], live={"progress": {"done": 1}})
            await asyncio.sleep(0)
            looks.clear()
            assert json.loads(views.get(ids[0]))["progress"] == {"done": 1}
            assert views.get(ids[1]) is first[1] and looks == ["since"]
            writer.set_priority(ids[1], 5)  # the queue's order moves: both positions change
            await asyncio.sleep(0)
            looks.clear()
            assert [json.loads(views.get(v))["queue_position"] for v in ids] == [2, 1]
            assert looks == ["since"]

        asyncio.run(turns())
    finally:
        writer.close()
        reader.close()
