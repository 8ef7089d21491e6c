"""Guides in the OpenAI dialect without a running service: the multipart ``guides`` field parsed
into the shot (frames from the end resolved), the job service decoding, measuring and checking
each guide at admission, and every refusal naming its field."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from pydantic import ValidationError
from test_guides import clip, tone
from test_openai_protocol import MODEL, WAN

from api.core.errors import InvalidField
from api.core.jobs import JobService
from api.openai.errors import validation_error
from api.openai.protocol import ServedModel, VideoCreateRequest
from api.store import Store
from settings.api import ApiConfig
from shotloom.capabilities import Capabilities

# The protocol tests' model, with the guide capabilities of the two families.
WAN_VACE = replace(WAN, max_reference_images=7, guidance_range=(1.0, 10.0), frame_guides=True)
LTX2 = replace(
    WAN_VACE,
    audio_in=True,
    audio_out=True,
    frame_multiple=8,
    size_multiple=32,
    fps=(24,),
    max_audio_references=1,
    audio_guides=True,
)
WAN_T2V = replace(WAN_VACE, max_reference_images=0, first_frame=False, last_frame=False, frame_guides=False)


def served(caps: Capabilities) -> ServedModel:
    family = "ltx2" if caps.audio_guides else "wan"
    return replace(MODEL, id="tiny", family=family, caps=caps, fps=caps.fps[0])


def spec(
    body: dict, uploads: dict[str, Path] | None = None, caps: Capabilities = WAN_VACE, version: str = "a"
):
    req = VideoCreateRequest.model_validate({"prompt": "p", **body})
    return req.to_spec(served(caps), operator=None, uploads=uploads or {}, version_id=version * 32, seed=1)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("uploads")
    Image.fromarray(np.full((48, 80, 3), (200, 40, 90), np.uint8)).save(root / "guide.png")
    (root / "notes.txt").write_text("no image, no video, no sound")
    return {
        "image": root / "guide.png",
        "tone": tone(root / "steps.wav", 1.0),
        "wan_clip": clip(root / "wan.mp4", 4, 16, with_audio=True),
        "ltx_clip": clip(root / "ltx.mp4", 9, 24, with_audio=True),
        "text": root / "notes.txt",
    }


# -- the request ----------------------------------------------------------------------------------
def test_the_form_field_is_json_and_frames_count_from_the_end(files):
    uploads = {"guide_0": files["image"], "steps": files["tone"]}
    body = {
        "guides": '[{"file": "guide_0", "frame": -1}, {"file": "steps", "frame": 8, "kind": "audio"}]',
        "guide_no_audio": "true",
    }
    s = spec(body, uploads, LTX2)
    image, sound = s.guides
    assert (image.field, image.frame, image.kind, image.file.upload) == (
        "guides[0]",
        16,
        "video",
        files["image"],
    )
    assert (sound.field, sound.frame, sound.kind, sound.file.upload) == (
        "guides[1]",
        8,
        "audio",
        files["tone"],
    )
    assert s.guide_no_audio is True
    assert s.client["guides"][1] == {"file": "steps", "frame": 8, "kind": "audio"}  # as the client sent it
    # The SDK's bracketed spelling means the same; the same file may anchor two frames.
    entries = [{"file": "guide_0", "frame": "0"}, {"file": "guide_0", "frame": "-9"}]
    s = spec({"guides": entries}, {"guide_0": files["image"]})
    assert [(g.frame, g.kind) for g in s.guides] == [(0, "video"), (8, "video")]


@pytest.mark.parametrize(
    ("body", "uploads", "param"),
    [
        # A JSON body has no file parts: its guides name none that exists.
        ({"guides": [{"file": "guide_0", "frame": 0}]}, {}, "guides[0].file"),
        ({"guides": '[{"file": "guide_1", "frame": 0}]'}, {"guide_0": "image"}, "guides[0].file"),
        (
            {"guides": '[{"file": "input_reference", "frame": 0}]'},
            {"input_reference": "image"},
            "guides[0].file",
        ),
        ({"guides": '[{"file": "guide_0", "frame": 17}]'}, {"guide_0": "image"}, "guides[0].frame"),
        ({"guides": '[{"file": "guide_0", "frame": -18}]'}, {"guide_0": "image"}, "guides[0].frame"),
        ({}, {"guide_0": "image"}, "guide_0"),  # a file part named nowhere
    ],
)
def test_what_the_request_gets_wrong_is_refused_naming_the_field(files, body, uploads, param):
    with pytest.raises(InvalidField) as info:
        spec(body, {name: files[key] for name, key in uploads.items()})
    assert info.value.field == param


@pytest.mark.parametrize(
    ("guides", "param"),
    [
        ("[]", "guides"),  # as the JSON body's "guides": "[]"
        ("not json", "guides"),
        ('[{"file": "g", "frame": 1, "kind": "image"}]', "guides[0].kind"),
        ('[{"file": "g"}]', "guides[0].frame"),
        ('[{"file": "g", "frame": 1.5}]', "guides[0].frame"),
        ('[{"file": "", "frame": 1}]', "guides[0].file"),
        ('[{"file": "g", "frame": 1, "at": 2}]', "guides[0].at"),
        ([{"file": "g", "frame": i} for i in range(17)], "guides"),
    ],
)
def test_malformed_guides_are_one_400_naming_the_field(guides, param):
    with pytest.raises(ValidationError) as info:
        VideoCreateRequest.model_validate({"prompt": "p", "guides": guides})
    err = validation_error(info.value)
    assert (err.status, err.param) == (400, param), err.message


# -- admission: decoded, measured and checked before anything is queued ---------------------------
@pytest.fixture
def service(tmp_path):
    def make(caps: Capabilities) -> JobService:
        store = Store(f"sqlite:///{tmp_path / f'{id(caps)}.sqlite'}")
        jobs = JobService(
            store, ApiConfig(), tmp_path / "state", tmp_path / "media", capabilities=lambda: asdict(caps)
        )
        made.append(store)
        return jobs

    made: list[Store] = []
    yield make
    for store in made:
        store.close()


def guides_body(*entries: tuple[str, int, str], **extra) -> dict:
    return {"guides": json.dumps([{"file": f, "frame": n, "kind": k} for f, n, k in entries]), **extra}


def test_guides_are_stored_and_reach_the_run_config(service, files):
    jobs = service(WAN_VACE)
    uploads = {"guide_0": files["image"], "guide_1": files["wan_clip"]}
    s = spec(guides_body(("guide_0", -9, "video"), ("guide_1", 2, "video")), uploads)
    job = jobs.accept_shot(s).job
    config = job.request["run_config"]["ops"]["condition_op"]["config"]
    image, video = config["guides"]
    assert (image["frame"], image["kind"], image["with_audio"]) == (8, "video", False)
    # The clip's sound stays out: Wan takes no sound (as a character's audio does).
    assert (video["frame"], video["kind"], video["with_audio"]) == (2, "video", False)
    assert Path(image["path"]).is_file() and Path(video["path"]).suffix == ".mp4"
    inputs = job.request["inputs"]
    assert inputs["guides[0]"]["media_type"] == "image/png" and inputs["guides[0]"]["frame"] == 8
    assert config["lineage"]["inputs"]["guides[1]"]["sha256"] == inputs["guides[1]"]["sha256"]


@pytest.mark.parametrize(
    ("caps", "entries", "uploads", "extra", "param"),
    [
        (WAN_VACE, [("g", 4, "audio")], {"g": "text"}, {}, "guides[0].kind"),  # refused before it is read
        (WAN_T2V, [("g", 4, "video")], {"g": "image"}, {}, "guides[0]"),  # no frame conditioning
        (WAN_VACE, [("g", 0, "video")], {"g": "text"}, {}, "guides[0]"),  # neither image nor video
        (WAN_VACE, [("g", 14, "video")], {"g": "wan_clip"}, {}, "guides[0]"),  # 4 frames from 14 of 17
        (WAN_VACE, [("g", 0, "video")], {"g": "image", "input_reference": "image"}, {}, "guides[0].frame"),
        (LTX2, [("g", 0, "audio")], {"g": "image"}, {}, "guides[0]"),  # no sound in it
        (LTX2, [("g", 0, "audio")], {"g": "tone"}, {"memory": True}, "guides[0]"),  # a second track
        (LTX2, [("v", 0, "video"), ("g", 12, "audio")], {"v": "ltx_clip", "g": "tone"}, {}, "guides[1]"),
    ],
)
def test_admission_refusals_name_the_guide(service, files, caps, entries, uploads, extra, param):
    jobs = service(caps)
    body = guides_body(*entries)
    if extra.get("memory"):
        body["image_reference"] = [{"image_url": "data:x", "audio_url": "data:y"}]
    s = spec(body, {name: files[key] for name, key in uploads.items()}, caps)
    with pytest.raises(InvalidField) as info:
        jobs.accept_shot(s)
    assert info.value.field == param, info.value.message
    assert jobs.store.counts_by_status("r2v")["queued"] == 0  # nothing queued


def test_a_guide_videos_sound_is_a_track_unless_guide_no_audio(service, files):
    jobs = service(LTX2)
    uploads = {"v": files["ltx_clip"], "g": files["tone"]}
    entries = (("v", 0, "video"), ("g", 12, "audio"))
    job = jobs.accept_shot(spec(guides_body(*entries, guide_no_audio=True), uploads, LTX2)).job
    video, sound = job.request["run_config"]["ops"]["condition_op"]["config"]["guides"]
    assert (video["with_audio"], sound["kind"], sound["frame"]) == (False, "audio", 12)
    alone = jobs.accept_shot(spec(guides_body(entries[0]), {"v": files["ltx_clip"]}, LTX2, "b")).job
    assert alone.request["run_config"]["ops"]["condition_op"]["config"]["guides"][0]["with_audio"] is True
