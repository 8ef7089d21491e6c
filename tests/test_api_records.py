"""A job's record is typed (api.core.records) and reads every row an earlier release wrote: the
JSON columns keep their shape, what was stored differently is read, never rewritten; URLs are built
when a view is rendered, under the URL the API is reached at now."""

from __future__ import annotations

from dataclasses import replace

import pytest

from api.core.outcome import callback_payload
from api.core.records import JobLive, JobRequest, JobResult
from api.core.steps import extension_before_frames, first_run_id, follow_ups
from api.r2v.views import version_response
from api.store import NewJob, Store
from settings.api import ApiConfig

SHOT = {
    "work_id": "w",
    "shot_id": "s",
    "prompt": "a kite",
    "num_frames": 17,
    "fps": 16,
    "width": 64,
    "height": 48,
}


@pytest.fixture
def store(tmp_path):
    s = Store(f"sqlite:///{tmp_path / 'service.sqlite'}")
    yield s
    s.close()


def shot_job(store: Store, request: dict, **status):
    job = store.accept(
        NewJob(
            kind="r2v", work_id="w", shot_id="s", request=request, payload_hash="h", callback_url="http://cb"
        )
    ).job
    return store.update_status(job.version_id, **status) if status else job


def test_a_result_keeps_the_videos_place_and_its_url_follows_the_api(store):
    job = shot_job(
        store,
        {"job_name": "r2v", "run_config": {"ops": {"condition_op": {"config": SHOT}}}},
        status="succeeded",
        stage="succeeded",
        result={"run_id": "r1", "video_path": "w/s/r1.mp4", "artifact_id": "a1", "frames": 17},
    )
    assert isinstance(job.result, JobResult) and job.result.frames == 17
    for base in ("http://127.0.0.1:8221", "https://videos.example.org"):
        view = version_response(job, None, [], base)
        assert view.video_url == f"{base}/media/w/s/r1.mp4"
        assert view.result == {"run_id": "r1", "artifact_id": "a1", "frames": 17, "video_url": view.video_url}
        payload = callback_payload(job, store, ApiConfig(public_url=base))
        assert payload["video_url"] == f"{base}/media/w/s/r1.mp4"


def test_a_result_an_earlier_release_wrote_with_its_url_reads_under_todays_base(store):
    legacy = {"run_id": "r0", "video_url": "http://old-host:8000/media/w/s/r0.mp4", "artifact_id": "a0"}
    job = shot_job(store, {"run_config": {"ops": {"condition_op": {"config": SHOT}}}}, result=legacy)
    assert job.result == legacy  # read, never rewritten
    assert store.get(job.version_id).result == legacy
    assert job.result.media_path == "w/s/r0.mp4"
    assert version_response(job, None, [], "http://new:1").video_url == "http://new:1/media/w/s/r0.mp4"


def test_a_request_an_earlier_release_wrote_reads_with_its_runs_and_shot(store):
    # Before follow-up runs (no "then"): the shot gets its stills run; before extensions were a
    # chain of runs: one run with a stitch op says how long the source was.
    job = shot_job(
        store,
        {
            "job_name": "r2v",
            "run_config": {
                "ops": {
                    "condition_op": {"config": SHOT},
                    "stitch_op": {"config": {"work_id": "w", "before": ["a.mp4"], "before_frames": 33}},
                }
            },
        },
    )
    assert isinstance(job.request, JobRequest) and job.request.then is None
    [stills] = follow_ups(job)
    assert (stills.job_name, stills.config) == ("shot_stills", {"work_id": "w", "shot_id": "s"})
    assert extension_before_frames(job) == 33
    assert (job.request.shot.prompt, job.request.shot.num_frames, job.request.merge) == ("a kite", 17, None)
    # A hand-made row missing what the op requires now still reads.
    odd = shot_job(store, {"run_config": {"ops": {"condition_op": {"config": {"prompt": "p"}}}}})
    assert odd.request.shot.prompt == "p" and odd.request.shot.width is None


def test_live_facts_read_typed_and_equal_the_row(store):
    live = {"run_status": "STARTED", "stage_times": {"claimed": 10.0, "inferring": 12.5}, "runs": ["r0"]}
    job = shot_job(store, {"run_config": {}}, live=live)
    assert isinstance(job.live, JobLive) and job.live == live
    assert (job.live.stage_times["inferring"], first_run_id(job)) == (12.5, "r0")
    assert replace(job, live={"progress": 0.5}).live.progress == 0.5  # an early release's fraction
