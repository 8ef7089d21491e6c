"""The OpenAI dialect without a running service: the SDK's form flattening undone, field
precedence and defaults, the frame grid, refusals naming their field, and the error envelope."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from api.core.errors import InvalidField, NotFound, QueueFull
from api.core.jobs import JobService
from api.openai.errors import OpenAIError, validation_error
from api.openai.forms import FormError, unflatten
from api.openai.protocol import ServedModel, VideoCreateRequest, snap_frames
from api.store import NewJob, Store
from shotloom.api_config import ApiConfig
from shotloom.capabilities import Capabilities

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
    steps=4,
    guidance_scale=1.0,
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


def test_unflatten_undoes_the_sdks_grouped_brackets():
    # The SDK groups repeated keys: element n's parts are the n-th of each key, not adjacent.
    items = [
        ("prompt", "p"),
        ("video_params[fps]", "16"),
        ("video_params[num_frames]", "9"),
        ("image_reference[][image_url]", "a"),
        ("image_reference[][image_url]", "b"),
        ("image_reference[][audio_url]", "a.wav"),
        ("tags[]", "x"),
        ("tags[]", "y"),
    ]
    assert unflatten(items) == {
        "prompt": "p",
        "video_params": {"fps": "16", "num_frames": "9"},
        "image_reference": [{"image_url": "a", "audio_url": "a.wav"}, {"image_url": "b"}],
        "tags": ["x", "y"],
    }
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
        ({"num_inference_steps": 8}, "num_inference_steps"),
        ({"guidance_scale": 0.5}, "guidance_scale"),
        ({"negative_prompt": "blur"}, "negative_prompt"),
        ({"lora": {"name": "x"}}, "lora"),
        ({"video_path": "/x.mp4", "video_url": "http://x/a.mp4"}, "video_path"),
        ({"image_reference": [{"file_id": "f"}]}, "image_reference[0].file_id"),
        ({"image_reference": [{"video_url": "http://x/a.mp4"}]}, "image_reference[0].video_url"),
        ({"first_frame": "data:,x", "reference_url": "http://x/a.png"}, "reference_url"),
    ],
)
def test_what_the_model_cannot_honour_is_refused_naming_the_field(body, param):
    with pytest.raises(InvalidField) as info:
        spec({"prompt": "p", **body})
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
