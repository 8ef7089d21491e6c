"""Accepting jobs (api.service.Intake) on a real SQLite store and real media, without Dagster."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from api.core.jobs import JobService
from api.errors import ApiError
from api.r2v.protocol import MergeRequest, R2VRequest
from api.r2v.serving import R2VServing
from api.r2v.views import version_response
from api.store import Store
from settings.api import ApiConfig
from shotloom.config import Performance, Sampler
from shotloom.media import write_mp4

WAN_LIKE = {  # what a tiny Wan VACE worker publishes
    "max_reference_images": 3,
    "first_frame": True,
    "last_frame": True,
    "audio_in": False,
    "audio_out": False,
    "frame_multiple": 4,
    "size_multiple": 16,
    "fps": [16],
    "guidance_range": [1.0, 20.0],
    "max_frames": 1025,
    "video_to_video": True,
}


def png_url(seed: int = 0) -> str:
    pixels = np.random.default_rng(seed).integers(0, 255, (32, 32, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


@pytest.fixture
def store(tmp_path) -> Store:
    s = Store(f"sqlite:///{tmp_path / 'service.sqlite'}")
    yield s
    s.close()


def make_intake(
    tmp_path, store, caps=None, sampler_for=None, performance=None, **api
) -> tuple[R2VServing, list[int]]:
    """The R2V dialect's serving layer on a real job service."""
    pokes: list[int] = []
    jobs = JobService(
        store,
        ApiConfig(**api),
        tmp_path / "state",
        tmp_path / "media",
        on_accept=lambda: pokes.append(1),
        capabilities=lambda: caps,
        sampler_for=sampler_for,
        performance=performance,
    )
    return R2VServing(jobs), pokes


def r2v(**fields) -> R2VRequest:
    return R2VRequest.model_validate(
        {"work_id": "w", "shot_id": "s", "prompt": "p", "memory_slots": [], **fields}
    )


def refused(call, status: int) -> ApiError:
    with pytest.raises(ApiError) as info:
        call()
    assert info.value.status == status, info.value.body()
    return info.value


def test_accepted_job_holds_its_run_config_and_no_inline_data(tmp_path, store):
    intake, pokes = make_intake(tmp_path, store)
    job = intake.accept_r2v(r2v(condition_img=png_url(), seed=3, num_frames=9), None).job
    assert pokes == [1] and job.status == "queued" and job.submitted_at is None
    config = job.request["run_config"]["ops"]["condition_op"]["config"]
    assert config["seed"] == 3 and config["num_frames"] == 9
    first = Path(config["first_frame"])
    assert first.is_file() and first.is_relative_to(tmp_path / "state")  # content-addressed asset
    assert job.request["client"]["condition_img"] == "data:image/png;base64,..."
    assert job.request["inputs"]["condition_img"]["media_type"] == "image/png"


@pytest.mark.parametrize(
    ("fields", "field"),
    [({"width": 16384}, "width"), ({"height": 1281}, "height"), ({"num_frames": 1025}, "num_frames")],
)
def test_a_shot_past_the_servers_own_limits_is_422_before_queueing(tmp_path, store, fields, field):
    """The server's bounds (api.openai's max_width, max_height, max_seconds) hold for /r2v as for
    /v1: one request could otherwise hold a device for hours."""
    intake, pokes = make_intake(tmp_path, store)
    error = refused(lambda: intake.accept_r2v(r2v(**fields), None), 422)
    assert error.field == field and "on this server" in error.message
    assert pokes == [] and store.counts_by_status("r2v").get("queued", 0) == 0
    # At the bounds: accepted (1280 wide; 15 s at the default 16 fps is 241 frames).
    assert intake.accept_r2v(r2v(width=1280, num_frames=241), None).job.status == "queued"


def test_a_job_cancelled_before_it_ran_calls_back_once_as_failed(tmp_path, store):
    """Cancelled while queued (never handed to Dagster: no run will ever end to say so): the
    callback is queued with the outcome, as for any other end, and only once."""
    intake, _ = make_intake(tmp_path, store)
    routing = {"session_key": "sk-1", "channel": "web", "chat_id": "c-9"}
    job = intake.accept_r2v(r2v(callback_url="http://127.0.0.1:9/cb", callback_context=routing), None).job
    assert store.callback_for(job.version_id) is None
    cancelled = intake.jobs.cancel(job.version_id)
    assert (cancelled.status, cancelled.stage) == ("cancelled", "canceled")
    delivery = store.callback_for(job.version_id)
    assert delivery is not None and delivery.url == "http://127.0.0.1:9/cb"
    body = delivery.payload
    assert (body["status"], body["error"], body["version_id"]) == ("failed", "cancelled", job.version_id)
    assert {k: body[k] for k in routing} == routing and body["callback_context"] == routing
    intake.jobs.cancel(job.version_id)  # a second cancel: finished, nothing more queued
    assert store.callback_for(job.version_id).delivery_id == delivery.delivery_id


def test_replay_answers_before_fetching_and_conflict_is_409(tmp_path, store):
    intake, pokes = make_intake(tmp_path, store)
    first = intake.accept_r2v(r2v(job_id="k", condition_img=png_url()), None)
    # The replay would fail if it fetched the (unreachable) header callback or inputs again.
    again = intake.accept_r2v(r2v(job_id="k", condition_img=png_url()), "http://example.invalid/cb")
    assert (again.created, again.job.version_id) == (False, first.job.version_id)
    assert pokes == [1]
    err = refused(lambda: intake.accept_r2v(r2v(job_id="k", prompt="other"), None), 409)
    assert first.job.version_id in err.message


def test_full_queue_is_503_and_capabilities_are_checked_before_queueing(tmp_path, store):
    intake, _ = make_intake(tmp_path, store, caps=WAN_LIKE, max_queue=1)
    err = refused(lambda: intake.accept_r2v(r2v(width=50), None), 422)
    assert err.field == "width" and "multiple of 16" in err.message
    err = refused(lambda: intake.accept_r2v(r2v(num_frames=10), None), 422)
    assert err.field == "num_frames"
    slots = [{"image_url": png_url(i)} for i in range(4)]
    assert refused(lambda: intake.accept_r2v(r2v(memory_slots=slots), None), 422).field == "memory_slots"
    intake.accept_r2v(r2v(), None)
    assert "queue is full" in refused(lambda: intake.accept_r2v(r2v(shot_id="t"), None), 503).message


def test_memory_by_shot_id_needs_a_succeeded_shot_then_takes_its_frame(tmp_path, store):
    intake, _ = make_intake(tmp_path, store, caps=WAN_LIKE)
    ask = r2v(shot_id="s2", memory_slots=[{"shot_id": "s1"}])
    assert refused(lambda: intake.accept_r2v(ask, None), 409).field == "memory_slots[0].shot_id"

    earlier = intake.accept_r2v(r2v(shot_id="s1"), None).job
    frames = np.zeros((5, 32, 32, 3), np.uint8)
    frames[2] = 200  # the middle frame is the representative one
    rel = "r2v/w/s1/run/output.mp4"
    (tmp_path / "media" / rel).parent.mkdir(parents=True)
    write_mp4(tmp_path / "media" / rel, frames, 16, None, None)  # with a silent audio track
    store.add_artifact(earlier.version_id, kind="video", role="shot", path=rel, url_path="/media/" + rel)
    assert refused(lambda: intake.accept_r2v(ask, None), 409).status == 409  # not succeeded yet
    store.update_status(earlier.version_id, status="succeeded")

    job = intake.accept_r2v(ask, None).job
    [slot] = job.request["run_config"]["ops"]["condition_op"]["config"]["memory"]
    assert slot["audio"] is None  # this model takes no audio: the shot's track is left out
    assert np.asarray(Image.open(slot["image"])).mean() > 150


def test_a_source_video_slot_starts_the_shot_from_a_succeeded_version(tmp_path, store):
    intake, _ = make_intake(tmp_path, store, caps=WAN_LIKE)
    earlier = intake.accept_r2v(r2v(shot_id="s1"), None).job
    ask = r2v(
        shot_id="s2", memory_slots=[{"version_id": earlier.version_id, "strength": 0.4}, {"shot_id": "s1"}]
    )
    assert refused(lambda: intake.accept_r2v(ask, None), 409).field == "memory_slots[0].version_id"
    rel = "r2v/w/s1/run/output.mp4"
    (tmp_path / "media" / rel).parent.mkdir(parents=True)
    write_mp4(tmp_path / "media" / rel, np.full((5, 32, 32, 3), 90, np.uint8), 16, None, None)
    store.add_artifact(earlier.version_id, kind="video", role="shot", path=rel, url_path="/media/" + rel)
    store.update_status(earlier.version_id, status="succeeded")

    job = intake.accept_r2v(ask, None).job
    config = job.request["run_config"]["ops"]["condition_op"]["config"]
    assert config["strength"] == 0.4 and Path(config["source_video"]).is_file()
    assert len(config["memory"]) == 1  # the source is not a reference image
    assert job.request["inputs"]["memory_slots[0].version_id"]["version_id"] == earlier.version_id
    two = r2v(memory_slots=[{"version_id": earlier.version_id}, {"video_url": "http://x/a.mp4"}])
    assert refused(lambda: intake.accept_r2v(two, None), 422).field == "memory_slots[1].video_url"
    stray = {"image_url": png_url(), "strength": 0.5}
    with pytest.raises(ValueError, match="strength is only allowed"):
        r2v(memory_slots=[stray])


def test_merge_refers_to_succeeded_versions_only(tmp_path, store):
    intake, _ = make_intake(tmp_path, store)
    shot = intake.accept_r2v(r2v(), None).job
    req = MergeRequest.model_validate({"work_id": "w", "shots": [{"version_id": shot.version_id}]})
    assert refused(lambda: intake.accept_merge(req, None), 409).field == "shots[0].version_id"
    unknown = MergeRequest.model_validate({"work_id": "w", "shots": [{"version_id": "nope"}]})
    assert "unknown" in refused(lambda: intake.accept_merge(unknown, None), 409).message


def test_the_api_process_never_imports_torch():
    import subprocess
    import sys

    code = "import sys, api.__main__; assert 'torch' not in sys.modules, 'torch imported'"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_character_slots_count_against_the_reference_limit(tmp_path, store):
    from api.core.specs import InputRef, SourceRef

    intake, _ = make_intake(tmp_path, store, caps=WAN_LIKE)  # at most 3 references
    clip = tmp_path / "clip.mp4"
    write_mp4(clip, np.full((5, 32, 32, 3), 120, np.uint8), 16, None, None)
    source = SourceRef("video", video=InputRef("video", upload=clip))
    chars = [intake.jobs.create_character(f"c{i}", source, None).character_id for i in range(2)]
    images = [{"image_url": png_url(i)} for i in range(2)]
    characters = [{"character_id": c} for c in chars]

    job = intake.accept_r2v(r2v(memory_slots=[images[0], *characters]), None).job
    assert len(job.request["run_config"]["ops"]["condition_op"]["config"]["memory"]) == 3
    # Over the limit because of the characters: they are memory slots of this dialect.
    err = refused(lambda: intake.accept_r2v(r2v(memory_slots=[*images, *characters]), None), 422)
    assert err.field == "memory_slots" and "at most 3 reference images, got 4" in err.message


def test_a_shot_is_followed_by_its_stills_and_an_extension_by_its_stitching(tmp_path, store):
    """The runs after a shot's device run, as the follower builds them from what the run wrote:
    run configs the jobs accept (validated against the code location's jobs)."""
    from dataclasses import replace

    from dagster import validate_run_config

    from api.core.steps import follow_up_run, follow_ups, stitch_step
    from orchestration.definitions import defs

    intake, _ = make_intake(tmp_path, store)
    job = intake.accept_r2v(r2v(), None).job
    wrote = {"path": "r2v/w/s/run/output.mp4", "spritesheet_count": 4, "shot_id": "s", "version_id": "v1"}
    [step] = follow_ups(job)
    name, config = follow_up_run(step, wrote)
    assert name == "shot_stills"
    assert config["ops"]["stills_op"]["config"] == {
        "work_id": "w", "shot_id": "s", "video": "r2v/w/s/run/output.mp4", "spritesheet_frames": 4,
    }  # fmt: skip
    validate_run_config(defs.get_job_def(name), config)
    # A shot accepted by an earlier release (its run made the stills itself; it no longer does).
    legacy = replace(job, request={k: v for k, v in job.request.items() if k != "then"})
    assert follow_ups(legacy) == [step]

    source = {"inputs": ["/m/source.mp4"], "shot_ids": ["upload:ab"], "versions": ["sha256:ab"]}
    stitch = stitch_step({"work_id": "w", **source})
    name, config = follow_up_run(stitch, wrote)
    assert name == "merge" and config["ops"]["merge_op"]["config"] == {
        "work_id": "w",
        "inputs": ["/m/source.mp4", "r2v/w/s/run/output.mp4"],
        "shot_ids": ["upload:ab", "s"],
        "versions": ["sha256:ab", "v1"],
    }
    validate_run_config(defs.get_job_def(name), config)
    assert stitch["config"]["inputs"] == ["/m/source.mp4"]  # the stored step is left as it was


def test_r2v_steps_and_guidance_are_honoured_within_the_servers_limits_and_the_samplers(tmp_path, store):
    native = Sampler(mode="native", steps=3, guidance_scale=1.0)
    draft = Sampler(mode="dmd", sigmas=[1.0, 0.5])  # a distill adapter's own: 2 steps
    limits = {"max_steps": 10, "guidance_scale": [1.0, 8.0]}
    intake, _ = make_intake(
        tmp_path,
        store,
        caps={**WAN_LIKE, "adapters": ["draft"]},
        sampler_for=lambda adapter: draft if adapter == "draft" else native,
        sampling=limits,
    )
    job = intake.accept_r2v(r2v(num_inference_steps=10, guidance_scale=7.5), None).job
    config = job.request["run_config"]["ops"]["condition_op"]["config"]
    assert (config["num_inference_steps"], config["guidance_scale"]) == (10, 7.5)
    # GET /version says what it runs with: asked, else its sampler's default.
    view = version_response(job, None, [], "http://x", intake.jobs.sampling)
    assert (view.num_inference_steps, view.guidance_scale, view.sampler_mode) == (10, 7.5, "native")
    job = intake.accept_r2v(r2v(shot_id="t"), None).job
    view = version_response(job, None, [], "http://x", intake.jobs.sampling)
    assert (view.num_inference_steps, view.guidance_scale, view.sampler_mode) == (3, 1.0, "native")
    job = intake.accept_r2v(r2v(shot_id="u", lora={"name": "draft"}, num_inference_steps=2), None).job
    view = version_response(job, None, [], "http://x", intake.jobs.sampling)
    assert (view.num_inference_steps, view.sampler_mode) == (2, "dmd")

    for fields, field, words in (
        ({"num_inference_steps": 11}, "num_inference_steps", "within [1, 10]"),
        ({"guidance_scale": 8.5}, "guidance_scale", "within [1, 8]"),
        ({"lora": {"name": "draft"}, "num_inference_steps": 3}, "num_inference_steps", "of 2 steps"),
    ):
        err = refused(lambda f=fields: intake.accept_r2v(r2v(shot_id="v", **f), None), 422)
        assert err.field == field and words in err.message, err.body()
        assert err.body()["error"].startswith(f"{field}: ")

    # Before any worker has loaded the model the server's limits still hold.
    early, _ = make_intake(tmp_path, store, sampler_for=lambda adapter: native, sampling=limits)
    assert refused(lambda: early.accept_r2v(r2v(num_inference_steps=11), None), 422).field == (
        "num_inference_steps"
    )


def test_r2v_step_cache_is_one_of_the_models_presets_the_server_allows(tmp_path, store):
    perf = Performance.model_validate(
        {
            "step_caches": {
                "fbc": {"kind": "first_block", "threshold": 0.2},
                "fast": {"kind": "first_block", "threshold": 0.4},
            },
            "step_cache": "fbc",
        }
    )
    native = Sampler(mode="native", steps=3, guidance_scale=1.0)
    draft = Sampler(mode="dmd", sigmas=[1.0, 0.5])
    intake, pokes = make_intake(
        tmp_path,
        store,
        caps={**WAN_LIKE, "adapters": ["draft"]},
        sampler_for=lambda adapter: draft if adapter == "draft" else native,
        performance=perf,
        sampling={"step_caches": []},  # the server offers none but the model's default (and none)
    )
    job = intake.accept_r2v(r2v(step_cache="none"), None).job
    assert job.request["run_config"]["ops"]["condition_op"]["config"]["step_cache"] == "none"
    assert version_response(job, None, [], "http://x", intake.jobs.sampling).step_cache == "none"
    # Unset: not in the run config (the engine takes the model's default), which the view says.
    job = intake.accept_r2v(r2v(shot_id="t"), None).job
    assert "step_cache" not in job.request["run_config"]["ops"]["condition_op"]["config"]
    assert version_response(job, None, [], "http://x", intake.jobs.sampling).step_cache == "fbc"
    job = intake.accept_r2v(r2v(shot_id="u", lora={"name": "draft"}, step_cache="fbc"), None).job
    assert version_response(job, None, [], "http://x", intake.jobs.sampling).step_cache == "fbc"
    # What the run recorded wins once it succeeded.
    job = store.update_status(
        job.version_id, status="succeeded", stage="succeeded", result={"step_cache": "none"}
    )
    assert version_response(job, None, [], "http://x", intake.jobs.sampling).step_cache == "none"

    before = len(pokes)
    for fields, words in (
        ({"step_cache": "fast"}, "not offered on this server"),
        ({"step_cache": "mag"}, "unknown step cache 'mag'"),
        ({"step_cache": "fast", "lora": {"name": "draft"}}, "not offered"),  # per model, not adapter
    ):
        err = refused(lambda f=fields: intake.accept_r2v(r2v(shot_id="v", **f), None), 422)
        assert err.field == "step_cache" and words in err.message, err.body()
        assert err.body()["error"].startswith("step_cache: ")
    assert len(pokes) == before  # nothing was queued


class QueuedRuns:
    """The one gateway call the submitter makes for jobs accepted in this process's life: runs
    submitted in GraphQL documents, recorded in the order they reach Dagster's queue."""

    def __init__(self) -> None:
        self.documents: list[list[str]] = []  # each document's runs: their version tags

    def submit_many(self, submissions):
        from contracts.tags import VERSION_TAG

        self.documents.append([s.tags[VERSION_TAG] for s in submissions])
        return [f"run-{version}" for version in self.documents[-1]]


def test_a_merge_waits_for_no_batch_of_the_shots_accepted_before_it(tmp_path, store):
    """Each kind has its own queue in Dagster: the submitter sends the kinds' oldest batches in
    turn (the shortest queue first), in accept order within each kind, and reads the jobs again
    after every round."""
    import threading

    from api.background.callbacks import Callbacks
    from api.background.submitter import SUBMIT_BATCH, Submitter

    intake, _ = make_intake(tmp_path, store, caps=WAN_LIKE)
    first = intake.accept_r2v(r2v(shot_id="first"), None).job
    rel = "r2v/w/first/run/output.mp4"
    (tmp_path / "media" / rel).parent.mkdir(parents=True)
    write_mp4(tmp_path / "media" / rel, np.full((5, 32, 32, 3), 90, np.uint8), 16, None, None)
    store.add_artifact(first.version_id, kind="video", role="shot", path=rel, url_path="/media/" + rel)
    store.mark_submitted(first.version_id, "run-first")
    store.update_status(first.version_id, status="succeeded")
    shots = [
        intake.accept_r2v(r2v(shot_id=f"s{i}"), None).job.version_id for i in range(2 * SUBMIT_BATCH + 3)
    ]
    merge_request = MergeRequest.model_validate({"work_id": "w", "shots": [{"version_id": first.version_id}]})
    merge = intake.accept_merge(merge_request, None).job.version_id

    gateway, stopping, more = QueuedRuns(), threading.Event(), threading.Event()
    submitter = Submitter(
        store, gateway, Callbacks(store, ApiConfig(), stopping), stopping, boot=0.0, more=more
    )
    submitter.submit_pending()  # one round: the merge (its kind's queue is shorter), the shots' oldest batch
    assert gateway.documents == [[merge], shots[:SUBMIT_BATCH]]
    assert more.is_set()  # more shots wait: the loop comes back at once
    late = intake.accept_r2v(r2v(shot_id="late"), None).job.version_id
    rounds = 1
    while more.is_set() and rounds < 10:  # as the background loop does
        more.clear()
        submitter.submit_pending()
        rounds += 1
    sent = [version for document in gateway.documents for version in document]
    assert sent == [merge, *shots[:SUBMIT_BATCH], *shots[SUBMIT_BATCH:], late]  # each kind in accept order
    assert rounds == 3 and all(store.get(v).run_id == f"run-{v}" for v in sent)
    assert store.unsubmitted() == []
