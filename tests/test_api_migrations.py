"""The service store's Alembic migrations (api/migrations) on SQLite and on a throwaway PostgreSQL: a store
written by the release before migrations upgrades in place with its rows intact, a new store is at head,
and the migrated schema is exactly ``Base.metadata`` (a model change without a revision fails here)."""

from __future__ import annotations

import threading

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from api import migrations
from api.store import Base, NewJob, Store, payload_hash
from settings.api import ApiConfig

import pg

# -- the schema as the release before migrations created it (Base.metadata.create_all), copied literally --

OLD = sa.MetaData()
OLD_JOBS = sa.Table(
    "jobs",
    OLD,
    sa.Column("version_id", sa.String(32), primary_key=True),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("work_id", sa.String(255), nullable=False),
    sa.Column("shot_id", sa.String(255)),
    sa.Column("job_id", sa.String(255)),
    sa.Column("payload_hash", sa.String(64), nullable=False),
    sa.Column("request", sa.JSON, nullable=False),
    sa.Column("callback_url", sa.Text),
    sa.Column("callback_context", sa.JSON),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("stage", sa.String(64), nullable=False),
    sa.Column("error", sa.Text),
    sa.Column("run_id", sa.String(64)),
    sa.Column("root_run_id", sa.String(64)),
    sa.Column("submitted_at", sa.Float),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
    sa.Column("finished_at", sa.Float),
    sa.Column("result", sa.JSON),
    sa.Column("live", sa.JSON),
    sa.Index("ix_jobs_kind_status_created", "kind", "status", "created_at"),
    sa.Index("ix_jobs_shot", "work_id", "shot_id", "status"),
    sa.Index("ix_jobs_run_id", "run_id"),
    sa.Index("ix_jobs_submitted", "submitted_at"),
)
OLD_KEYS = sa.Table(
    "idempotency_keys",
    OLD,
    sa.Column("job_id", sa.String(255), primary_key=True),
    sa.Column("version_id", sa.String(32), sa.ForeignKey("jobs.version_id"), nullable=False),
    sa.Column("payload_hash", sa.String(64), nullable=False),
)
OLD_ARTIFACTS = sa.Table(
    "artifacts",
    OLD,
    sa.Column("artifact_id", sa.String(32), primary_key=True),
    sa.Column("version_id", sa.String(32), sa.ForeignKey("jobs.version_id"), nullable=False, index=True),
    sa.Column("work_id", sa.String(255), nullable=False),
    sa.Column("shot_id", sa.String(255)),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("role", sa.String(64), nullable=False),
    sa.Column("path", sa.Text, nullable=False),
    sa.Column("url_path", sa.Text, nullable=False),
    sa.Column("bytes", sa.BigInteger),
    sa.Column("sha256", sa.String(64)),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("metadata", sa.JSON),
    sa.UniqueConstraint("version_id", "path", name="uq_artifacts_version_path"),
)
OLD_ASSETS = sa.Table(
    "input_assets",
    OLD,
    sa.Column("sha256", sa.String(64), primary_key=True),
    sa.Column("path", sa.Text, nullable=False),
    sa.Column("media_type", sa.String(128), nullable=False),
    sa.Column("bytes", sa.BigInteger, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
)
OLD_OUTBOX = sa.Table(
    "callback_outbox",
    OLD,
    sa.Column("delivery_id", sa.String(32), primary_key=True),
    sa.Column("version_id", sa.String(32), sa.ForeignKey("jobs.version_id"), nullable=False, unique=True),
    sa.Column("url", sa.Text, nullable=False),
    sa.Column("payload", sa.JSON, nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("next_attempt_at", sa.Float),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("last_error", sa.Text),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("delivered_at", sa.Float),
    sa.Index("ix_outbox_due", "status", "next_attempt_at"),
)

VID, JOB_ID, REQUEST = "a" * 32, "job-old", {"work_id": "w", "shot_id": "s1", "prompt": "a kite"}
DIGEST, T0 = "d" * 64, 1_700_000_000.0


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


def _write_previous_release(url: str) -> None:
    """The state the release before migrations leaves: its tables (no alembic_version) and one job with an
    idempotency key, an artifact, an input asset and a pending callback."""
    old = Store(url, create=False)  # the engine only (SQLite pragmas as the service sets them)
    try:
        with old.engine.begin() as conn:
            OLD.create_all(conn)
            conn.execute(
                OLD_JOBS.insert(),
                {
                    "version_id": VID,
                    "kind": "r2v",
                    "work_id": "w",
                    "shot_id": "s1",
                    "job_id": JOB_ID,
                    "payload_hash": payload_hash(REQUEST),
                    "request": REQUEST,
                    "callback_url": "http://cb/x",
                    "callback_context": {"k": 1},
                    "status": "succeeded",
                    "stage": "done",
                    "run_id": "run-2",
                    "root_run_id": "run-1",
                    "submitted_at": T0 + 1,
                    "created_at": T0,
                    "updated_at": T0 + 9,
                    "finished_at": T0 + 9,
                    "result": {"url": "/media/out.mp4"},
                    "live": {"progress": 1.0},
                },
            )
            conn.execute(
                OLD_KEYS.insert(),
                {"job_id": JOB_ID, "version_id": VID, "payload_hash": payload_hash(REQUEST)},
            )
            conn.execute(
                OLD_ARTIFACTS.insert(),
                {
                    "artifact_id": "b" * 32,
                    "version_id": VID,
                    "work_id": "w",
                    "shot_id": "s1",
                    "kind": "video",
                    "role": "output",
                    "path": "r2v/w/s1/out.mp4",
                    "url_path": "/media/r2v/w/s1/out.mp4",
                    "bytes": 5 * 2**30,  # > 2 GiB: BIGINT kept
                    "sha256": "e" * 64,
                    "created_at": T0 + 8,
                    "metadata": {"fps": 16},
                },
            )
            conn.execute(
                OLD_ASSETS.insert(),
                {
                    "sha256": DIGEST,
                    "path": "ab/cd.png",
                    "media_type": "image/png",
                    "bytes": 123,
                    "created_at": T0,
                },
            )
            conn.execute(
                OLD_OUTBOX.insert(),
                {
                    "delivery_id": "c" * 32,
                    "version_id": VID,
                    "url": "http://cb/x",
                    "payload": {"status": "succeeded"},
                    "attempts": 2,
                    "next_attempt_at": T0 + 10,
                    "status": "pending",
                    "last_error": "HTTP 503",
                    "created_at": T0 + 9,
                },
            )
    finally:
        old.close()


def _revisions(store: Store) -> tuple[str, ...]:
    with store.engine.connect() as conn:
        return migrations.current(conn)


def _schema_diffs(store: Store, metadata: sa.MetaData = Base.metadata) -> list:
    """What ``alembic check`` would report: differences between the database and ``metadata``."""
    with store.engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True, "compare_server_default": True})
        return compare_metadata(ctx, metadata)


def _assert_previous_rows_intact(store: Store) -> None:
    job = store.get(VID)
    assert job is not None
    assert (job.kind, job.work_id, job.shot_id, job.job_id) == ("r2v", "w", "s1", JOB_ID)
    assert job.request == REQUEST and job.payload_hash == payload_hash(REQUEST)
    assert (job.callback_url, job.callback_context) == ("http://cb/x", {"k": 1})
    assert (job.status, job.stage, job.run_id, job.root_run_id) == ("succeeded", "done", "run-2", "run-1")
    assert (job.submitted_at, job.created_at, job.finished_at) == (T0 + 1, T0, T0 + 9)
    assert job.result == {"url": "/media/out.mp4"} and job.live == {"progress": 1.0}
    # The new columns: defaults for rows written before them.
    assert (job.dialect, job.submitter, job.cancel_requested_at) == ("r2v", None, None)

    assert store.idempotent_version(JOB_ID) == (VID, payload_hash(REQUEST), "r2v")
    [artifact] = store.artifacts_for(VID)
    assert (artifact.artifact_id, artifact.path, artifact.bytes) == ("b" * 32, "r2v/w/s1/out.mp4", 5 * 2**30)
    assert artifact.metadata == {"fps": 16} and artifact.sha256 == "e" * 64
    asset = store.get_input_asset(DIGEST)
    assert asset is not None and (asset.path, asset.media_type, asset.bytes) == (
        "ab/cd.png",
        "image/png",
        123,
    )
    assert store.due_callbacks(now=T0 + 5) == []
    [delivery] = store.due_callbacks(now=T0 + 10)
    assert (delivery.delivery_id, delivery.version_id, delivery.attempts) == ("c" * 32, VID, 2)
    assert (delivery.payload, delivery.last_error, delivery.status) == (
        {"status": "succeeded"},
        "HTTP 503",
        "pending",
    )


def test_previous_release_state_upgrades_in_place(db_url):
    _write_previous_release(db_url)
    store = Store(db_url)
    try:
        assert _revisions(store) == (migrations.head(),)
        _assert_previous_rows_intact(store)
        assert _schema_diffs(store) == []

        new = NewJob(
            kind="r2v",
            work_id="w",
            shot_id="s2",
            job_id="job-new",
            request=REQUEST,
            payload_hash=payload_hash(REQUEST),
            dialect="openai",
            submitter="key-a",
        )
        accepted = store.accept(new)
        assert accepted.created and (accepted.job.dialect, accepted.job.submitter) == ("openai", "key-a")
        again = store.get(accepted.version_id)
        assert (again.dialect, again.submitter, again.cancel_requested_at) == ("openai", "key-a", None)
        assert store.accept(new).version_id == accepted.version_id  # idempotency still works
        # The old job still occupies its key: same key, other payload is a conflict as before.
        assert store.idempotent_version(JOB_ID)[0] == VID
    finally:
        store.close()

    reopened = Store(db_url)  # a second start: already at head, nothing changes
    try:
        assert _revisions(reopened) == (migrations.head(),)
        _assert_previous_rows_intact(reopened)
        assert reopened.get(accepted.version_id).dialect == "openai"
    finally:
        reopened.close()


def test_fresh_store_is_at_head_and_matches_the_models(db_url):
    store = Store(db_url)
    try:
        assert _revisions(store) == (migrations.head(),) == ("0006_change_sequence",)
        assert _schema_diffs(store) == []
        job = store.accept(NewJob(kind="merge", work_id="w", request={}, payload_hash="h")).job
        assert (job.dialect, job.submitter, job.cancel_requested_at) == ("r2v", None, None)
    finally:
        store.close()


def test_baseline_revision_is_the_previous_release_schema(db_url):
    """0001_baseline creates exactly what the release before migrations created, so stamping such a
    database at the baseline is truthful."""
    store = Store(db_url, create=False)
    try:
        with store.engine.begin() as conn:
            command.upgrade(migrations.alembic_config(conn), migrations.BASELINE)
        assert _revisions(store) == (migrations.BASELINE,)
        assert _schema_diffs(store, OLD) == []
        with store.engine.begin() as conn:  # and from there to head: the models
            assert migrations.upgrade(conn)
        assert _schema_diffs(store) == []
    finally:
        store.close()


def test_a_state_at_the_previous_revision_upgrades_with_its_jobs_counted(db_url):
    """The release before 0005_change_counters left its jobs without change counters: the upgrade
    keeps every row and gives each job its counter (and the queues theirs), so a write to an old
    job invalidates the views every API process cached of it."""
    _write_previous_release(db_url)
    old = Store(db_url, create=False)
    try:
        with old.engine.begin() as conn:  # where the previous release left its state: 0004
            cfg = migrations.alembic_config(conn)
            command.stamp(cfg, migrations.BASELINE)
            command.upgrade(cfg, "0004_job_priority")
    finally:
        old.close()
    store = Store(db_url)
    try:
        assert _revisions(store) == (migrations.head(),)
        _assert_previous_rows_intact(store)
        assert _schema_diffs(store) == []
        assert store.changes(VID) == (1, 1)
        store.update_status(VID, stage="kept")
        assert store.changes(VID) == (2, 1)
    finally:
        store.close()


def test_a_state_at_0005_upgrades_and_its_jobs_views_follow_the_change_sequence(db_url):
    """The release before 0006_change_sequence numbered no change: after the upgrade, a view cached
    of one of its jobs (its counter read alone, the first time) follows writes by their sequence
    number, and a deleted job's row stays as a tombstone that the views see."""
    from api.core.views import JobViews

    _write_previous_release(db_url)
    old = Store(db_url, create=False)
    try:
        with old.engine.begin() as conn:
            cfg = migrations.alembic_config(conn)
            command.stamp(cfg, migrations.BASELINE)
            command.upgrade(cfg, "0005_change_counters")
    finally:
        old.close()
    store, reader = Store(db_url), Store(db_url)
    try:
        assert _revisions(store) == (migrations.head(),)
        _assert_previous_rows_intact(store)
        assert _schema_diffs(store) == []
        views = JobViews(reader, lambda job, _artifacts, _position: (job.status, job.stage))
        assert views.get(VID) == ("succeeded", "done")
        store.update_status(VID, stage="kept")
        assert views.get(VID) == ("succeeded", "kept")
        store.delete_job(VID)
        assert views.get(VID) is None and store.changes(VID)[0] is None
    finally:
        store.close()
        reader.close()


def test_concurrent_starts_on_a_previous_release_state_migrate_once(db_url):
    _write_previous_release(db_url)
    stores, errors = [], []
    barrier = threading.Barrier(4)

    def start():
        barrier.wait()
        try:
            stores.append(Store(db_url))
        except Exception as e:  # pragma: no cover - the assertion below shows it
            errors.append(e)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert not errors
        assert len(stores) == 4
        for store in stores:
            assert _revisions(store) == (migrations.head(),)
            _assert_previous_rows_intact(store)
    finally:
        for store in stores:
            store.close()


def test_a_current_store_does_no_migration_work(db_url, monkeypatch):
    Store(db_url).close()

    def fail(_conn):
        raise AssertionError("upgrade ran on a database already at head")

    monkeypatch.setattr(migrations, "upgrade", fail)
    store = Store(db_url)
    assert _revisions(store) == (migrations.head(),)
    store.close()


def test_in_memory_sqlite_store_migrates():
    store = Store("sqlite://")
    try:
        assert _revisions(store) == (migrations.head(),)
        assert store.accept(
            NewJob(kind="r2v", work_id="w", request={}, payload_hash="h", dialect="openai")
        ).created
    finally:
        store.close()


def test_a_partial_unversioned_schema_is_refused(tmp_path):
    url = f"sqlite:///{tmp_path / 'partial.sqlite'}"
    old = Store(url, create=False)
    with old.engine.begin() as conn:
        OLD_JOBS.create(conn)
    old.close()
    with pytest.raises(RuntimeError, match="not a schema this release knows"):
        Store(url)
