"""The /v1 job store's bounds on a real SQLite store and real files: expiry after job_ttl_s,
eviction past store_max_bytes (oldest first), versions still needed keep their MP4, and the room
uploads hold."""

from __future__ import annotations

import pytest

from api.core.errors import TooLarge
from api.core.jobs import JobService
from api.core.retention import Retention
from api.store import NewJob, Store
from settings.api import ApiConfig, OpenAIConfig

DAY = 86_400.0


class Clock:
    def __init__(self):
        self.offset = 0.0

    def __call__(self) -> float:
        import time

        return time.time() + self.offset


@pytest.fixture
def env(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'service.sqlite'}")
    media = tmp_path / "media"
    jobs = JobService(store, ApiConfig(), tmp_path / "state", media)
    yield store, jobs, media
    store.close()


def finished_video(store: Store, media, name: str, size: int, shot_id: str | None = None) -> str:
    job = store.accept(
        NewJob(kind="r2v", work_id="openai", request={}, payload_hash=name, dialect="openai")
    ).job
    vid = job.version_id
    if shot_id is None:
        shot_id = f"video_{vid}"
    with store._write() as s:  # the shot id a /v1 job gets at admission
        from api.store import Job

        s.get(Job, vid).shot_id = shot_id
    out = media / "r2v" / "openai" / name / "output.mp4"
    out.parent.mkdir(parents=True)
    out.write_bytes(b"\0" * size)
    store.add_artifact(
        vid, kind="video", role="shot", path=out.relative_to(media).as_posix(), url_path="/m", bytes=size
    )
    store.update_status(vid, status="succeeded")
    return vid


def test_a_finished_job_expires_after_its_ttl_with_its_files(env):
    store, jobs, media = env
    clock = Clock()
    keep = Retention(store, jobs, OpenAIConfig(job_ttl_s=DAY), clock)
    old = finished_video(store, media, "old", 100)
    assert not keep.expired(store.get(old)) and keep.sweep() == 0
    clock.offset = DAY + 1
    assert keep.expired(store.get(old))
    assert keep.sweep() == 1
    assert store.get(old) is None and not (media / "r2v" / "openai" / "old").exists()


def test_versions_still_needed_keep_their_mp4(env):
    store, jobs, media = env
    clock = Clock()
    keep = Retention(store, jobs, OpenAIConfig(job_ttl_s=DAY), clock)
    in_film = finished_video(store, media, "in-film", 100)
    store.accept(
        NewJob(
            kind="merge",
            work_id="openai",
            payload_hash="m",
            request={"inputs": {"shots": [{"version_id": in_film}]}},
        )
    )
    memory = finished_video(store, media, "memory", 100, shot_id="hero-shot")  # a client-named shot
    plain = finished_video(store, media, "plain", 100)
    clock.offset = DAY + 1
    assert keep.sweep() == 1
    assert store.get(plain) is None
    for vid in (in_film, memory):
        assert store.get(vid) is not None and jobs.video_path(vid) is not None
        assert keep.expired(store.get(vid))  # /v1 reads it as 404 all the same


def test_outputs_past_the_budget_are_evicted_oldest_first(env):
    store, jobs, media = env
    keep = Retention(store, jobs, OpenAIConfig(store_max_bytes=250))
    ids = [finished_video(store, media, f"v{i}", 100) for i in range(4)]
    assert store.output_bytes("openai") == 400
    assert keep.sweep() == 2
    assert [store.get(v) is None for v in ids] == [True, True, False, False]
    assert store.output_bytes("openai") == 200


def test_uploads_hold_room_and_a_full_store_names_both_figures(env):
    store, jobs, media = env
    keep = Retention(store, jobs, OpenAIConfig(store_max_bytes=1000))
    finished_video(store, media, "v", 600)
    keep.reserve(300, "the body")
    with pytest.raises(TooLarge) as info:
        keep.reserve(200, "the body")
    assert "needs 200 bytes" in info.value.message and "100 free" in info.value.message
    keep.release(300)
    keep.reserve(400, "the body")
