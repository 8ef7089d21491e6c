"""The OpenAI dialect without a running service: the SDK's form flattening undone, field
precedence and defaults, the frame grid, refusals naming their field, and the error envelope."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import io
import json
import threading
import time
import wave
from pathlib import Path
from uuid import uuid4

import httpx
import numpy as np
import openai
import pytest
from bare_api import bare_app
from fastapi.testclient import TestClient
from PIL import Image
from pydantic import ValidationError

from api.core.errors import InvalidField, NotFound, QueueFull
from api.core.jobs import JobService
from api.core.rules import RuleBook
from api.core.sampling import SamplingRule, job_sampling
from api.core.specs import SourceRef
from api.openai.errors import OpenAIError, validation_error
from api.openai.forms import FormError, unflatten
from api.openai.protocol import ServedModel, Video, VideoCreateRequest, VideoExtension, snap_frames
from api.store import JobRecord, NewJob, Store
from contracts.runs import SHOT_OP
from settings.api import ApiConfig, OpenAIConfig, SamplingLimits
from shotloom import stages
from shotloom.capabilities import Capabilities, CapabilityError
from shotloom.config import Performance, Sampler

WAN = Capabilities(
    max_reference_images=3,
    first_frame=True,
    last_frame=True,
    audio_in=False,
    audio_out=False,
    frame_multiple=4,
    size_multiple=16,
    fps=(16,),
    guidance_range=(1.0, 20.0),
)
MODEL = ServedModel(
    id="wan-tiny",
    family="wan",
    caps=WAN,
    width=64,
    height=64,
    num_frames=17,
    fps=16,
    sampling=SamplingRule.of(Sampler(), SamplingLimits(), WAN.guidance_range),
    max_seconds=15,
    max_width=1280,
    max_height=720,
    default_work="openai",
    created=0,
)


def spec(body: dict, operator: dict | None = None, uploads: dict[str, Path] | None = None):
    req = VideoCreateRequest.model_validate(body)
    op = VideoCreateRequest.model_validate({"prompt": "-", **operator}) if operator else None
    return req.to_spec(MODEL, operator=op, uploads=uploads or {}, version_id="a" * 32, seed=1)


def checked_spec(body: dict):
    """The shot a /v1 body makes, then the rule book's check of it (as the job service does)."""
    shot = spec(body)
    RuleBook(SamplingLimits()).check(shot, MODEL.caps)
    return shot


def test_unflatten_undoes_the_sdks_grouped_brackets():
    # The SDK groups repeated keys: element n's parts are the n-th of each key, not adjacent.
    items = [
        ("prompt", "p"),
        ("video_params[fps]", "16"),
        ("video_params[num_frames]", "9"),
        ("image_reference[][image_url]", "a"),
        ("image_reference[][image_url]", "b"),
        ("image_reference[][audio_url]", "a.wav"),
        ("image_reference[][audio_url]", "b.wav"),
        ("tags[]", "x"),
        ("tags[]", "y"),
    ]
    assert unflatten(items) == {
        "prompt": "p",
        "video_params": {"fps": "16", "num_frames": "9"},
        "image_reference": [
            {"image_url": "a", "audio_url": "a.wav"},
            {"image_url": "b", "audio_url": "b.wav"},
        ],
        "tags": ["x", "y"],
    }
    # Elements that give different fields: whose is the one audio_url? Refused, not guessed.
    with pytest.raises(FormError) as info:
        unflatten([*items[:5], *items[6:]])
    assert info.value.field == "image_reference" and "image_reference[0][audio_url]" in str(info.value)
    with pytest.raises(
        FormError
    ) as info:  # a list without indexes in one: [{b: [1, 2]}] or [{b: [1]}, {b: [2]}]?
        unflatten([("x[][b][]", "1"), ("x[][b][]", "2")])
    assert info.value.field == "x"
    assert unflatten([("x[0][b][]", "1"), ("x[0][b][]", "2")]) == {"x": [{"b": ["1", "2"]}]}
    assert unflatten([("a[1][k]", "v1"), ("a[0][k]", "v0")]) == {"a": [{"k": "v0"}, {"k": "v1"}]}
    with pytest.raises(FormError) as info:
        unflatten([("a[b", "x")])
    assert info.value.field == "a[b"
    with pytest.raises(FormError):
        unflatten([("a", "x"), ("a[k]", "y")])


def test_form_strings_mean_what_json_numbers_mean():
    as_json = spec({"prompt": "p", "seconds": 1, "video_params": {"fps": 16, "width": 32, "height": 48}})
    as_form = spec(
        {"prompt": "p", "seconds": "1", "video_params": {"fps": "16", "width": "32", "height": "48"}}
    )
    assert (as_json.width, as_json.height, as_json.num_frames, as_json.fps) == (32, 48, 17, 16)
    assert (as_form.width, as_form.height, as_form.num_frames, as_form.fps) == (32, 48, 17, 16)


def test_precedence_size_then_width_then_video_params_and_top_level_over_nested():
    s = spec(
        {
            "prompt": "p",
            "size": "64x32",
            "width": 16,
            "height": 16,
            "video_params": {"width": 48, "height": 48},
        }
    )
    assert (s.width, s.height) == (64, 32)
    s = spec({"prompt": "p", "width": 16, "height": 32, "video_params": {"width": 48, "height": 48}})
    assert (s.width, s.height) == (16, 32)
    s = spec({"prompt": "p", "num_frames": 5, "video_params": {"num_frames": 13}, "seconds": 10})
    assert s.num_frames == 5  # num_frames given: seconds does not decide
    s = spec({"prompt": "p", "video_params": {"num_frames": 13}})
    assert s.num_frames == 13


def test_client_fields_beat_operator_defaults_which_beat_the_preset():
    operator = {"size": "32x32", "seconds": 2, "seed": 5, "guidance_scale": 3.0}
    s = spec({"prompt": "p"}, operator)
    assert (s.width, s.height, s.num_frames, s.guidance_scale) == (32, 32, 33, 3.0)
    # The client's own spelling of a size (video_params) still beats the operator's size.
    s = spec({"prompt": "p", "video_params": {"width": 48, "height": 48}, "num_frames": 9}, operator)
    assert (s.width, s.height, s.num_frames) == (48, 48, 9)
    s = spec({"prompt": "p"})  # the preset
    assert (s.width, s.height, s.num_frames, s.fps, s.guidance_scale) == (64, 64, 17, 16, None)


@pytest.mark.parametrize(
    ("seconds", "fps", "frames"),
    [(1, 16, 17), (0.1, 16, 5), (2, 16, 33), (81 / 16, 16, 81), (80 / 16, 16, 81), (5, 24, 121)],
)
def test_seconds_snap_up_to_the_frame_grid(seconds, fps, frames):
    assert snap_frames(seconds, fps, 4) == frames
    assert (frames - 1) % 4 == 0 and frames >= seconds * fps


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"num_frames": 16}, "num_frames"),
        ({"size": "72x64"}, "size"),
        ({"width": 72, "height": 64}, "width"),
        ({"size": "1296x64"}, "size"),
        ({"width": 64}, "height"),
        ({"video_params": {"height": 64}}, "video_params.width"),  # past the server's max_width
        ({"width": 64, "height": 736}, "width"),  # past max_height (720)
        ({"video_params": {"width": 72, "height": 64}}, "video_params.width"),
        ({"video_params": {"fps": 24}}, "video_params.fps"),
        ({"seconds": 16}, "seconds"),
        ({"negative_prompt": "blur"}, "negative_prompt"),
        ({"lora": {"name": "x"}}, "lora"),
        ({"video_path": "/x.mp4", "video_url": "http://x/a.mp4"}, "video_path"),
        ({"image_reference": [{"file_id": "f"}]}, "image_reference[0].file_id"),
        # A keyframe is one image: audio or a video in it cannot be honoured.
        ({"first_frame": {"image_url": "data:a", "audio_url": "data:b"}}, "first_frame.audio_url"),
        ({"last_frame": {"image_url": "data:a", "audio_url": "data:b"}}, "last_frame.audio_url"),
        ({"input_reference": {"image_url": "data:a", "audio_url": "data:b"}}, "input_reference.audio_url"),
        ({"first_frame": {"video_url": "http://x/a.mp4"}}, "first_frame.video_url"),
        # An image_reference entry's video_url is the source video: alone in its entry, one per request.
        (
            {"image_reference": [{"video_url": "http://x/a.mp4", "image_url": "a"}]},
            "image_reference[0].image_url",
        ),
        (
            {"image_reference": [{"video_url": "http://x/a.mp4", "audio_url": "b"}]},
            "image_reference[0].audio_url",
        ),
        (
            {"image_reference": [{"video_url": "http://x/a.mp4", "file_id": "f"}]},
            "image_reference[0].file_id",
        ),
        (
            {"video_url": "http://x/a.mp4", "image_reference": [{"video_url": "v"}]},
            "image_reference[0].video_url",
        ),
        (
            {"image_reference": [{"video_url": "v"}, {"image_url": "a"}, {"video_url": "w"}]},
            "image_reference[2].video_url",
        ),
        ({"image_reference": [{"audio_url": "data:b"}]}, "image_reference[0]"),
        ({"first_frame": "data:,x", "reference_url": "http://x/a.png"}, "reference_url"),
    ],
)
def test_what_the_model_cannot_honour_is_refused_naming_the_field(body, param):
    with pytest.raises(InvalidField) as info:
        checked_spec({"prompt": "p", **body})
    assert info.value.field == param


def test_an_unknown_model_is_404_model_not_found():
    with pytest.raises(NotFound) as info:
        spec({"prompt": "p", "model": "sora-2"})
    err = OpenAIError.from_service(info.value)
    assert (err.status, err.param, err.code) == (404, "model", "model_not_found")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "prompt"),
        ({"prompt": "p", "seed": -1}, "seed"),
        ({"prompt": "p", "seed": 2**32}, "seed"),
        ({"prompt": "p", "seconds": "soon"}, "seconds"),
        ({"prompt": "p", "size": "64"}, "size"),
        ({"prompt": "p", "extra_params": {"vsa_mode": "x"}}, "extra_params.vsa_mode"),
        ({"prompt": "p", "first_frame": {"image_url": "a", "bogus": 1}}, "first_frame.bogus"),
        ({"prompt": "p", "whatever": 1}, "whatever"),
        ({"prompt": "p", "characters": ["char_1"]}, "characters[0]"),
    ],
)
def test_validation_errors_become_one_400_naming_the_field(body, param):
    with pytest.raises(ValidationError) as info:
        VideoCreateRequest.model_validate(body)
    err = validation_error(info.value)
    assert err.status == 400 and err.param == param and err.body()["error"]["type"] == "invalid_request_error"


def test_the_image_references_become_memory_slots_and_keyframes_inputs(tmp_path):
    upload = tmp_path / "first.png"
    s = spec(
        {
            "prompt": "p",
            "image_reference": [{"image_url": "data:a", "audio_url": "data:b"}],
            "last_frame": "data:c",
        },
        uploads={"input_reference": upload},
    )
    assert s.first_frame.field == "input_reference" and s.first_frame.upload == upload
    assert s.last_frame.value == "data:c"
    [slot] = s.memory
    assert (slot.field, slot.image.value, slot.audio.field) == (
        "image_reference[0]",
        "data:a",
        "image_reference[0].audio_url",
    )
    assert s.dialect == "openai" and s.work_id == "openai" and s.shot_id == "video_" + "a" * 32


@pytest.mark.parametrize(
    ("extra", "param"),
    [({"work_id": "../x"}, "extra_params.work_id"), ({"shot_id": "a//b"}, "extra_params.shot_id")],
)
def test_an_id_that_would_lead_out_of_the_media_store_is_400_naming_it(tmp_path, extra, param):
    store = Store(f"sqlite:///{tmp_path / 's.sqlite'}")
    jobs = JobService(store, ApiConfig(), tmp_path / "state", tmp_path / "media")
    with pytest.raises(InvalidField) as info:
        jobs.accept_shot(spec({"prompt": "p", "extra_params": extra}))
    err = OpenAIError.from_service(info.value)
    assert (err.status, err.param) == (400, param) and "segment" in err.message
    assert store.counts_by_status("r2v").get("queued", 0) == 0  # refused before anything was queued
    store.close()


def test_a_full_queue_is_429_with_a_retry_after(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 's.sqlite'}")
    jobs = JobService(store, ApiConfig(max_queue=1), tmp_path / "state", tmp_path / "media")
    store.accept(NewJob(kind="r2v", work_id="w", request={}, payload_hash="h"))
    with pytest.raises(QueueFull) as info:
        jobs.check_queue("r2v")
    err = OpenAIError.from_service(info.value)
    assert err.status == 429 and err.code == "queue_full" and err.headers["Retry-After"] == "60"

    # With finished jobs: the median job time less the running job's elapsed time, at least 2 s.
    now = time.time()
    for i, took in enumerate((30.0, 40.0, 50.0)):
        job = store.accept(NewJob(kind="r2v", work_id="w", request={}, payload_hash=f"d{i}")).job
        store.mark_submitted(job.version_id, f"run{i}")
        store.update_status(
            job.version_id,
            status="running",
            live={"stage_times": {"queued": now - 100, "claimed": now - took}},
        )
        store.update_status(job.version_id, status="succeeded")
    assert 38 <= jobs.retry_after_s() <= 41
    running = store.accept(NewJob(kind="r2v", work_id="w", request={}, payload_hash="r")).job
    store.update_status(running.version_id, status="running", live={"stage_times": {"claimed": now - 35}})
    assert 3 <= jobs.retry_after_s() <= 6
    store.update_status(running.version_id, live={"stage_times": {"claimed": now - 400}})
    assert jobs.retry_after_s() == 2
    store.close()


def test_unknown_fields_are_refused_or_with_the_warn_switch_logged_and_dropped(caplog):
    from api.openai.serving import parse_request

    body = {"prompt": "p", "vsa_sparsity": 0.5, "seed": 3}
    with pytest.raises(OpenAIError) as info:
        parse_request(body)
    assert (info.value.status, info.value.param) == (400, "vsa_sparsity")
    with caplog.at_level("WARNING", logger="shotloom.api.openai"):
        req = parse_request(body, "warn")
    assert req.seed == 3 and "vsa_sparsity" in caplog.text


def test_characters_count_against_the_reference_limit_and_the_refusal_names_what_went_over(tmp_path):
    # The tiny Wan VACE's limits (shotloom.families.wan): 7 references, and at most one per latent
    # frame, so 5 for 17 frames (1 s at 16 fps).
    tiny_wan = dataclasses.replace(WAN, max_reference_images=7, references_per_latent_frame=True)
    store = Store(f"sqlite:///{tmp_path / 's.sqlite'}")
    jobs = JobService(store, ApiConfig(), tmp_path / "state", tmp_path / "media")
    chars = ["char_" + f"{i:032x}" for i in range(3)]

    def refusal(images: int, characters: int, seconds: float = 1) -> str | None:
        body = {"prompt": "p", "seconds": seconds, "image_reference": [{"image_url": "data:x"}] * images}
        s = spec({**body, "characters": chars[:characters]} if characters else body)
        try:
            jobs.check_capabilities(s, tiny_wan)
        except InvalidField as exc:
            assert "reference images" in exc.message, exc.message
            return exc.field
        return None

    assert refusal(4, 1) is None  # 5: at the limit
    assert refusal(5, 1) == "characters"  # the images fit; the character goes over
    assert refusal(3, 3) == "characters"
    assert refusal(6, 0) == "image_reference"  # the images alone go over
    assert refusal(6, 1) == "image_reference"
    assert refusal(2, 3) is None
    # The model's own limit (7) with room in the frames (33 frames allow 9).
    assert refusal(7, 1, seconds=2) == "characters"
    assert refusal(8, 0, seconds=2) == "image_reference"
    store.close()


# -- issue 10 audit: reference objects, routing errors, progress, polling, ETA, gates, health -----
def test_an_image_reference_video_url_is_the_source_video_and_no_memory_slot():
    s = spec(
        {
            "prompt": "p",
            "strength": 0.5,
            "image_reference": [
                {"image_url": "data:a", "audio_url": "data:b"},
                {"video_url": {"url": "http://x/source.mp4"}},  # chat-style {"url"} too
                {"image_url": "data:c"},
            ],
        }
    )
    assert s.source.field == "image_reference[1].video_url"
    assert (s.source.video.field, s.source.video.value) == (
        "image_reference[1].video_url",
        "http://x/source.mp4",
    )
    assert s.strength == 0.5
    # The other entries stay memory slots under their own index; the audio is the slot's.
    assert [m.field for m in s.memory] == ["image_reference[0]", "image_reference[2]"]
    assert s.memory[0].audio.field == "image_reference[0].audio_url" and s.memory[1].audio is None
    # The same as the top-level video_url, which still works alone.
    top = spec({"prompt": "p", "video_url": "http://x/source.mp4"})
    assert (top.source.field, top.source.video.value) == ("video_url", "http://x/source.mp4")
    # A route that brings its own source (remix, edit) refuses a second one, naming it.
    req = VideoCreateRequest.model_validate({"prompt": "p", "image_reference": [{"video_url": "v"}]})
    with pytest.raises(InvalidField) as info:
        req.to_spec(
            MODEL,
            operator=None,
            uploads={},
            version_id="a" * 32,
            seed=1,
            source=SourceRef("video_id", version_id="b" * 32),
        )
    assert info.value.field == "image_reference[0].video_url"


def test_unknown_v1_routes_and_wrong_methods_answer_the_envelope_elsewhere_starlettes_shape(tmp_path):
    client, ctx = bare_app(tmp_path)
    resp = client.get("/v1/no-such-route")
    assert resp.status_code == 404
    assert resp.json() == {
        "error": {
            "message": "no route GET /v1/no-such-route",
            "type": "invalid_request_error",
            "param": None,
            "code": "not_found",
        }
    }
    resp = client.put("/v1/videos")
    assert resp.status_code == 405 and resp.headers["allow"] == "POST"
    error = resp.json()["error"]
    assert error["code"] == "method_not_allowed" and error["type"] == "invalid_request_error"
    assert "PUT" in error["message"] and "POST" in error["message"] and error["param"] is None
    assert client.get("/v1").json()["error"]["code"] == "not_found"
    # Outside /v1 the R2V side keeps Starlette's body (the same as /media's 404 on purpose).
    assert client.get("/no-such-route").json() == {"detail": "Not Found"}
    resp = client.put("/r2v")
    assert resp.status_code == 405 and resp.json() == {"detail": "Method Not Allowed"}
    ctx.store.close()


def test_create_answers_503_while_not_ready_and_501_naming_a_missing_encoder(tmp_path, monkeypatch):
    import api.openai.serving as serving

    client, ctx = bare_app(tmp_path)
    body = {"prompt": "p", "size": "64x64"}
    resp = client.post("/v1/videos", json=body)
    assert resp.status_code == 503
    assert resp.json()["error"] == {
        "message": "the service is starting",
        "type": "server_error",
        "param": None,
        "code": "unavailable",
    }
    ctx.background.started = True
    monkeypatch.setattr(serving, "missing_encoders", lambda: ["libx264"])
    for path in ("/v1/videos", "/v1/videos/generations", "/v1/videos/sync"):
        resp = client.post(path, json=body)
        assert resp.status_code == 501, path
        error = resp.json()["error"]
        assert (error["code"], error["type"]) == ("encoder_missing", "server_error")
        assert "libx264" in error["message"] and "H.264" in error["message"]
    monkeypatch.setattr(serving, "missing_encoders", lambda: ["libx264", "aac"])
    assert "libx264 and aac" in client.post("/v1/videos", json=body).json()["error"]["message"]
    # Encoders there, no worker has loaded the model yet: 503 again, saying so.
    monkeypatch.setattr(serving, "missing_encoders", lambda: [])
    resp = client.post("/v1/videos", json=body)
    assert resp.status_code == 503 and "not loaded" in resp.json()["error"]["message"]
    assert ctx.store.counts_by_status("r2v")["queued"] == 0  # nothing was queued
    ctx.store.close()


def _job(**fields) -> JobRecord:
    base = {
        "version_id": "a" * 32,
        "kind": "r2v",
        "work_id": "w",
        "shot_id": None,
        "job_id": None,
        "payload_hash": "h",
        "request": {},
        "callback_url": None,
        "callback_context": None,
        "status": "running",
        "stage": stages.INFERRING,
        "error": None,
        "run_id": "run",
        "root_run_id": None,
        "submitted_at": None,
        "created_at": 0.0,
        "updated_at": 0.0,
        "finished_at": None,
        "result": None,
        "live": {},
        "dialect": "openai",
    }
    return JobRecord(**{**base, **fields})


def test_progress_milestones_queued_encoded_denoised_decoded_written():
    from api.openai.serving import _progress

    def report(stage, done, total):
        return {"progress": {"stage": stage, "done": done, "total": total}}

    seen = [
        _progress(_job(status="queued", stage=stages.QUEUED), 4),
        _progress(_job(stage=stages.CLAIMED), 4),
        _progress(_job(stage=stages.CONDITIONING), 4),  # the prompt is being encoded
        _progress(_job(stage=stages.LOADING_GENERATOR), 4),  # encoded
        _progress(_job(stage=stages.INFERRING), 4),  # no step reported yet
        _progress(_job(live=report(stages.INFERRING, 1, 4)), 4),
        _progress(_job(live=report(stages.INFERRING, 2, 4)), 4),
        _progress(_job(live=report(stages.INFERRING, 4, 4)), 4),
        _progress(_job(stage=stages.DECODING, live=report(stages.INFERRING, 4, 4)), 4),
        _progress(_job(stage=stages.DECODING, live=report(stages.DECODING, 1, 3)), 4),
        _progress(_job(stage=stages.DECODING, live=report(stages.DECODING, 3, 3)), 4),
        _progress(_job(stage=stages.WRITING), 4),
        _progress(_job(stage=stages.MERGING), 4),  # an extension stitched after its source
        _progress(_job(status="succeeded", stage=stages.SUCCEEDED), 4),
    ]
    assert seen == [
        (0, 0),
        (0, 0),
        (0, 0),
        (5, 0),
        (5, 0),
        (26, 1),  # 5 + 85 * 1/4
        (47, 2),
        (90, 4),
        (90, 4),
        (93, 4),  # 90 + 9 * 1/3
        (99, 4),
        (99, 4),
        (99, 4),
        (100, 4),
    ]
    assert [p for p, _ in seen] == sorted(p for p, _ in seen)
    # A report past its total (or garbage) never goes past the milestone.
    assert _progress(_job(live=report(stages.INFERRING, 9, 4)), 4) == (90, 4)


def _video(status: str, eta: float | None) -> Video:
    return Video(
        id="video_" + "a" * 32,
        model="m",
        status=status,
        progress=0,
        created_at=0,
        seconds="1",
        size="64x64",
        shotloom=VideoExtension(eta_s=eta),
    )


def test_poll_after_ms_is_shorter_as_the_job_nears_its_end():
    from api.openai.serving import POLL_MAX_MS, POLL_MIN_MS, POLL_QUEUED_MS, VideoServing

    poll = VideoServing.poll_after_ms
    assert poll(_video("queued", 30.0)) == POLL_QUEUED_MS == 2000
    assert poll(_video("completed", 0.0)) == poll(_video("failed", None)) == POLL_MAX_MS
    assert poll(_video("in_progress", None)) == 1000  # no ETA yet
    waits = [poll(_video("in_progress", eta)) for eta in (60.0, 8.0, 4.0, 2.0, 0.5, 0.0)]
    assert waits == [2000, 2000, 1000, 500, POLL_MIN_MS, POLL_MIN_MS]  # a quarter of the ETA, bounded


def test_stage_durations_medians_and_the_time_worked():
    from api.core.timing import WAITING, stage_durations, stage_medians, working_seconds

    times = {"claimed": 100.0, "waiting_for_memory": 101.0, "validating": 111.0, "inferring": 112.0}
    assert stage_durations({**times, "decoding": 120.0, "succeeded": 123.0}, 124.0) == {
        "claimed": 1.0,
        "waiting_for_memory": 10.0,
        "validating": 1.0,
        "inferring": 8.0,
        "decoding": 3.0,  # until the terminal stamp, which itself takes no time
    }
    # A running job: its current stage has no end yet. Stages go in the order they were entered
    # (a resumed run is "recovered" after its first inferring).
    assert list(stage_durations({"claimed": 1.0, "inferring": 2.0, "recovered": 5.0}, None)) == [
        "claimed",
        "inferring",
    ]
    assert stage_durations({"claimed": 1.0, "inferring": 2.0, "recovered": 5.0}, None)["inferring"] == 3.0
    # Waits are no work: the queue and a wait for memory are left out of the time worked.
    assert WAITING == {"queued", "waiting_for_memory"}
    durations = {"queued": 30.0, "claimed": 1.0, "waiting_for_memory": 10.0, "inferring": 8.0, "writing": 1.0}
    assert working_seconds(durations) == 10.0
    # Medians per stage; a job that skipped a stage counts 0 for it (alternatives are not summed twice).
    samples = [
        {"inferring": 10.0, "keeping_generator_on_gpu": 1.0},
        {"inferring": 20.0, "staging_generator_on_cpu": 5.0},
        {"inferring": 12.0, "keeping_generator_on_gpu": 1.0},
    ]
    assert stage_medians(samples) == {
        "keeping_generator_on_gpu": 1.0,
        "staging_generator_on_cpu": 0.0,
        "inferring": 12.0,
    }
    assert stage_medians([]) == {}


def test_the_sync_headers_report_the_time_worked_not_the_waits():
    from api.openai.serving import sync_headers

    video = _video("completed", 0.0)
    video.shotloom.stage_timings = {
        "waiting_for_memory": 30.0,
        "claimed": 0.5,
        "inferring": 2.0,
        "writing": 0.25,
    }
    video.shotloom.peak_memory_mb = 123.44
    headers = sync_headers(video)
    assert headers["X-Inference-Time-S"] == "2.750"
    assert json.loads(headers["X-Stage-Durations"])["waiting_for_memory"] == 30.0  # still listed
    assert (headers["X-Request-Id"], headers["X-Model"], headers["X-Peak-Memory-MB"]) == (
        video.id,
        "m",
        "123.4",
    )


MEDIANS = {
    "claimed": 1.0,
    "validating": 1.0,
    "conditioning": 2.0,
    "inferring": 8.0,
    "decoding": 2.0,
    "writing": 1.0,
}


@pytest.mark.parametrize(
    ("status", "stage", "live", "position", "eta"),
    [
        ("queued", "queued", {}, 1, 15.0),  # a whole job
        ("queued", "queued", {}, 3, 30.0),  # two devices: the third waits one round
        ("queued", "queued", {}, 5, 45.0),
        ("running", "queued", {}, None, 15.0),  # started, no stage stamped yet
        # The stages after the current one, and the part of it its progress has not done.
        ("running", "inferring", {"progress": {"stage": "inferring", "done": 3, "total": 4}}, None, 5.0),
        ("running", "inferring", {"progress": {"stage": "inferring", "done": 0, "total": 4}}, None, 11.0),
        ("running", "decoding", {"progress": {"stage": "decoding", "done": 1, "total": 2}}, None, 2.0),
        # No report for the current stage: its median less the time since it was entered.
        ("running", "conditioning", {"stage_times": {"conditioning": 999.5}}, None, 12.5),
        ("running", "conditioning", {"stage_times": {"conditioning": 900.0}}, None, 11.0),
        ("running", "writing", {}, None, 1.0),
        ("running", "succeeded", {}, None, 0.0),
        ("succeeded", "succeeded", {}, None, 0.0),
        ("failed", "failed", {}, None, None),
        ("cancelled", "canceled", {}, None, None),
    ],
)
def test_eta_from_the_stage_medians_of_earlier_jobs(status, stage, live, position, eta):
    from api.core.timing import eta_s

    got = eta_s(status, stage, live, MEDIANS, position=position, devices=2, now=1000.0)
    assert got == eta


def test_eta_falls_back_to_the_whole_job_median_then_to_none():
    from api.core.timing import eta_s

    live = {"stage_times": {"claimed": 990.0, "inferring": 995.0}}
    assert eta_s("running", "inferring", live, {}, whole_s=30.0, now=1000.0) == 20.0  # 30 less 10 s
    assert eta_s("queued", "queued", {}, {}, position=2, whole_s=30.0, now=1000.0) == 60.0
    assert eta_s("running", "inferring", live, {}, now=1000.0) is None  # nothing measured yet
    assert eta_s("queued", "queued", {}, {}, now=1000.0) is None


def test_get_video_carries_the_poll_header_and_an_eta_from_earlier_jobs(tmp_path):
    client, ctx = bare_app(tmp_path)
    store = ctx.store
    t0 = time.time() - 100
    earlier = store.accept(
        NewJob(kind="r2v", work_id="w", request={}, payload_hash="e", dialect="openai")
    ).job
    stamps = {"claimed": 0, "validating": 1, "inferring": 2, "decoding": 10, "writing": 12, "succeeded": 13}
    store.update_status(
        earlier.version_id,
        status="succeeded",
        stage="succeeded",
        live={"stage_times": {s: t0 + t for s, t in stamps.items()}},
    )
    assert ctx.jobs.stage_seconds() == {
        "claimed": 1.0,
        "validating": 1.0,
        "inferring": 8.0,
        "decoding": 2.0,
        "writing": 1.0,
    }
    job = store.accept(NewJob(kind="r2v", work_id="w", request={}, payload_hash="r", dialect="openai")).job
    vid = f"video_{job.version_id}"
    resp = client.get(f"/v1/videos/{vid}")
    assert resp.status_code == 200 and resp.json()["status"] == "queued"
    assert resp.headers["openai-poll-after-ms"] == "2000"
    assert resp.json()["shotloom"]["eta_s"] == 13.0  # one whole job: the sum of the stage medians
    store.update_status(
        job.version_id,
        status="running",
        stage="inferring",
        live={
            "stage_times": {"claimed": time.time() - 5, "inferring": time.time() - 1},
            "progress": {"stage": "inferring", "done": 3, "total": 4},
        },
    )
    resp = client.get(f"/v1/videos/{vid}")
    body = resp.json()
    assert (body["status"], body["progress"], body["shotloom"]["step"]) == ("in_progress", 68, 3)
    assert body["shotloom"]["eta_s"] == 5.0  # a quarter of inferring (2 s), decoding 2 s, writing 1 s
    assert resp.headers["openai-poll-after-ms"] == "1250"  # a quarter of the ETA
    assert client.get("/v1/videos/video_" + "0" * 32).json()["error"]["code"] == "not_found"
    store.close()


def test_health_is_starting_then_ok_then_degraded_when_a_worker_is_gone(tmp_path, monkeypatch):
    from api.admin.health import health_status

    ready = {"api": True, "webserver": True, "daemon": True, "workers": True, "media_workers": True}
    idle = [{"state": "idle"}]
    assert health_status(ready, idle, was_ok=False) == "ok"
    down = {**ready, "workers": False}
    assert health_status(down, [{"state": "warming"}], was_ok=False) == "starting"
    assert health_status(down, [{"state": "unregistered"}], was_ok=False) == "starting"
    for gone in ("unreachable", "stopped", "stopping"):
        assert health_status(down, [{"state": "idle"}, {"state": gone}], was_ok=False) == "degraded"
    assert health_status({**ready, "daemon": False}, idle, was_ok=True) == "degraded"  # was up, now not
    assert health_status({**ready, "api": False}, [{"state": "unreachable"}], was_ok=False) == "starting"

    # The route: 200 only when ok, 503 with the status otherwise.
    client, ctx = bare_app(tmp_path)
    monkeypatch.setattr(ctx.gateway, "ping", lambda: True)
    monkeypatch.setattr(ctx.gateway, "daemon_healthy", lambda: True)
    ctx.worker_names = ["w0", "w1"]
    ctx.background.workers = {"w0": {"pool": "device", "state": "warming"}}

    def get():
        ctx.health_cache = None
        resp = client.get("/health")
        return resp.status_code, resp.json()["status"]

    assert get() == (503, "starting")  # the API has not started
    ctx.background.started = True
    assert get() == (503, "starting")  # w0 warming, w1 not registered yet
    ctx.background.workers = {n: {"pool": "device", "state": "idle"} for n in ("w0", "w1")}
    assert get() == (503, "starting")  # no media worker on any host yet: no shot could finish
    ctx.background.workers["media-0"] = {"pool": "media", "state": "idle"}  # registered on some host
    assert get() == (200, "ok")
    ctx.background.workers["w1"] = {"pool": "device", "state": "unreachable"}
    assert get() == (503, "degraded")
    ctx.background.workers["w1"] = {"pool": "device", "state": "idle"}
    assert get() == (200, "ok")
    monkeypatch.setattr(ctx.gateway, "daemon_healthy", lambda: False)
    assert get() == (503, "degraded")  # the daemon went away after the service was up
    ctx.store.close()


# -- issue 22: steps and guidance per request, within the sampler's and the server's limits -------
NATIVE = Sampler(mode="native", steps=3, guidance_scale=1.0)
DRAFT = Sampler(mode="dmd", sigmas=[1.0, 0.5])  # a distill adapter's own sampler: 2 steps


def _sampling_jobs(
    tmp_path, base: Sampler = NATIVE, performance: Performance | None = None, step_caches=None
) -> JobService:
    limits = SamplingLimits(max_steps=8, guidance_scale=(1.0, 12.0), step_caches=step_caches)
    return JobService(
        Store(f"sqlite:///{tmp_path / 's.sqlite'}"),
        ApiConfig(sampling=limits),
        tmp_path / "state",
        tmp_path / "media",
        capabilities=lambda: dataclasses.asdict(dataclasses.replace(WAN, adapters=("draft", "anime"))),
        sampler_for=lambda adapter: DRAFT if adapter == "draft" else base,
        performance=performance,
    )


def _sampling_model(jobs: JobService) -> ServedModel:
    return dataclasses.replace(
        MODEL,
        sampling=jobs.sampling(None),
        adapters={"draft": 1.0, "anime": 1.0},
        adapter_sampling={"draft": jobs.sampling("draft")},
    )


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"num_inference_steps": 9}, "num_inference_steps", "within [1, 8]"),  # the server's max_steps
        ({"guidance_scale": 12.5}, "guidance_scale", "within [1, 12]"),  # the server's, inside WAN's 20
        ({"guidance_scale": 0.5}, "guidance_scale", "within [1, 12]"),
        # A distill adapter runs its own 2 steps: by lora or by the adapter's model id.
        ({"num_inference_steps": 5, "lora": {"name": "draft"}}, "num_inference_steps", "of 2 steps, got 5"),
        ({"num_inference_steps": 3, "model": "draft"}, "num_inference_steps", "adapter 'draft'"),
    ],
)
def test_steps_and_guidance_outside_the_limits_are_400_naming_the_field(tmp_path, body, param, words):
    jobs = _sampling_jobs(tmp_path)
    req = VideoCreateRequest.model_validate({"prompt": "p", **body})
    s = req.to_spec(_sampling_model(jobs), operator=None, uploads={}, version_id="a" * 32, seed=1)
    with pytest.raises(InvalidField) as info:
        jobs.accept_shot(s)
    err = OpenAIError.from_service(info.value)
    assert (err.status, err.param) == (400, param) and words in err.message, err.message
    assert jobs.store.counts_by_status("r2v")["queued"] == 0  # nothing queued
    jobs.store.close()


def test_a_native_model_honours_the_requests_steps_and_guidance_into_the_run_config(tmp_path):
    jobs = _sampling_jobs(tmp_path)
    model = _sampling_model(jobs)

    def accepted(body: dict, operator: dict | None = None) -> dict:
        req = VideoCreateRequest.model_validate({"prompt": "p", **body})
        op = VideoCreateRequest.model_validate({"prompt": "-", **operator}) if operator else None
        s = req.to_spec(model, operator=op, uploads={}, version_id=uuid4().hex, seed=1)
        return jobs.accept_shot(s).job

    job = accepted({"num_inference_steps": 8, "guidance_scale": 2.0, "negative_prompt": "blur"})
    config = job.request["run_config"]["ops"]["condition_op"]["config"]
    assert (config["num_inference_steps"], config["guidance_scale"]) == (8, 2.0)
    assert job_sampling(job, jobs.sampling) == {
        "mode": "native",
        "num_inference_steps": 8,
        "guidance_scale": 2.0,
        "step_cache": "none",  # the model has no default step cache
    }
    # Unasked: the run config leaves them to the sampler; the job reads its defaults.
    job = accepted({})
    config = job.request["run_config"]["ops"]["condition_op"]["config"]
    assert "num_inference_steps" not in config and "guidance_scale" not in config
    assert job_sampling(job, jobs.sampling)["num_inference_steps"] == 3
    # The adapter's own count; the operator's default_request between the client and the preset.
    job = accepted({"lora": {"name": "draft"}, "num_inference_steps": 2})
    assert job_sampling(job, jobs.sampling) == {
        "mode": "dmd",
        "num_inference_steps": 2,
        "guidance_scale": 1.0,
        "step_cache": "none",
    }
    job = accepted({}, operator={"num_inference_steps": 6})
    assert job.request["run_config"]["ops"]["condition_op"]["config"]["num_inference_steps"] == 6
    # negative_prompt needs guidance: the adapter's default (1.0) has none.
    with pytest.raises(InvalidField) as info:
        accepted({"negative_prompt": "blur"})
    assert info.value.field == "negative_prompt"
    jobs.store.close()


def test_a_distilled_model_refuses_any_other_step_count_whatever_the_limit(tmp_path):
    jobs = _sampling_jobs(tmp_path, base=Sampler())  # dmd, 4 sigmas
    model = _sampling_model(jobs)
    for steps, refused in ((4, False), (3, True), (5, True)):
        req = VideoCreateRequest.model_validate({"prompt": "p", "num_inference_steps": steps})
        s = req.to_spec(model, operator=None, uploads={}, version_id=uuid4().hex, seed=1)
        if refused:
            with pytest.raises(InvalidField) as info:
                jobs.accept_shot(s)
            assert info.value.field == "num_inference_steps"
            assert "distilled schedule of 4 steps" in info.value.message
        else:
            jobs.accept_shot(s)
    jobs.store.close()


def test_models_say_the_sampler_mode_defaults_and_limits_of_the_model_and_each_adapter(tmp_path):
    # The shipped tiny Wan: native 8 steps, CFG 5, a first-block step cache (no default); a 4-step
    # distill adapter.
    client, ctx = bare_app(tmp_path)
    cards = {card["id"]: card for card in client.get("/v1/models").json()["data"]}
    native = {
        "mode": "native",
        "num_inference_steps": 8,
        "guidance_scale": 5.0,
        "step_cache": "none",
        "step_caches": {"fbc": {"kind": "first_block", "threshold": 0.2}},
        # No worker has published the family's guidance range yet: the server's api.sampling alone.
        "limits": {
            "num_inference_steps": {"min": 1, "max": 100},
            "guidance_scale": {"min": 1.0, "max": 20.0},
            "step_cache": ["none", "fbc"],  # the server's api.sampling lets every preset through
        },
    }
    base = cards["wan-tiny"]
    assert base["sampling"] == native and base["defaults"]["num_inference_steps"] == 8
    adapters = {a["name"]: a for a in base["adapters"]}
    assert "sampling" not in adapters["wan-tiny-anime"]  # the model's sampler
    draft = adapters["wan-tiny-distill"]["sampling"]
    assert (draft["mode"], draft["num_inference_steps"], draft["guidance_scale"]) == ("dmd", 4, 1.0)
    assert draft["limits"]["num_inference_steps"] == {"min": 4, "max": 4}
    assert draft["limits"]["step_cache"] == ["none", "fbc"]  # step caches are the model's, any adapter's
    card = client.get("/v1/models/wan-tiny-distill").json()
    assert card["parent"] == "wan-tiny" and card["sampling"] == draft
    assert (card["defaults"]["num_inference_steps"], card["defaults"]["guidance_scale"]) == (4, 1.0)
    assert client.get("/v1/models/wan-tiny-noir").json()["sampling"] == native
    ctx.store.close()


def test_a_jobs_status_says_the_steps_and_guidance_it_runs_with_and_its_eta_scales_with_them(tmp_path):
    client, ctx = bare_app(tmp_path)
    store, now = ctx.store, time.time()
    ctx.worker_names = ["cpu-0", "cpu-1", "cpu-2"]  # the three queued jobs start at once

    def job(config: dict, **status):
        run_config = {"ops": {"condition_op": {"config": {"prompt": "p", **config}}}}
        new = NewJob(
            kind="r2v",
            work_id="w",
            request={"run_config": run_config},
            payload_hash=uuid4().hex,
            dialect="openai",
        )
        made = store.accept(new).job
        if status:
            store.update_status(made.version_id, **status)
        return made.version_id

    # An earlier shot: 4 s inferring for 4 steps without guidance, 1 s a DiT call.
    stamps = {"claimed": 0, "inferring": 1, "decoding": 5, "writing": 6, "succeeded": 7}
    job(
        {},
        status="succeeded",
        stage="succeeded",
        live={"stage_times": {s: now - 100 + t for s, t in stamps.items()}},
        result={"num_inference_steps": 4, "guidance_scale": 1.0, "sampler": {"mode": "native"}},
    )
    asked = job({"num_inference_steps": 12, "guidance_scale": 3.0})  # 24 DiT calls
    # Its adapter's sampler: 4 dmd steps, no guidance; a step cache of the model's (any adapter's).
    draft = job({"lora": "wan-tiny-distill", "step_cache": "fbc"})
    default = job({})  # the model's: 8 native steps with CFG 5 (16 DiT calls)

    def ext(version_id: str) -> dict:
        return client.get(f"/v1/videos/video_{version_id}").json()["shotloom"]

    def summary(e: dict) -> tuple:
        return e["steps"], e["guidance_scale"], e["sampler_mode"], e["eta_s"]

    # Queued: the ETA is the stages' medians with inferring at the job's own DiT calls.
    assert summary(ext(asked)) == (12, 3.0, "native", 1 + 24 + 1 + 1)
    assert summary(ext(draft)) == (4, 1.0, "dmd", 1 + 4 + 1 + 1)
    assert summary(ext(default)) == (8, 5.0, "native", 1 + 16 + 1 + 1)
    # The step cache: asked, else the model's default (none here).
    assert (ext(draft)["step_cache"], ext(default)["step_cache"], ext(asked)["step_cache"]) == (
        "fbc",
        "none",
        "none",
    )
    # What the run recorded wins once it succeeded; GET /version says the same.
    store.update_status(
        asked,
        status="succeeded",
        stage="succeeded",
        result={
            "num_inference_steps": 12,
            "guidance_scale": 3.0,
            "sampler": {"mode": "native"},
            "step_cache": "fbc",  # whatever the run recorded
        },
    )
    assert summary(ext(asked))[:3] == (12, 3.0, "native") and ext(asked)["step_cache"] == "fbc"
    version = client.get(f"/version/{asked}").json()
    assert (
        version["num_inference_steps"],
        version["guidance_scale"],
        version["sampler_mode"],
        version["step_cache"],
    ) == (12, 3.0, "native", "fbc")
    assert client.get(f"/version/{default}").json()["step_cache"] == "none"
    ctx.store.close()


def test_the_v1_document_gives_the_step_counts_and_guidance_the_samplers_take(tmp_path):
    from api.openapi import constrain

    client, ctx = bare_app(tmp_path)
    doc = client.get("/v1/openapi.json").json()  # no worker yet: unconstrained

    def limits(model: ServedModel) -> tuple[dict, dict]:
        props = constrain(doc, model)["components"]["schemas"]["VideoCreateRequest"]["properties"]
        (steps,) = [b for b in props["num_inference_steps"]["anyOf"] if b.get("type") == "integer"]
        (guidance,) = [b for b in props["guidance_scale"]["anyOf"] if b.get("type") == "number"]
        return steps, guidance

    native = _sampling_model(_sampling_jobs(tmp_path / "native"))
    steps, guidance = limits(native)
    assert (steps["minimum"], steps["maximum"]) == (1, 8)  # the distill adapter's 2 is inside
    assert (guidance["minimum"], guidance["maximum"]) == (1.0, 12.0)
    distilled = _sampling_model(_sampling_jobs(tmp_path / "dmd", base=Sampler()))
    assert limits(distilled)[0]["enum"] == [2, 4]  # the model's 4 steps, the adapter's 2
    ctx.store.close()


# -- issue 23: a step cache per request, among the model's presets the server offers --------------
CACHES = Performance.model_validate(
    {
        "step_caches": {
            "fbc": {"kind": "first_block", "threshold": 0.2},
            "taylor": {"kind": "taylorseer", "cache_identifiers": ["^blocks\\.\\d+$"]},
            "fast": {"kind": "first_block", "threshold": 0.4},
        },
        "step_cache": "fast",
    }
)


def test_the_step_caches_a_request_may_ask_for_are_the_models_the_server_lets_through():
    every = SamplingRule.of(NATIVE, SamplingLimits(), None, CACHES)
    assert every.step_caches == ("none", "fbc", "taylor", "fast") and every.step_cache == "fast"
    # A server list narrows them ("unknown": no preset of the model); the default always stays.
    some = SamplingRule.of(NATIVE, SamplingLimits(step_caches=["taylor", "unknown"]), None, CACHES)
    assert some.step_caches == ("none", "taylor", "fast")
    assert SamplingRule.of(NATIVE, SamplingLimits(step_caches=[])).step_caches == ("none",)
    some.check(None, None, "taylor")
    some.check(None, None, "none")
    some.check(None, None, None)  # the default
    for asked, words in (("fbc", "not offered on this server"), ("unknown", "unknown step cache")):
        with pytest.raises(CapabilityError) as info:
            some.check(None, None, asked)
        assert info.value.field == "step_cache" and words in info.value.message, info.value.message
    described = some.describe()
    assert described["step_cache"] == "fast"
    assert described["step_caches"]["fbc"] == {"kind": "first_block", "threshold": 0.2}
    assert described["limits"]["step_cache"] == ["none", "taylor", "fast"]


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"step_cache": "mag"}, "unknown step cache 'mag'"),  # the model declares no such preset
        ({"step_cache": "taylor"}, "not offered on this server"),  # declared, not in api.sampling
        ({"step_cache": "taylor", "lora": {"name": "draft"}}, "not offered on this server"),
        ({"step_cache": "mag", "model": "draft"}, "unknown step cache"),
    ],
)
def test_a_step_cache_the_model_or_server_does_not_offer_is_400_naming_step_cache(tmp_path, body, words):
    jobs = _sampling_jobs(tmp_path, performance=CACHES, step_caches=["fbc"])
    req = VideoCreateRequest.model_validate({"prompt": "p", **body})
    s = req.to_spec(_sampling_model(jobs), operator=None, uploads={}, version_id="a" * 32, seed=1)
    with pytest.raises(InvalidField) as info:
        jobs.accept_shot(s)
    err = OpenAIError.from_service(info.value)
    assert (err.status, err.param) == (400, "step_cache") and words in err.message, err.message
    assert jobs.store.counts_by_status("r2v")["queued"] == 0  # nothing queued
    jobs.store.close()


def op_config(job: JobRecord) -> dict:
    """The shot op's config in the run config Dagster gets, as the job's record stores it."""
    return job.request.op_config(SHOT_OP) or {}


def test_a_requests_step_cache_goes_into_the_run_config_and_the_jobs_sampling(tmp_path):
    jobs = _sampling_jobs(tmp_path, performance=CACHES, step_caches=["fbc"])
    model = _sampling_model(jobs)

    def accepted(body: dict, operator: dict | None = None) -> JobRecord:
        req = VideoCreateRequest.model_validate({"prompt": "p", **body})
        op = VideoCreateRequest.model_validate({"prompt": "-", **operator}) if operator else None
        s = req.to_spec(model, operator=op, uploads={}, version_id=uuid4().hex, seed=1)
        return jobs.accept_shot(s).job

    for asked in ("fbc", "none", "fast"):  # an offered preset, none, the model's default
        job = accepted({"step_cache": asked})
        assert op_config(job)["step_cache"] == asked
        assert job_sampling(job, jobs.sampling)["step_cache"] == asked
    # Unasked: left to the engine (the model's default), which the job reads meanwhile.
    job = accepted({})
    assert "step_cache" not in op_config(job)
    assert job_sampling(job, jobs.sampling)["step_cache"] == "fast"
    # An adapter (with its own sampler) takes the model's presets; the operator's default_request too.
    job = accepted({"lora": {"name": "draft"}, "step_cache": "fbc"})
    assert (op_config(job)["step_cache"], job_sampling(job, jobs.sampling)["mode"]) == ("fbc", "dmd")
    assert op_config(accepted({}, operator={"step_cache": "none"}))["step_cache"] == "none"
    assert op_config(accepted({"step_cache": "fbc"}, operator={"step_cache": "none"}))["step_cache"] == "fbc"
    jobs.store.close()


def test_images_take_a_step_cache_as_videos_do(tmp_path):
    from api.openai.images import AS_VIDEO, ImageRequest

    req = ImageRequest.model_validate({"prompt": "p", "step_cache": "fbc"})
    video = VideoCreateRequest.model_validate(req.model_dump(include=AS_VIDEO, exclude_none=True))
    assert video.to_spec(MODEL, operator=None, uploads={}, version_id="a" * 32, seed=1).step_cache == "fbc"
    with pytest.raises(ValidationError):
        ImageRequest.model_validate({"prompt": "p", "step_cache": ""})


def test_the_v1_document_lists_the_step_caches_the_server_offers(tmp_path):
    from api.openapi import constrain

    client, ctx = bare_app(tmp_path)
    doc = client.get("/v1/openapi.json").json()  # no worker yet: documented, unconstrained
    for name in ("VideoCreateRequest", "ImageRequest"):
        assert "step cache" in doc["components"]["schemas"][name]["properties"]["step_cache"]["description"]
    model = _sampling_model(_sampling_jobs(tmp_path / "jobs", performance=CACHES, step_caches=["fbc"]))
    schemas = constrain(doc, model)["components"]["schemas"]
    for name in ("VideoCreateRequest", "VideoCreateForm", "VideoEditRequest"):
        prop = schemas[name]["properties"]["step_cache"]
        (branch,) = [b for b in prop.get("anyOf", [prop]) if b.get("type") == "string"]
        assert branch["enum"] == ["none", "fbc", "fast"], name
    ctx.store.close()


# -- form bodies: limits, part sizes, list pairing; final failures not retried ----------------------
def _ready_app(tmp_path, monkeypatch, caps: Capabilities = WAN, **openai_cfg):
    """:func:`_bare_app` that accepts videos (started, encoders there, the model loaded), with
    ``openai_cfg`` in the server's ``api.openai``."""
    import api.openai.serving as serving

    api = ApiConfig(openai=OpenAIConfig(**openai_cfg))
    client, ctx = bare_app(tmp_path, api, capabilities=lambda: dataclasses.asdict(caps))
    ctx.background.started = True
    monkeypatch.setattr(serving, "missing_encoders", lambda: [])
    return client, ctx


def _sdk(client: TestClient, **kwargs) -> openai.OpenAI:
    """The stock SDK, its requests going through ``client`` (the app in process)."""
    return openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=client, **kwargs)


def _png_url(size: int, seed: int = 0) -> tuple[str, str]:
    """A PNG of noise as a data URL, and the PNG's sha256."""
    pixels = np.random.default_rng(seed).integers(0, 255, (size, size, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "PNG")
    png = buf.getvalue()
    return "data:image/png;base64," + base64.b64encode(png).decode(), hashlib.sha256(png).hexdigest()


def _wav_url(level: int) -> tuple[str, str]:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16000)
        out.writeframes(bytes([level, 0]) * 1600)
    wav = buf.getvalue()
    return "data:audio/wav;base64," + base64.b64encode(wav).decode(), hashlib.sha256(wav).hexdigest()


def _inputs(client: TestClient, video: dict) -> dict:
    """The inputs a /v1 video's job recorded (by field: the image's and audio's sha256)."""
    version = client.get(f"/version/{video['shotloom']['version_id']}").json()
    return {
        field: tuple((used.get(kind) or {}).get("sha256") for kind in ("image", "audio"))
        for field, used in version["request"]["inputs"].items()
    }


def _multipart(fields: dict[str, str], boundary: str = "shotloom-test") -> bytes:
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'
        for name, value in fields.items()
    ]
    return ("".join(parts) + f"--{boundary}--\r\n").encode()


@pytest.mark.parametrize("kind", ["json", "form"])
@pytest.mark.parametrize(
    ("limits", "stall", "status", "code", "words"),
    [
        ({"body_idle_timeout_s": 0.3}, True, 408, "request_timeout", "sent nothing for 0.3 s"),
        ({"max_body_bytes": 64 * 1024}, False, 413, "payload_too_large", f"passed {64 * 1024} bytes"),
        ({"store_max_bytes": 1024 * 1024}, False, 413, "payload_too_large", "the job store has"),
    ],
    ids=["stalls", "past-max-body-bytes", "past-the-store-room"],
)
def test_a_form_that_stalls_or_overruns_its_limits_is_408_or_413_as_a_json_body_is(
    tmp_path, monkeypatch, kind, limits, stall, status, code, words
):
    # Sent without a length (chunked), so the limits are met while the body is read, not before.
    client, ctx = _ready_app(tmp_path, monkeypatch, **limits)
    text = "x" * (200 * 1024)
    if kind == "json":
        body, content_type = json.dumps({"prompt": text, "size": "64x64"}).encode(), "application/json"
    else:
        body = _multipart({"size": "64x64", "prompt": text})
        content_type = "multipart/form-data; boundary=shotloom-test"
    if stall:
        body = body[: len(body) // 2]  # half of it, then nothing

    async def chunks():
        for at in range(0, len(body), 16 * 1024):
            yield body[at : at + 16 * 1024]
        if stall:
            await asyncio.sleep(30)

    async def post() -> httpx.Response:
        transport = httpx.ASGITransport(app=client.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
            return await http.post("/v1/videos", content=chunks(), headers={"content-type": content_type})

    started = time.monotonic()
    resp = asyncio.run(post())
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert error["code"] == code and words in error["message"], error
    assert time.monotonic() - started < 10
    assert ctx.retention.free_bytes() == ctx.api.openai.store_max_bytes  # its room was given back
    assert ctx.store.counts_by_status("r2v")["queued"] == 0
    ctx.store.close()


def test_a_form_text_field_takes_a_data_url_as_large_as_a_json_body_may(tmp_path, monkeypatch):
    # A 1.6 MB data URL: past Starlette's 1 MiB default for a form part, inside the body limit.
    client, ctx = _ready_app(tmp_path, monkeypatch)
    url, digest = _png_url(640)
    assert 1024 * 1024 < len(url) < ctx.api.openai.max_body_bytes
    body = {"prompt": "p", "size": "64x64", "seconds": "1", "image_reference": [{"image_url": url}]}
    as_json = client.post("/v1/videos", json=body)
    assert as_json.status_code == 200, as_json.text
    sdk = _sdk(client, max_retries=0)
    # The SDK sends videos.create as multipart, extra_body's reference as a text part.
    as_form = sdk.videos.create(
        prompt="p", size="64x64", seconds="1", extra_body={"image_reference": body["image_reference"]}
    )
    assert as_form.status == "queued"
    expected = {"image_reference[0]": (digest, None)}
    assert _inputs(client, as_json.json()) == _inputs(client, as_form.model_dump()) == expected
    ctx.store.close()


def test_an_sdk_form_list_whose_items_give_different_fields_is_refused_naming_the_field(
    tmp_path, monkeypatch
):
    client, ctx = _ready_app(tmp_path, monkeypatch, caps=dataclasses.replace(WAN, audio_in=True))
    sdk = _sdk(client, max_retries=0)
    (a, a_sha), (b, b_sha), (c, c_sha) = (_png_url(16, seed) for seed in range(3))
    (wa, wa_sha), (wc, wc_sha) = _wav_url(1), _wav_url(3)
    refs = [{"image_url": a, "audio_url": wa}, {"image_url": b}, {"image_url": c, "audio_url": wc}]
    # The SDK sends image_reference[][image_url] x3 and image_reference[][audio_url] x2: whose is wc?
    with pytest.raises(openai.BadRequestError) as info:
        sdk.videos.create(prompt="p", size="64x64", seconds="1", extra_body={"image_reference": refs})
    error = info.value.body
    assert (error["param"], error["code"], error["type"]) == (
        "image_reference",
        "invalid_multipart",
        "invalid_request_error",
    )
    assert "JSON" in error["message"] and "image_reference[0][audio_url]" in error["message"]
    assert ctx.store.counts_by_status("r2v")["queued"] == 0  # nothing queued
    paired = {
        "image_reference[0]": (a_sha, wa_sha),
        "image_reference[1]": (b_sha, None),
        "image_reference[2]": (c_sha, wc_sha),
    }
    # The same list as JSON, or as a form with indexed keys, says whose each part is.
    as_json = client.post("/v1/videos", json={"prompt": "p", "size": "64x64", "image_reference": refs})
    assert as_json.status_code == 200, as_json.text
    assert _inputs(client, as_json.json()) == paired
    indexed = {
        f"image_reference[{i}][{name}]": value for i, ref in enumerate(refs) for name, value in ref.items()
    }
    as_form = sdk.videos.create(prompt="p", size="64x64", seconds="1", extra_body=indexed)
    assert _inputs(client, as_form.model_dump()) == paired
    # Items that all give the same fields still pair by position.
    same = [{"image_url": a, "audio_url": wa}, {"image_url": c, "audio_url": wc}]
    video = sdk.videos.create(prompt="p", size="64x64", seconds="1", extra_body={"image_reference": same})
    assert _inputs(client, video.model_dump()) == {
        "image_reference[0]": (a_sha, wa_sha),
        "image_reference[1]": (c_sha, wc_sha),
    }
    ctx.store.close()


def _counting(client: TestClient, seen: list[tuple[str, str]]) -> TestClient:
    """A client of the same app that records each request the server gets."""
    app = client.app

    async def counted(scope, receive, send):
        if scope["type"] == "http":
            seen.append((scope["method"], scope["path"]))
        await app(scope, receive, send)

    return TestClient(counted)


def test_a_failed_videos_retrieve_is_asked_once_by_the_sdk_not_retried(tmp_path):
    client, ctx = bare_app(tmp_path)
    job = ctx.store.accept(
        NewJob(kind="r2v", work_id="w", request={}, payload_hash="f", dialect="openai")
    ).job
    ctx.store.update_status(job.version_id, status="failed", stage="failed", error="out of memory")
    vid = f"video_{job.version_id}"
    seen: list[tuple[str, str]] = []
    sdk = _sdk(_counting(client, seen))  # the SDK's default max_retries (2)
    assert sdk.max_retries == 2
    for ask in (sdk.videos.retrieve, sdk.videos.poll):
        seen.clear()
        with pytest.raises(openai.InternalServerError) as info:
            ask(vid)
        assert info.value.status_code == 500
        assert (
            info.value.body["code"] == "generation_failed" and "out of memory" in info.value.body["message"]
        )
        assert seen == [("GET", f"/v1/videos/{vid}")], seen  # once: a failure is final
        assert info.value.response.headers["x-should-retry"] == "false"
    ctx.store.close()


@pytest.mark.parametrize("outcome", ["failed", "timeout"])
def test_sync_answers_that_end_a_request_tell_the_sdk_not_to_retry(tmp_path, monkeypatch, outcome):
    # A retried POST /v1/videos/sync would queue the clip again.
    client, ctx = _ready_app(tmp_path, monkeypatch, sync_timeout_seconds=0.5)
    stop = threading.Event()

    def fail_queued():  # the "worker": fails each job it finds queued
        while not stop.is_set():
            jobs, _ = ctx.store.list_jobs("openai", after=None, limit=10, order="asc")
            for j in jobs:
                if j.status == "queued":
                    ctx.store.update_status(j.version_id, status="failed", stage="failed", error="boom")
            time.sleep(0.05)

    worker = threading.Thread(target=fail_queued, daemon=True)
    if outcome == "failed":
        worker.start()
    seen: list[tuple[str, str]] = []
    sdk = _sdk(_counting(client, seen))
    try:
        with pytest.raises(openai.APIStatusError) as info:
            sdk.post(
                "/videos/sync", body={"prompt": "p", "size": "64x64", "seconds": "1"}, cast_to=httpx.Response
            )
    finally:
        stop.set()
        if worker.is_alive():
            worker.join()
    assert info.value.status_code == (500 if outcome == "failed" else 504)
    assert seen == [("POST", "/v1/videos/sync")], seen
    assert info.value.response.headers["x-should-retry"] == "false"
    jobs, _ = ctx.store.list_jobs("openai", after=None, limit=10, order="asc")
    assert len(jobs) == 1  # queued once
    ctx.store.close()


def test_a_body_nested_past_reason_is_400_not_a_server_error(tmp_path):
    client, ctx = bare_app(tmp_path)
    deep = b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    resp = client.post("/v1/videos", content=deep, headers={"content-type": "application/json"})
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_json"
    key = "extra_params" + "[a]" * 40
    resp = client.post("/v1/videos", data={"prompt": "p", key: "x"})
    assert resp.status_code == 400 and "nests deeper than 16" in resp.json()["error"]["message"]
    ctx.store.close()


def test_an_upload_named_past_what_a_filesystem_takes_is_spooled_under_a_cut_name(tmp_path, monkeypatch):
    from PIL import Image

    client, ctx = _ready_app(tmp_path, monkeypatch)
    image = tmp_path / "f.png"
    Image.new("RGB", (64, 64), (200, 10, 10)).save(image)
    name = "a" * 300 + ".png"  # one name part past NAME_MAX (255 bytes): an OSError, a 500 before
    with image.open("rb") as f:
        part = {"input_reference": (name, f, "image/png")}
        resp = client.post("/v1/videos", data={"prompt": "p"}, files=part)
    assert resp.status_code == 200, resp.text
    assert resp.json()["status"] == "queued"
    ctx.store.close()
