"""Request models of the R2V scheduler contract: slot rules, strict fields, the merge envelope, 422s."""

from __future__ import annotations

import pytest
from bare_api import r2v_refusal

from api.r2v.protocol import (
    AcceptedResponse,
    ArtifactResponse,
    MergeRequest,
    R2VRequest,
    error_field,
    iso_time,
    validation_error_body,
)
from api.store import payload_hash


def _r2v(**over) -> dict:
    body = {"work_id": "demo", "shot_id": "shot-002", "prompt": "rain", "memory_slots": []}
    body.update(over)
    return body


def test_spec_example_is_accepted_and_normalized():
    req = R2VRequest.model_validate(
        _r2v(
            job_id="demo-shot-002-v1",
            condition_img="/absolute/path/to/first-frame.png",
            memory_slots=[
                {"shot_id": "shot-001"},
                {"image_url": "https://x/a.png", "audio_url": "https://x/a.wav"},
                {"image_url": "data:image/png;base64,AAAA", "audio_mode": "empty"},
                {"image_url": "file:///refs/b.png"},
            ],
            num_frames=241,
            width=1280,
            height=736,
            seed=42,
            duration_sec=10,
            callback_url="https://director/cb",
            callback_context={"k": 1},
        )
    )
    n = req.normalized()
    assert n["memory_slots"][0] == {"shot_id": "shot-001"}
    assert n["memory_slots"][2] == {"image_url": "data:image/png;base64,AAAA", "audio_mode": "empty"}
    assert "seed" in n and "duration_sec" in n
    idem = req.idempotency_payload()
    assert idem["kind"] == "r2v" and "callback_url" not in idem and "job_id" not in idem
    # Unset optional fields don't change the hash; a different prompt does.
    a = R2VRequest.model_validate(_r2v()).idempotency_payload()
    b = R2VRequest.model_validate(_r2v(seed=None, condition_img=None)).idempotency_payload()
    c = R2VRequest.model_validate(_r2v(prompt="snow")).idempotency_payload()
    assert payload_hash(a) == payload_hash(b) != payload_hash(c)
    assert req.effective_callback_url() == "https://director/cb"
    assert req.effective_callback_url("http://header/cb") == "http://header/cb"


@pytest.mark.parametrize(
    ("slots", "field", "fragment"),
    [
        ([{}], "memory_slots[0]", "exactly one of shot_id, image_url"),
        ([{"shot_id": "a", "image_url": "https://x/a.png"}], "memory_slots[0]", "exactly one"),
        (
            [{"shot_id": "a"}, {"shot_id": "b", "audio_url": "https://x/a.wav"}],
            "memory_slots[1].audio_url",
            "beside",
        ),
        ([{"shot_id": "a", "audio_mode": "empty"}], "memory_slots[0].audio_mode", "beside image_url"),
        (
            [{"image_url": "https://x/a.png", "audio_url": "https://x/a.wav", "audio_mode": "empty"}],
            "memory_slots[0].audio_mode",
            "not both",
        ),
        ([{"image_url": "https://x/a.png", "audio_mode": "loud"}], "memory_slots[0].audio_mode", "'empty'"),
        (
            [{"image_url": "https://x/a.png", "image_mode": "first"}],
            "memory_slots[0].image_mode",
            "unsupported",
        ),
        ([{"image_url": "https://x/a.png", "image_mode": None}], "memory_slots[0].image_mode", "unsupported"),
        ([{"image_url": "https://x/a.png", "weight": 2}], "memory_slots[0].weight", "Extra inputs"),
        ([{"image_url": ""}], "memory_slots[0].image_url", "at least 1"),
    ],
)
def test_slot_rules(slots, field, fragment):
    body = r2v_refusal(R2VRequest, _r2v(memory_slots=slots))
    assert body["detail"][0]["field"] == field, body
    assert fragment in body["detail"][0]["msg"]
    assert body["error"].startswith(field + ": ")


def test_image_mode_message_is_exact():
    body = r2v_refusal(R2VRequest, _r2v(memory_slots=[{"image_url": "https://x/a.png", "image_mode": "x"}]))
    assert body["error"] == "memory_slots[0].image_mode: image_mode is unsupported"


def test_seven_slots_allowed_eight_rejected():
    seven = [{"shot_id": f"s{i}"} for i in range(7)]
    assert len(R2VRequest.model_validate(_r2v(memory_slots=seven)).memory_slots) == 7
    body = r2v_refusal(R2VRequest, _r2v(memory_slots=[*seven, {"shot_id": "s7"}]))
    assert body["detail"][0]["field"] == "memory_slots" and "at most 7" in body["detail"][0]["msg"]


@pytest.mark.parametrize(
    ("over", "field"),
    [
        ({"prompt": ""}, "prompt"),
        ({"prompt": "   "}, "prompt"),
        ({"num_frames": 0}, "num_frames"),
        ({"num_frames": -5}, "num_frames"),
        ({"num_frames": "17"}, "num_frames"),
        ({"num_frames": 17.0}, "num_frames"),
        ({"width": True}, "width"),
        ({"height": 0}, "height"),
        ({"duration_sec": 0}, "duration_sec"),
        ({"seed": "42"}, "seed"),
        ({"seed": 2**64}, "seed"),  # torch.manual_seed would overflow in the worker, after queueing
        ({"seed": 2**32}, "seed"),
        ({"seed": -1}, "seed"),
        ({"seed": True}, "seed"),
        ({"callback_url": "ftp://x/cb"}, "callback_url"),
        ({"callback_context": [1]}, "callback_context"),
        ({"surprise": 1}, "surprise"),
        ({"work_id": ""}, "work_id"),
        ({"num_inference_steps": 0}, "num_inference_steps"),
        ({"num_inference_steps": "8"}, "num_inference_steps"),
        ({"num_inference_steps": 8.0}, "num_inference_steps"),
        ({"guidance_scale": "2"}, "guidance_scale"),
        ({"guidance_scale": -1}, "guidance_scale"),
        ({"step_cache": ""}, "step_cache"),
        ({"step_cache": 1}, "step_cache"),
        ({"step_cache": ["fbc"]}, "step_cache"),
    ],
)
def test_strict_fields(over, field):
    assert r2v_refusal(R2VRequest, _r2v(**over))["detail"][0]["field"] == field


def test_seed_is_bounded_as_the_v1_dialect_bounds_it():
    from api.core.limits import MAX_SEED
    from api.openai.protocol import MAX_SEED as V1_MAX_SEED

    assert MAX_SEED == V1_MAX_SEED == 2**32
    for seed in (0, 42, MAX_SEED - 1):
        assert R2VRequest.model_validate(_r2v(seed=seed)).seed == seed
    body = r2v_refusal(R2VRequest, _r2v(seed=MAX_SEED))
    assert body["detail"][0]["field"] == "seed" and body["error"].startswith("seed: ")


def test_required_fields():
    body = r2v_refusal(R2VRequest, {"work_id": "w"})
    assert {d["field"] for d in body["detail"]} == {"shot_id", "prompt", "memory_slots"}


def test_merge_flat_and_envelope_normalize_alike():
    flat = MergeRequest.model_validate(
        {
            "work_id": "demo",
            "job_id": "demo-merge-v1",
            "shots": [{"version_id": "8d1d"}, {"video_url": "https://example.com/shot-003.mp4"}],
            "callback_url": "https://director/cb",
        }
    )
    envelope = MergeRequest.model_validate(
        {
            "payload": {
                "work_id": "demo",
                "shots": [{"version_id": "8d1d"}, {"video_url": "https://example.com/shot-003.mp4"}],
                "title": "ignored envelope extra",
            },
            "job": {"job_id": "demo-merge-v1", "type": "merge"},
            "callback": {"url": "https://director/cb"},
        }
    )
    assert flat.normalized() == envelope.normalized()
    assert envelope.normalized() == {
        "work_id": "demo",
        "job_id": "demo-merge-v1",
        "shots": [{"version_id": "8d1d"}, {"video_url": "https://example.com/shot-003.mp4"}],
        "callback_url": "https://director/cb",
    }
    assert payload_hash(flat.idempotency_payload()) == payload_hash(envelope.idempotency_payload())
    assert envelope.effective_callback_url("https://header/cb") == "https://header/cb"


def test_merge_shot_prefers_version_id_and_rules():
    req = MergeRequest.model_validate(
        {"work_id": "w", "shots": [{"version_id": "v1", "video_url": "https://x/a.mp4"}]}
    )
    assert req.normalized()["shots"] == [{"version_id": "v1"}]
    # "When both are present, version_id is used": a video_url beside it is not looked at.
    both = MergeRequest.model_validate(
        {"work_id": "w", "shots": [{"version_id": "v1", "video_url": "/a.mp4"}]}
    )
    assert both.normalized()["shots"] == [{"version_id": "v1"}]
    assert r2v_refusal(MergeRequest, {"work_id": "w", "shots": [{}]})["detail"][0]["field"] == "shots[0]"
    assert (
        r2v_refusal(MergeRequest, {"work_id": "w", "shots": [{"video_url": "/local/a.mp4"}]})["detail"][0][
            "field"
        ]
        == "shots[0].video_url"
    )
    assert "shots" in r2v_refusal(MergeRequest, {"work_id": "w", "shots": []})["error"]
    assert "work_id is required" in r2v_refusal(MergeRequest, {"shots": [{"version_id": "v"}]})["error"]
    conflict = r2v_refusal(
        MergeRequest, {"job_id": "a", "job": {"job_id": "b"}, "work_id": "w", "shots": [{"version_id": "v"}]}
    )
    assert "job_id and job.job_id disagree" in conflict["error"]
    assert (
        r2v_refusal(MergeRequest, {"work_id": "w", "shots": [{"version_id": "v"}], "x": 1})["detail"][0][
            "field"
        ]
        == "x"
    )
    nested = r2v_refusal(MergeRequest, {"payload": {"work_id": "w", "shots": [{"video_url": "nope"}]}})
    assert nested["detail"][0]["field"] == "payload.shots[0].video_url"


def test_error_helpers_and_fastapi_style_locations():
    assert error_field(("body", "memory_slots", 1, "audio_url")) == "memory_slots[1].audio_url"
    assert error_field(()) == "body"
    body = validation_error_body(
        [{"loc": ("body", "memory_slots", 2, "image_url"), "msg": "Value error, bad", "type": "value_error"}]
    )
    assert body == {
        "detail": [
            {
                "field": "memory_slots[2].image_url",
                "loc": ["body", "memory_slots", 2, "image_url"],
                "msg": "bad",
                "type": "value_error",
            }
        ],
        "error": "memory_slots[2].image_url: bad",
    }


def test_response_shapes():
    art = ArtifactResponse(
        artifact_id="a1",
        version_id="v1",
        work_id="w",
        kind="video",
        role="output",
        url="http://h/media/x.mp4",
    )
    accepted = AcceptedResponse(
        kind="r2v",
        task_id="v1",
        version_id="v1",
        remote_task_id="v1",
        work_id="w",
        job_id=None,
        shot_id="s",
        status="queued",
        stage="queued",
        queue_position=1,
        status_url="http://h/version/v1",
        artifacts=[art],
    )
    dumped = accepted.model_dump()
    assert dumped["accepted"] is True and dumped["artifacts"][0]["url"].endswith(".mp4")
    assert "path" not in dumped["artifacts"][0]
    assert iso_time(0.0) == "1970-01-01T00:00:00Z" and iso_time(None) is None
