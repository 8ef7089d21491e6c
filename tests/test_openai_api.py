"""The OpenAI-compatible video API (/v1), driven by the official ``openai`` SDK and by raw HTTP,
on the tiny Wan checkpoint sampled natively, as its authors would (its own UniPC scheduler, 3 steps
by default; a distill adapter samples dmd).

The API is served in the test process on the in-process Dagster gateway (``inprocess_dagster``:
runs executed for real on one device and the media lanes), one stack for the module; tests run in
file order. What only real worker processes show (a worker surviving a cancel with its weights,
each worker loading the base weights once) runs at the end on the whole stack started by
server.py (2 CPU workers). Every finished video is downloaded and decoded back (MP4 with PyAV,
stills with Pillow).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import socket
import time

import httpx
import numpy as np
import openai
import pytest
import yaml
from PIL import Image

from shotloom.media import probe, read_frames

from api_stack import ApiStack, start_api_stack, stop_api_stack, wait_for

MODEL = "wan-test"
KEY = "sk-test-0123456789"  # the stack runs with API keys: every request below carries one


def png_bytes(seed: int = 0, size: int = 64) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (size, size, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def data_url(seed: int = 0) -> str:
    return "data:image/png;base64," + base64.b64encode(png_bytes(seed)).decode()


def stack_options(root, wan_checkpoint) -> dict:
    """The server YAML's choices (and the key the client sends) of both stacks below."""
    from shotloom.families.weights import build_tiny_lora

    # LoRA adapters listed in the server YAML (real diffusers LoRA files, random weights); the last
    # a distill LoRA with its own sampler (2 dmd steps), as a 4-step draft adapter would be.
    adapters = [
        {"name": "anime", "path": str(build_tiny_lora(wan_checkpoint, root / "anime", seed=1))},
        {"name": "noir", "path": str(build_tiny_lora(wan_checkpoint, root / "noir", seed=2)), "scale": 0.5},
        {
            "name": "draft",
            "path": str(build_tiny_lora(wan_checkpoint, root / "draft", seed=3)),
            "sampler": {"mode": "dmd", "sigmas": [1.0, 0.5]},
        },
    ]
    keys = root / "keys.yaml"
    keys.write_text(yaml.safe_dump({"studio-a": KEY, "studio-b": "sk-other-9876543210"}))
    return dict(
        api={
            "openai": {
                "served_model_name": MODEL,
                "default_work": "sdk-work",
                "max_body_bytes": 2 * 1024 * 1024,
                "body_idle_timeout_s": 2,
                "default_request": {"seconds": 0.5},  # the operator's default length
                "sync_timeout_seconds": 10,
            },
            "auth": {"key_file": str(keys)},
            "sampling": {"max_steps": 8},  # guidance: the default [1, 20], within Wan's [1, 10]
        },
        authorization=KEY,
        adapters=adapters,
        sampler={"mode": "native", "steps": 3, "guidance_scale": 1.0},
        # A step cache preset a request may ask for (no default: none).
        performance={"step_caches": {"fbc": {"kind": "first_block", "threshold": 0.2}}},
    )


@pytest.fixture(scope="module")
def stack(tmp_path_factory, wan_checkpoint) -> ApiStack:
    root = tmp_path_factory.mktemp("openai")
    s = start_api_stack(root, wan_checkpoint, in_process=True, **stack_options(root, wan_checkpoint))
    yield s
    stop_api_stack(s)


def sdk_client(stack: ApiStack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.base + "/v1", api_key=KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def client(stack) -> openai.OpenAI:
    with sdk_client(stack) as c:
        yield c


def decode(content: bytes, tmp_path, name: str = "out.mp4"):
    path = tmp_path / name
    path.write_bytes(content)
    return probe(path)


def wait_status(stack: ApiStack, vid: str, statuses: tuple[str, ...], timeout: float = 120) -> dict:
    def reached():
        body = stack.get(f"/v1/videos/{vid}").json()
        return body if body["status"] in statuses else None

    return wait_for(reached, timeout, f"{vid} in {statuses}", interval=0.3)


def wait_queue_drained(client: openai.OpenAI, timeout: float = 120) -> None:
    """Until no video the earlier tests left is queued or in progress (a test that times its own
    job must not wait behind theirs, on a slow machine)."""

    def drained():
        return not any(v.status in ("queued", "in_progress") for v in client.videos.list(limit=100))

    wait_for(drained, timeout, "the earlier videos to finish", interval=0.3)


def test_models_list_and_retrieve(client):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL, "anime", "noir", "draft"]  # the model, then its adapters
    assert models.data[2].model_extra["parent"] == MODEL
    adapters = models.data[0].model_extra["adapters"]
    assert adapters[:2] == [{"name": "anime", "scale": 1.0}, {"name": "noir", "scale": 0.5}]
    assert adapters[2]["name"] == "draft" and adapters[2]["sampling"]["mode"] == "dmd"
    card = client.models.retrieve(MODEL)
    assert card.id == MODEL and card.owned_by == "shotloom"
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("no-such-model")
    assert info.value.body["code"] == "model_not_found"


def test_create_and_poll_then_download_every_variant(client, stack, tmp_path):
    video = client.videos.create_and_poll(
        model=MODEL,
        prompt="a lighthouse at dusk",
        seconds="1",
        size="64x64",
        extra_body={"seed": 1234},
        poll_interval_ms=300,
    )
    assert video.status == "completed", video.error
    assert video.progress == 100 and video.completed_at is not None
    assert video.size == "64x64"
    ext = video.model_extra["shotloom"]
    # 1 s at 16 fps asks for 16 frames: the Wan grid (4k+1) gives 17, reported as 1.0625 s.
    assert ext["frames"] == 17 and ext["fps"] == 16 and video.seconds == "1.0625"
    assert ext["seed"] == 1234 and ext["work_id"] == "sdk-work" and ext["shot_id"] == video.id
    assert {"inferring", "decoding", "writing"} <= set(ext["stage_timings"])
    assert ext["peak_memory_mb"] > 50  # the worker's measured peak (its process RSS on a CPU)

    info = decode(client.videos.download_content(video.id).read(), tmp_path)
    assert (info.frames, info.width, info.height) == (17, 64, 64)
    assert abs(info.duration_s - 17 / 16) < 1e-3 and info.has_audio and info.audio_codec == "aac"

    thumb = Image.open(io.BytesIO(client.videos.download_content(video.id, variant="thumbnail").read()))
    assert thumb.size == (64, 64)
    sheet = Image.open(io.BytesIO(client.videos.download_content(video.id, variant="spritesheet").read()))
    assert sheet.size[0] == 3 * 64 and sheet.size[1] == 3 * 64  # 3x3 cells of 64 px (under the 160 px cap)

    # The same seed and request give the same pixels: the seed is the one reported.
    again = client.videos.create_and_poll(
        model=MODEL, prompt="a lighthouse at dusk", seconds="1", size="64x64", extra_body={"seed": 1234}
    )
    first = decode(client.videos.download_content(video.id).read(), tmp_path, "a.mp4")
    second = decode(client.videos.download_content(again.id).read(), tmp_path, "b.mp4")
    assert first.sha256 == second.sha256


def test_progress_streams_as_server_sent_events_until_the_video_is_done(client, stack):
    video = client.videos.create(model=MODEL, prompt="a streamed lighthouse", size="64x64", seconds="1")
    events = stack.events(f"/v1/videos/{video.id}/events")
    assert events[-1]["event"] == "done" and all(e["event"] == "update" for e in events[:-1])
    final = events[-1]["data"]
    assert final["id"] == video.id and final["status"] == "completed" and final["progress"] == 100
    assert final == stack.get(f"/v1/videos/{video.id}").json()
    progress = [e["data"]["progress"] for e in events]
    assert progress == sorted(progress) and len(events) >= 2
    missing = stack.client.get(stack.base + "/v1/videos/video_nope/events")
    assert missing.status_code == 404 and missing.json()["error"]["code"]


def test_random_seed_is_reported(client):
    video = client.videos.create(model=MODEL, prompt="rain on a window", size="64x64", seconds="1")
    seed = video.model_extra["shotloom"]["seed"]
    assert isinstance(seed, int) and 0 <= seed < 2**32
    assert video.status == "queued" and video.progress == 0


def test_input_reference_file_and_extra_body_references(client, tmp_path):
    video = client.videos.create_and_poll(
        prompt="the same scene, later",  # model left out: one model is served
        input_reference=("first.png", png_bytes(7), "image/png"),
        extra_body={
            "video_params": {"fps": 16, "num_frames": 9},
            "image_reference": [{"image_url": data_url(8)}, {"image_url": data_url(9)}],
        },
        size="64x64",
    )
    assert video.status == "completed", video.error
    assert video.model_extra["shotloom"]["frames"] == 9
    info = decode(client.videos.download_content(video.id).read(), tmp_path)
    assert info.frames == 9


def test_json_body_means_what_the_form_means(stack):
    body = {
        "prompt": "json body",
        "size": "64x64",
        "width": 32,
        "height": 32,  # size wins over width/height
        "video_params": {"width": 48, "height": 48, "fps": 16, "num_frames": 13},
        "num_frames": 5,  # top level wins over video_params
        "seed": 5,
    }
    resp = stack.client.post(stack.base + "/v1/videos", json=body)
    assert resp.status_code == 200, resp.text
    video = resp.json()
    assert video["size"] == "64x64" and video["shotloom"]["frames"] == 5
    assert int(resp.headers["openai-poll-after-ms"]) > 0

    # width/height over video_params when size is absent; num_frames from video_params.
    body = {
        "prompt": "json body",
        "width": 32,
        "height": 32,
        "video_params": {"width": 48, "height": 48, "num_frames": 13},
    }
    video = stack.client.post(stack.base + "/v1/videos", json=body).json()
    assert video["size"] == "32x32" and video["shotloom"]["frames"] == 13

    # The same fields as a form (all strings, bracketed keys) give the same job.
    form = {
        "prompt": "json body",
        "width": "32",
        "height": "32",
        "video_params[width]": "48",
        "video_params[height]": "48",
        "video_params[num_frames]": "13",
    }
    parts = [(k, (None, v)) for k, v in form.items()]  # multipart, as the SDK sends it
    video = stack.client.post(stack.base + "/v1/videos", files=parts).json()
    assert video["size"] == "32x32" and video["shotloom"]["frames"] == 13


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"size": "64x64"}, 400, "prompt"),
        ({"prompt": "  "}, 400, "prompt"),
        ({"prompt": "x", "model": "other"}, 404, "model"),
        ({"prompt": "x", "seconds": "-1"}, 400, "seconds"),
        ({"prompt": "x", "seconds": "600"}, 400, "seconds"),
        ({"prompt": "x", "seconds": "abc"}, 400, "seconds"),
        ({"prompt": "x", "size": "64by64"}, 400, "size"),
        ({"prompt": "x", "size": "65x64"}, 400, "size"),
        ({"prompt": "x", "num_frames": 16}, 400, "num_frames"),
        ({"prompt": "x", "video_params": {"num_frames": 16}}, 400, "video_params.num_frames"),
        ({"prompt": "x", "fps": 24}, 400, "fps"),
        ({"prompt": "x", "seed": 2**32}, 400, "seed"),
        ({"prompt": "x", "num_inference_steps": 50}, 400, "num_inference_steps"),
        ({"prompt": "x", "num_inference_steps": 9}, 400, "num_inference_steps"),  # past max_steps (8)
        ({"prompt": "x", "num_inference_steps": 0}, 400, "num_inference_steps"),
        ({"prompt": "x", "model": "draft", "num_inference_steps": 3}, 400, "num_inference_steps"),
        ({"prompt": "x", "lora": {"name": "draft"}, "num_inference_steps": 3}, 400, "num_inference_steps"),
        ({"prompt": "x", "guidance_scale": 1000}, 400, "guidance_scale"),
        ({"prompt": "x", "guidance_scale": 10.5}, 400, "guidance_scale"),  # past Wan's 10
        ({"prompt": "x", "negative_prompt": "blur"}, 400, "negative_prompt"),
        ({"prompt": "x", "image_reference": [{"file_id": "file-1"}]}, 400, "image_reference[0].file_id"),
        (
            {"prompt": "x", "image_reference": [{"image_url": "data:image/png;base64,AAAA"}]},
            400,
            "image_reference[0].image_url",
        ),
        (
            {"prompt": "x", "image_reference": [{"image_url": data_url(i)} for i in range(9)]},
            400,
            "image_reference",
        ),
        ({"prompt": "x", "first_frame": "ftp://example.com/a.png"}, 400, "first_frame"),
        ({"prompt": "x", "first_frame": data_url(1), "input_reference": data_url(2)}, 400, "input_reference"),
        ({"prompt": "x", "video_url": "data:video/mp4;base64,AAAA"}, 400, "video_url"),  # no video in it
        ({"prompt": "x", "strength": 0.5}, 400, "strength"),  # no source video to apply it to
        ({"prompt": "x", "lora": {"name": "style"}}, 400, "lora"),
        ({"prompt": "x", "extra_params": {"vsa_mode": "exempt"}}, 400, "extra_params.vsa_mode"),
        ({"prompt": "x", "guides": "[]"}, 400, "guides"),
        ({"prompt": "x", "colour": "red"}, 400, "colour"),
    ],
)
def test_refusals_name_the_field(stack, body, status, param):
    resp = stack.client.post(stack.base + "/v1/videos", json=body)
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert error["param"] == param, error
    assert error["message"] and error["type"]


def test_malformed_bodies_use_the_envelope(stack):
    resp = stack.client.post(
        stack.base + "/v1/videos", content=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_json"
    resp = stack.client.post(
        stack.base + "/v1/videos",
        content=b"--x\r\nbroken",
        headers={"Content-Type": "multipart/form-data; boundary=x"},
    )
    assert resp.status_code == 400 and "error" in resp.json()
    # The R2V dialect keeps its own shape: a body that is not JSON is a 422 there.
    resp = stack.client.post(
        stack.base + "/r2v", content=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert resp.status_code == 422 and "detail" in resp.json()


def test_list_pages_through_every_video(client):
    ids = [v.id for v in client.videos.list(limit=100, order="asc").data]
    assert len(ids) >= 5
    # Iterating a page auto-paginates (after=<last id>) through every page.
    paged = [v.id for v in client.videos.list(limit=2, order="asc")]
    assert paged == ids
    pages = list(client.videos.list(limit=2, order="asc").iter_pages())
    assert len(pages) == (len(ids) + 1) // 2 and pages[-1].has_more is False
    page = client.videos.list(limit=2, order="desc")
    assert page.has_more and [v.id for v in page.data] == ids[::-1][:2]
    assert page.model_extra["first_id"] == ids[-1] and page.last_id == ids[-2]


def test_unknown_video_and_unfinished_content(client, stack):
    with pytest.raises(openai.NotFoundError):
        client.videos.retrieve("video_" + "0" * 32)
    with pytest.raises(openai.NotFoundError):
        client.videos.retrieve("not-a-video-id")
    queued = client.videos.create(prompt="wait for it", size="64x64", seconds="1")
    with pytest.raises(openai.ConflictError) as info:
        client.videos.download_content(queued.id)
    assert info.value.body["code"] == "not_ready"


def test_sync_returns_the_mp4_and_keeps_no_copy(client, stack, tmp_path):
    wait_queue_drained(client)  # the stack's sync wait is 10 s: for this job alone
    resp = stack.client.post(
        stack.base + "/v1/videos/sync",
        json={"prompt": "sync clip", "size": "64x64", "seconds": "1", "seed": 3},
        timeout=120,
    )
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"] == "video/mp4"
    vid = resp.headers["X-Request-Id"]
    assert resp.headers["X-Model"] == MODEL
    assert float(resp.headers["X-Inference-Time-S"]) > 0
    assert float(resp.headers["X-Peak-Memory-MB"]) > 50
    assert "inferring" in json.loads(resp.headers["X-Stage-Durations"])
    info = decode(resp.content, tmp_path)
    assert (info.frames, info.width) == (17, 64)
    wait_for(lambda: stack.get(f"/v1/videos/{vid}").status_code == 404, 10, "the sync job to be removed")


def test_sync_past_its_wait_is_504_naming_the_job_and_a_client_that_leaves_cancels_it(client, stack):
    # Long clips hold the device and the queue, so sync jobs wait past the stack's 10 s.
    blockers = [client.videos.create(prompt=f"long clip {i}", size="64x64", seconds="15") for i in range(4)]
    try:
        resp = stack.client.post(
            stack.base + "/v1/videos/sync",
            json={"prompt": "too slow", "size": "64x64", "seconds": "1"},
            timeout=60,
        )
        assert resp.status_code == 504, resp.text
        error, location = resp.json()["error"], resp.headers["location"]
        vid = location.rsplit("/", 1)[1]
        assert error["code"] == "timeout" and vid in error["message"]
        assert stack.get(location).json()["status"] in ("queued", "in_progress")  # poll it instead
        client.videos.delete(vid)

        with pytest.raises(httpx.ReadTimeout):  # the client gives up and hangs up
            stack.client.post(
                stack.base + "/v1/videos/sync",
                json={"prompt": "walked away", "size": "64x64", "seconds": "1"},
                timeout=2,
            )
        left = next(v for v in client.videos.list(limit=10) if v.prompt == "walked away")
        assert wait_status(stack, left.id, ("cancelled",), timeout=30)["status"] == "cancelled"
    finally:
        for video in blockers:
            client.videos.delete(video.id)


def test_operator_defaults_sit_between_the_client_and_the_preset(stack):
    # The stack's default_request sets seconds 0.5: a request that gives no length gets 9 frames
    # (the preset says 17); a length the client sets wins over the operator's.
    implicit = stack.post("/v1/videos", {"prompt": "operator length", "size": "64x64"}).json()
    explicit = stack.post("/v1/videos", {"prompt": "client length", "size": "64x64", "num_frames": 5}).json()
    assert (implicit["shotloom"]["frames"], implicit["seconds"]) == (9, "0.5625")
    assert (explicit["shotloom"]["frames"], explicit["seconds"]) == (5, "0.3125")
    card = stack.get(f"/v1/models/{MODEL}").json()
    assert card["defaults"]["num_frames"] == 17  # the model's own preset is unchanged
    for video in (implicit, explicit):
        stack.client.delete(stack.base + f"/v1/videos/{video['id']}")


def test_a_failed_job_answers_500_with_its_error(client, stack):
    # A long clip, so the run is still going when the operator stops it.
    video = client.videos.create(prompt="stopped by the operator", size="64x64", seconds="15")
    version = video.model_extra["shotloom"]["version_id"]
    run_id = wait_for(lambda: stack.get(f"/version/{version}").json().get("run_id"), 60, "the run")
    stopped = stack.gateway().terminate(run_id, wait_starting_s=30)  # as the UI stops it
    failed = wait_status(stack, video.id, ("failed", "completed"))
    assert stopped or failed["status"] == "completed"
    if failed["status"] == "completed":
        pytest.skip("the run finished before it could be terminated")
    resp = stack.get(f"/v1/videos/{video.id}")
    assert resp.status_code == 500  # the contract: a failed generation is a 500 when retrieved
    error = resp.json()["error"]
    assert error["code"] == "generation_failed" and error["status"] == 500 and error["message"]
    with pytest.raises(openai.InternalServerError):
        client.videos.retrieve(video.id)


# -- inputs that cannot make a frame; a run that fails --------------------------------------------
def image_bytes(mode: str, width: int, height: int) -> bytes:
    buf = io.BytesIO()
    Image.new(mode, (width, height), 90 if mode in ("L", "P") else None).save(buf, format="PNG")
    return buf.getvalue()


def mp4_bytes(tmp_path, width: int, height: int) -> bytes:
    from shotloom.media import write_mp4

    path = tmp_path / f"{width}x{height}.mp4"
    write_mp4(path, np.full((5, height, width, 3), 90, np.uint8), 16, None, None, preset="ultrafast")
    return path.read_bytes()


def b64(data: bytes, mime: str) -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def jobs_in_store(stack: ApiStack) -> int:
    from api.store import Store

    store = Store(f"sqlite:///{stack.state / 'api' / 'service.sqlite'}", create=False)
    try:
        return sum(sum(store.counts_by_status(kind).values()) for kind in ("r2v", "merge"))
    finally:
        store.close()


def test_inputs_too_small_to_make_a_frame_are_refused_on_every_route(stack, tmp_path):
    """Issue 22.7: measured before, a 1x1 grayscale PNG on /v1/images/edits was accepted and failed
    in condition_op ("height and width must be > 0"). Now every route refuses an image or video
    with a side under api.inputs.min_side (16) at admission, naming the field; nothing is queued."""
    dot, sliver = image_bytes("L", 1, 1), image_bytes("RGB", 2, 64)
    narrow = mp4_bytes(tmp_path, 2, 64)  # H.264 takes it; no frame of the model's can be made of it
    before = jobs_in_store(stack)
    dot_png, narrow_mp4 = ("dot.png", dot, "image/png"), ("narrow.mp4", narrow, "video/mp4")
    dot_url, sliver_url, narrow_url = (
        b64(dot, "image/png"),
        b64(sliver, "image/png"),
        b64(narrow, "video/mp4"),
    )

    def form(files: dict, **data: str) -> dict:
        return {"files": files, "data": data}

    def body(**fields) -> dict:
        return {"json": {"prompt": "x", **fields}}

    def guided(file: tuple) -> dict:
        return {"files": guide_form([{"file": "guide_0", "frame": 0}], {"guide_0": file})}

    v1 = [  # (what is posted, where, the field named)
        (form({"image": dot_png}, prompt="x"), "/v1/images/edits", "image"),
        (form({"input_reference": dot_png}, prompt="x"), "/v1/videos", "input_reference"),
        (body(input_reference=dot_url), "/v1/videos", "input_reference"),
        (body(first_frame=sliver_url), "/v1/videos", "first_frame"),
        (body(image_reference=[{"image_url": dot_url}]), "/v1/videos", "image_reference[0].image_url"),
        (body(video_url=narrow_url), "/v1/videos", "video_url"),
        (body(video_url=narrow_url), "/v1/videos/sync", "video_url"),
        (form({"video": narrow_mp4}, prompt="x"), "/v1/videos/edits", "video"),
        (form({"video": narrow_mp4}, prompt="x"), "/v1/videos/extensions", "video"),
        (form({"video": narrow_mp4}, name="x"), "/v1/videos/characters", "video"),
        (guided(narrow_mp4), "/v1/videos", "guides[0]"),
        (guided(dot_png), "/v1/videos", "guides[0]"),
    ]  # fmt: skip
    for request, path, param in v1:
        resp = stack.client.post(stack.base + path, **request)
        assert resp.status_code == 400, (path, param, resp.text)
        error = resp.json()["error"]
        assert (error["param"], error["code"], error["type"]) == (
            param,
            "invalid_media_size",
            "invalid_request_error",
        )
        assert (
            "pixels, too small to make a frame of: each side must be at least 16 pixels" in error["message"]
        )
    # The r2v dialect: its own status for invalid input (422) and body, naming its field.
    r2v = {"work_id": "w", "shot_id": "tiny", "prompt": "x", "memory_slots": []}
    for shot, field in (
        ({**r2v, "condition_img": dot_url}, "condition_img"),
        ({**r2v, "memory_slots": [{"image_url": sliver_url}]}, "memory_slots[0].image_url"),
        ({**r2v, "memory_slots": [{"video_url": narrow_url}]}, "memory_slots[0].video_url"),
    ):
        resp = stack.post("/r2v", shot)
        assert resp.status_code == 422, resp.text
        assert (
            resp.json()["detail"][0]["field"] == field and "too small to make a frame" in resp.json()["error"]
        )
    resp = stack.post("/merge", {"work_id": "w", "shots": [{"video_url": narrow_url}]})
    assert resp.status_code == 422 and resp.json()["detail"][0]["field"] == "shots[0].video_url", resp.text
    assert jobs_in_store(stack) == before  # nothing was queued


def test_grayscale_palette_and_alpha_images_big_enough_make_a_picture(client):
    # The measured case's mode at a size that makes a frame: converted, as every family does.
    edited = client.images.edit(
        image=("grey.png", image_bytes("L", 16, 16), "image/png"), prompt="x", size="64x64"
    )
    assert Image.open(io.BytesIO(base64.b64decode(edited.data[0].b64_json))).size == (64, 64)
    video = client.videos.create_and_poll(
        prompt="a kite",
        size="64x64",
        seconds="0.5",
        input_reference=("palette.png", image_bytes("P", 24, 16), "image/png"),
        extra_body={"image_reference": [{"image_url": b64(image_bytes("LA", 16, 40), "image/png")}]},
        poll_interval_ms=300,
    )
    assert video.status == "completed", video.error


def corrupt_video_bytes(tmp_path) -> bytes:
    """A PNG-coded QuickTime video whose third frame is garbage: its first frame decodes (admission
    passes), the run's decode of the whole video fails."""
    from fractions import Fraction

    import av

    path = tmp_path / "corrupt.mov"
    with av.open(str(path), "w", format="mov") as out:
        stream = out.add_stream("png", rate=16)
        stream.width = stream.height = 64
        stream.pix_fmt = "rgb24"
        for i in range(5):
            frame = av.VideoFrame.from_ndarray(np.full((64, 64, 3), 40 * i, np.uint8), format="rgb24")
            frame.pts, frame.time_base = i, Fraction(1, 16)
            for packet in stream.encode(frame):
                if i == 2:
                    garbage = av.Packet(b"\x00garbage" * 40)
                    garbage.pts, garbage.dts, garbage.time_base = packet.pts, packet.dts, packet.time_base
                    garbage.stream = stream
                    packet = garbage
                out.mux(packet)
        out.mux(stream.encode())
    return path.read_bytes()


def test_a_run_that_fails_tells_the_client_the_ops_own_error(stack, tmp_path):
    """Issue 22.7: a failure inside a run reaches the client as the op's own error, not Dagster's
    DagsterExecutionStepExecutionError ("Error occurred while executing op ..."), in both dialects."""
    source = b64(corrupt_video_bytes(tmp_path), "video/quicktime")
    v1 = stack.post(
        "/v1/videos",
        {"prompt": "from a broken video", "size": "64x64", "seconds": "0.5", "video_url": source},
    )
    assert v1.status_code == 200, v1.text  # admission decodes the first frame only
    r2v = stack.post(
        "/r2v",
        {
            "work_id": "w",
            "shot_id": "broken",
            "prompt": "x",
            "num_frames": 9,
            "memory_slots": [{"video_url": source}],
        },
    )
    assert r2v.status_code in (200, 202), r2v.text
    expected = "condition_op: CapabilityError: source_video: cannot read "
    failed = wait_status(stack, v1.json()["id"], ("failed", "completed"), timeout=180)
    assert failed["status"] == "failed"
    resp = stack.get(f"/v1/videos/{v1.json()['id']}")
    error = resp.json()["error"]
    assert (resp.status_code, error["code"]) == (500, "generation_failed")
    assert error["message"].startswith(expected) and "Invalid data found" in error["message"], error
    assert "Dagster" not in error["message"] and "Error occurred while executing" not in error["message"]
    version = stack.wait_version(r2v.json()["version_id"], timeout=180)
    assert version["status"] == "failed"
    assert version["error"].startswith(expected) and "Dagster" not in version["error"], version["error"]


# -- video from video: remix and edit -------------------------------------------------------------
@pytest.fixture(scope="module")
def source_video(client) -> openai.types.Video:
    video = client.videos.create_and_poll(
        prompt="a red kite over the sea",
        seconds="1",
        size="64x64",
        extra_body={"seed": 11},
        poll_interval_ms=300,
    )
    assert video.status == "completed", video.error
    return video


def test_remix_keeps_size_length_and_seed_and_starts_from_the_source(client, stack, source_video, tmp_path):
    remix = client.videos.remix(
        source_video.id, prompt="the same kite at night", extra_body={"strength": 0.5}
    )
    assert remix.remixed_from_video_id == source_video.id and remix.status == "queued"
    done = client.videos.poll(remix.id, poll_interval_ms=300)
    assert done.status == "completed", done.error
    ext = done.model_extra["shotloom"]
    assert (done.size, done.seconds, ext["seed"], ext["strength"]) == ("64x64", "1.0625", 11, 0.5)
    assert ext["work_id"] == "sdk-work"  # the source's work: lineage stays in one work
    info = decode(client.videos.download_content(done.id).read(), tmp_path)
    assert (info.frames, info.width, info.height) == (17, 64, 64) and info.has_audio
    assert abs(info.duration_s - 17 / 16) < 1e-3 and float(done.seconds) == 17 / 16
    # The run started from the source's MP4 (stored content-addressed, linked to its version).
    inputs = stack.get(f"/version/{ext['version_id']}").json()["request"]["inputs"]
    assert inputs["video_id"]["version_id"] == source_video.model_extra["shotloom"]["version_id"]
    # Given fields win over the source's.
    longer = client.videos.remix(source_video.id, prompt="longer", extra_body={"num_frames": 9, "seed": 3})
    assert (longer.model_extra["shotloom"]["frames"], longer.model_extra["shotloom"]["seed"]) == (9, 3)


def test_remix_of_an_unknown_or_unfinished_video_is_refused(client, stack):
    with pytest.raises(openai.NotFoundError) as info:
        client.videos.remix("video_" + "0" * 32, prompt="x")
    assert info.value.body["param"] == "video_id"
    pending = client.videos.create(prompt="not yet", size="64x64", seconds="2")
    with pytest.raises(openai.ConflictError) as info:
        client.videos.remix(pending.id, prompt="x")
    assert (info.value.body["code"], info.value.body["param"]) == ("not_ready", "video_id")
    client.videos.delete(pending.id)


def test_edit_an_uploaded_mp4_and_a_video_by_id(client, source_video, tmp_path):
    mp4 = client.videos.download_content(source_video.id).read()
    uploaded = client.videos.edit(prompt="make it snow", video=("clip.mp4", mp4, "video/mp4"))
    # The SDK only takes a file for `video` (a dict raises inside it): an id goes through extra_body,
    # which it sends as the multipart field video[id].
    by_id = client.videos.edit(
        prompt="make it rain", video=openai.omit, extra_body={"video": {"id": source_video.id}}
    )
    assert by_id.model_extra["shotloom"]["seed"] == 11  # the source's seed, as a remix
    for video in (uploaded, by_id):
        done = client.videos.poll(video.id, poll_interval_ms=300)
        assert done.status == "completed", done.error
        assert (done.size, done.model_extra["shotloom"]["frames"]) == (
            "64x64",
            17,
        )  # the upload's size and length
        info = decode(client.videos.download_content(done.id).read(), tmp_path, f"{done.id}.mp4")
        assert (info.frames, info.width) == (17, 64) and info.has_audio
        assert abs(info.duration_s - 17 / 16) < 1e-3 and done.seconds == "1.0625"


def test_extend_continues_a_video_and_answers_the_stitched_whole(client, stack, source_video, tmp_path):
    extension = client.videos.extend(
        prompt="the kite climbs higher",
        seconds="1",
        video=openai.omit,
        extra_body={"video": {"id": source_video.id}},
    )
    assert extension.seconds == "2.125"  # 17 frames of the source + 17 new ones, at 16 fps
    done = client.videos.poll(extension.id, poll_interval_ms=300)
    assert done.status == "completed", done.error
    assert (done.seconds, done.model_extra["shotloom"]["frames"]) == ("2.125", 34)
    info = decode(client.videos.download_content(done.id).read(), tmp_path)
    assert (info.frames, info.width) == (34, 64) and info.has_audio and abs(info.duration_s - 34 / 16) < 0.01
    source = decode(client.videos.download_content(source_video.id).read(), tmp_path, "source.mp4")
    assert source.frames == 17
    version = stack.get(f"/version/{done.model_extra['shotloom']['version_id']}").json()
    film = next(a for a in version["artifacts"] if a["kind"] == "video" and a["role"] == "film")
    # The first 17 frames are the source's own: the merge stream-copies clips with the same encoder
    # settings (both came from the same writer), so its packets decode to the very same pixels
    # (a re-encode would only be close, and is itself a regression here).
    stitched, original = read_frames(info.path), read_frames(source.path)
    per_frame = np.abs(stitched[:17].astype(np.int16) - original.astype(np.int16)).mean(axis=(1, 2, 3))
    assert film["metadata"]["video_mode"] == "copy"
    assert per_frame.max() == 0, per_frame  # mean absolute difference per frame, of 255
    # The continuation was conditioned on exactly the source's last frame: the PNG the run started
    # from is that decoded frame. (Its pixels are not asserted on the output: the tiny checkpoint's
    # random weights do not reproduce a first frame; measured mean absolute difference ~34 of 255,
    # the same as a generation without it.)
    last = io.BytesIO()
    Image.fromarray(original[-1]).save(last, format="PNG")
    used = version["request"]["inputs"]["video.id"]
    assert used["last_frame"]["sha256"] == hashlib.sha256(last.getvalue()).hexdigest()
    # Lineage: the source in memory; the new shot and the stitched film both on the version; the
    # film lists the source's version, then the extension's own; the version derives from the source.
    source_version = source_video.model_extra["shotloom"]["version_id"]
    assert used["version_id"] == source_version
    assert used["last_frame"]["media_type"] == "image/png" and used["memory"]["image"]
    roles = {a["role"] for a in version["artifacts"] if a["kind"] == "video"}
    assert roles == {"shot", "film"} and version["video_url"].endswith(".mp4")
    assert film["metadata"]["versions"] == [source_version, version["version_id"]]
    assert version["derived_from"] == [source_version]
    # The shot on a device worker, the stitching on the media worker (the device slot was free).
    runs = stack.runs_of(version["version_id"])
    assert [(r.job_name, r.status) for r in runs] == [("r2v", "SUCCESS"), ("merge", "SUCCESS")]
    assert runs[0].tags["shotloom/worker"].startswith("cpu-")
    assert runs[1].tags["shotloom/worker"].startswith("media-")


def test_characters_from_an_upload_and_by_id_then_used_in_a_later_video(
    client, stack, source_video, tmp_path
):
    mp4 = client.videos.download_content(source_video.id).read()
    gateway = stack.gateway()
    before = {r.run_id for r in gateway.find_runs_by_tag("shotloom/kind", "reference")}
    made = client.videos.create_character(name="Kite", video=("kite.mp4", mp4, "video/mp4"))
    assert made.id.startswith("char_") and made.name == "Kite"
    # Its frame and sound were taken by a run on the media worker (the API decodes no video);
    # the run's files are gone once the service stored its copies.
    [taken] = [r for r in gateway.find_runs_by_tag("shotloom/kind", "reference") if r.run_id not in before]
    assert taken.status == "SUCCESS" and taken.tags["shotloom/worker"].startswith("media-")
    assert taken.job_name == "reference" and taken.tags["dagster/priority"] == "10"  # a client waits
    [mat] = gateway.materializations(taken.run_id)
    assert mat.asset_key == ("reference",) and set(mat.metadata["frames"]) == {"middle"}
    from settings.server import ServerConfig

    media_root = ServerConfig.load(stack.config).media_root
    assert media_root.is_dir() and not (media_root / "references" / taken.run_id).exists()
    again = client.videos.create_character(name="Kite", video=("kite.mp4", mp4, "video/mp4"))
    assert again.id == made.id  # content-addressed: the same name and media are the same character
    got = client.videos.get_character(made.id)
    assert (got.id, got.name, got.created_at) == (made.id, "Kite", made.created_at)
    assert got.model_extra["shotloom"]["has_audio"] is True  # the source's (silent AAC) track
    by_id = client.videos.create_character(
        name="Kite again", video=openai.omit, extra_body={"video": {"id": source_video.id}}
    )
    assert (
        by_id.model_extra["shotloom"]["source"]["version_id"]
        == source_video.model_extra["shotloom"]["version_id"]
    )

    video = client.videos.create_and_poll(
        prompt="the kite over a city",
        size="64x64",
        seconds="1",
        extra_body={"characters": [made.id]},
        poll_interval_ms=300,
    )
    assert video.status == "completed", video.error
    info = decode(client.videos.download_content(video.id).read(), tmp_path)
    assert (info.frames, info.width, info.height) == (17, 64, 64) and info.has_audio
    inputs = stack.get(f"/version/{video.model_extra['shotloom']['version_id']}").json()["request"]["inputs"]
    assert inputs["characters[0]"]["image"]["sha256"] == got.model_extra["shotloom"]["frame_sha256"]
    assert inputs["characters[0]"]["audio"] is None  # Wan takes no audio: the character's track stays out

    with pytest.raises(openai.BadRequestError) as info:
        client.videos.create(
            prompt="x", size="64x64", seconds="1", extra_body={"characters": ["char_" + "0" * 32]}
        )
    assert info.value.body["param"] == "characters[0]"
    with pytest.raises(openai.NotFoundError) as info:
        client.videos.get_character("char_" + "0" * 32)
    assert info.value.status_code == 404
    assert (info.value.body["param"], info.value.body["code"]) == ("character_id", "not_found")


def test_images_generate_and_edit_with_the_sdk(client, stack):
    result = client.images.generate(
        prompt="a red kite", n=2, size="64x64", response_format="b64_json", extra_body={"seed": 4}
    )
    pictures = [Image.open(io.BytesIO(base64.b64decode(d.b64_json))) for d in result.data]
    assert [p.size for p in pictures] == [(64, 64), (64, 64)] and result.size == "64x64"
    assert pictures[0].tobytes() != pictures[1].tobytes()  # seeds 4 and 5
    # The same prompt and seed again, as a URL: the same image.
    by_url = client.images.generate(
        prompt="a red kite", size="64x64", response_format="url", extra_body={"seed": 4}
    )
    fetched = Image.open(io.BytesIO(stack.client.get(by_url.data[0].url).content))
    assert fetched.tobytes() == pictures[0].tobytes()
    edited = client.images.edit(
        image=("ref.png", png_bytes(3), "image/png"), prompt="the kite in snow", size="64x64"
    )
    assert Image.open(io.BytesIO(base64.b64decode(edited.data[0].b64_json))).size == (64, 64)
    # Images are not videos.
    assert not any(v.id.startswith("img_") for v in client.videos.list(limit=100))

    with pytest.raises(openai.BadRequestError) as info:
        client.images.generate(prompt="x", n=5, size="64x64")
    assert info.value.body["param"] == "n"
    with pytest.raises(openai.BadRequestError) as info:  # one frame of Wan VACE takes one reference
        client.images.edit(
            image=[("a.png", png_bytes(1), "image/png"), ("b.png", png_bytes(2), "image/png")], prompt="x"
        )
    assert info.value.body["param"] == "image"


def test_edit_refusals_name_the_field(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.videos.edit(prompt="x", video=("clip.mp4", b"this is no video", "video/mp4"))
    assert info.value.body["param"] == "video"
    with pytest.raises(openai.NotFoundError) as info:
        client.videos.edit(prompt="x", video=openai.omit, extra_body={"video": {"id": "video_" + "1" * 32}})
    assert info.value.body["param"] == "video.id"


def test_idempotency_key_replays_the_same_video(stack):
    headers = {"Idempotency-Key": "sdk-retry-1"}
    body = {"prompt": "once only", "size": "64x64", "seconds": "1", "seed": 9}
    first = stack.client.post(stack.base + "/v1/videos", json=body, headers=headers)
    second = stack.client.post(stack.base + "/v1/videos", json=body, headers=headers)
    assert first.status_code == second.status_code == 200
    assert first.json()["id"] == second.json()["id"]
    other = stack.client.post(stack.base + "/v1/videos", json={**body, "seed": 10}, headers=headers)
    assert other.status_code == 409 and other.json()["error"]["code"] == "conflict"


def test_v1_videos_are_r2v_runs_on_the_same_store(stack):
    video = stack.client.post(
        stack.base + "/v1/videos", json={"prompt": "shared", "size": "64x64", "seconds": "1"}
    ).json()
    version = stack.get(f"/version/{video['shotloom']['version_id']}").json()
    assert version["kind"] == "r2v" and version["work_id"] == "sdk-work" and version["shot_id"] == video["id"]
    assert httpx.get(stack.base + "/health").status_code == 200


def test_api_keys_guard_every_route_but_health(stack):
    bare = httpx.Client(timeout=30)
    try:
        assert bare.get(stack.base + "/health").status_code == 200
        resp = bare.post(stack.base + "/v1/videos", json={"prompt": "x"})
        assert resp.status_code == 401 and resp.json()["error"]["code"] == "invalid_api_key"
        resp = bare.get(stack.base + "/v1/models", headers={"Authorization": "Bearer sk-wrong-000000000"})
        assert resp.status_code == 401 and resp.json()["error"]["type"] == "authentication_error"
        resp = bare.post(stack.base + "/r2v", json={})
        assert resp.status_code == 401 and "detail" in resp.json()  # the R2V dialect's own shape
        assert bare.get(stack.base + "/version/x").status_code == 401
        # A job's status, the pollers' fast path (api.polls), is no exception: not without a key,
        # not with a wrong one; and an unknown id is still each dialect's own 404.
        video = stack.client.post(stack.base + "/v1/videos", json={"prompt": "x", "size": "64x64"}).json()
        wrong = {"Authorization": "Bearer sk-wrong-000000000"}
        for path in (f"/version/{video['shotloom']['version_id']}", f"/v1/videos/{video['id']}"):
            assert bare.get(stack.base + path).status_code == 401
            assert bare.get(stack.base + path, headers=wrong).status_code == 401
            assert stack.get(path).status_code == 200
        resp = stack.get("/v1/videos/video_" + "0" * 32)
        assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found"
        resp = stack.get("/version/" + "0" * 32)
        assert resp.status_code == 404 and "unknown version" in resp.json()["detail"]
        assert bare.get(stack.base + "/media/anything.mp4").status_code == 401
        for method, path in (("GET", "/queue"), ("POST", "/queue/pause"), ("POST", "/queue/works/w/cancel")):
            assert bare.request(method, stack.base + path).status_code == 401  # operator routes too
        assert stack.get("/queue").json()["paused"] is False  # nothing paused by the refused call
        for doc in ("/openapi.json", "/r2v/openapi.json", "/v1/openapi.json"):  # the documents too
            assert bare.get(stack.base + doc).status_code == 401
            assert stack.get(doc).json()["openapi"].startswith("3.")
        assert bare.get(stack.base + "/docs").status_code == 404  # a browser page cannot send a key
        other = {"Authorization": "Bearer sk-other-9876543210"}
        assert bare.get(stack.base + "/v1/models", headers=other).status_code == 200
    finally:
        bare.close()


def test_runs_record_the_submitting_key_by_name(stack):
    video = stack.client.post(
        stack.base + "/v1/videos",
        json={"prompt": "whose run", "size": "64x64", "seconds": "1"},
        headers={"Authorization": "Bearer sk-other-9876543210"},
    ).json()
    version = video["shotloom"]["version_id"]
    run_id = wait_for(lambda: stack.get(f"/version/{version}").json().get("run_id"), 30, "the run")
    run = stack.gateway().run(run_id)
    assert run.tags["user"] == "studio-b" and run.tags["shotloom/kind"] == "v1"
    assert KEY not in json.dumps(run.tags) and "sk-other" not in stack.log("api")


def test_a_body_past_the_limit_is_413_before_it_is_read(stack):
    big = b"x" * (3 * 1024 * 1024)
    resp = stack.client.post(
        stack.base + "/v1/videos",
        files={"input_reference": ("big.png", big, "image/png")},
        data={"prompt": "x"},
    )
    assert resp.status_code == 413, resp.text
    error = resp.json()["error"]
    assert error["code"] == "payload_too_large" and str(2 * 1024 * 1024) in error["message"]


def test_a_body_that_stalls_is_408(stack):
    port = int(stack.base.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        head = (
            "POST /v1/videos HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {KEY}\r\nContent-Length: 1000\r\n\r\n"
        )
        sock.sendall(head.encode() + b'{"prompt": "stalled')
        started = time.monotonic()
        answer = b""
        while b"}}" not in answer:  # head and body may arrive in separate reads
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
        answer = answer.decode()
    assert answer.startswith("HTTP/1.1 408"), answer
    assert "request_timeout" in answer and time.monotonic() - started < 20


# -- video from video: more of the contract ---------------------------------------------------------
def test_extend_an_uploaded_mp4_answers_the_stitched_whole_with_lineage_to_the_upload(
    client, stack, source_video, tmp_path
):
    mp4 = client.videos.download_content(source_video.id).read()
    digest = hashlib.sha256(mp4).hexdigest()
    extension = client.videos.extend(
        prompt="the kite dives", seconds="1", video=("clip.mp4", mp4, "video/mp4")
    )
    assert extension.seconds == "2.125"  # the upload's 17 frames + 17 new ones, at 16 fps
    done = client.videos.poll(extension.id, poll_interval_ms=300)
    assert done.status == "completed", done.error
    assert (done.seconds, done.size, done.model_extra["shotloom"]["frames"]) == ("2.125", "64x64", 34)
    info = decode(client.videos.download_content(done.id).read(), tmp_path)
    assert (info.frames, info.width, info.height) == (34, 64, 64)
    assert abs(info.duration_s - 34 / 16) < 0.01
    assert info.has_audio and info.audio_codec == "aac"
    assert abs(info.audio_duration_s - info.duration_s) < 0.05  # one track over the whole
    upload = decode(mp4, tmp_path, "upload.mp4")
    assert np.array_equal(read_frames(info.path)[:17], read_frames(upload.path))  # the upload, then the new
    # Lineage: the upload by its content hash (it is no version of ours), on the request, the inputs
    # and the stitched film.
    version = stack.get(f"/version/{done.model_extra['shotloom']['version_id']}").json()
    assert version["request"]["video"] == {"upload_sha256": digest}
    used = version["request"]["inputs"]["video"]
    assert used["sha256"] == digest and "version_id" not in used and used["memory"]["image"]
    assert version["inputs"]["video"] == {"sha256": digest} and version["derived_from"] == []
    film = next(a for a in version["artifacts"] if a["kind"] == "video" and a["role"] == "film")
    assert film["metadata"]["versions"] == [f"sha256:{digest}", version["version_id"]]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/videos/edits", {"prompt": "x"}),
        ("/v1/videos/extensions", {"prompt": "x", "seconds": "1"}),
        ("/v1/videos/characters", {"name": "x"}),
    ],
)
def test_a_source_by_id_that_has_not_completed_is_409(stack, path, body):
    # Several seconds of work for the device: still queued or in progress when asked below.
    pending = stack.post("/v1/videos", {"prompt": "not yet", "size": "64x64", "seconds": "3"}).json()
    try:
        resp = stack.post(path, {**body, "video": {"id": pending["id"]}})
        assert resp.status_code == 409, resp.text
        error = resp.json()["error"]
        assert (error["code"], error["param"]) == ("not_ready", "video.id")
        assert stack.get(f"/v1/videos/{pending['id']}").json()["status"] in ("queued", "in_progress")
    finally:
        stack.client.delete(stack.base + f"/v1/videos/{pending['id']}")


def test_an_undecodable_upload_is_400_for_extensions_and_characters(client):
    junk = ("clip.mp4", b"this is no video", "video/mp4")
    with pytest.raises(openai.BadRequestError) as info:
        client.videos.extend(prompt="x", seconds="1", video=junk)
    assert (info.value.status_code, info.value.body["param"]) == (400, "video")
    with pytest.raises(openai.BadRequestError) as info:
        client.videos.create_character(name="Nobody", video=junk)
    assert (info.value.status_code, info.value.body["param"]) == (400, "video")


def test_characters_count_against_the_reference_limit(client, stack, source_video):
    # The tiny Wan VACE takes one reference per latent frame: 5 for 17 frames (1 s at 16 fps).
    character = client.videos.create_character(
        name="Counted", video=openai.omit, extra_body={"video": {"id": source_video.id}}
    )
    common = {"prompt": "crowded", "size": "64x64", "seconds": "1"}
    images = [{"image_url": data_url(i)} for i in range(6)]
    for refs, characters, param in (
        (images[:5], [character.id], "characters"),  # the images fit: the character goes over
        (images[:6], [], "image_reference"),  # the images alone go over
        (images[:6], [character.id], "image_reference"),
    ):
        resp = stack.post("/v1/videos", {**common, "image_reference": refs, "characters": characters})
        assert resp.status_code == 400, resp.text
        error = resp.json()["error"]
        assert error["param"] == param and "at most 5 reference images" in error["message"], error
    fits = stack.post("/v1/videos", {**common, "image_reference": images[:4], "characters": [character.id]})
    assert fits.status_code == 200, fits.text
    stack.client.delete(stack.base + f"/v1/videos/{fits.json()['id']}")


def test_the_generations_alias_queues_the_same_video_as_v1_videos(stack):
    body = {"prompt": "by the alias", "size": "64x64", "seconds": "1", "seed": 21}
    resp = stack.client.post(stack.base + "/v1/videos/generations", json=body)
    assert resp.status_code == 200, resp.text
    video = resp.json()
    assert video["id"].startswith("video_") and video["object"] == "video" and video["status"] == "queued"
    assert int(resp.headers["openai-poll-after-ms"]) > 0
    # Multipart too, as the SDK sends it; a refusal is the envelope naming the field.
    parts = [
        ("prompt", (None, "by the alias, as a form")),
        ("size", (None, "64x64")),
        ("seconds", (None, "1")),
    ]
    form = stack.client.post(stack.base + "/v1/videos/generations", files=parts)
    assert form.status_code == 200 and form.json()["status"] == "queued", form.text
    bad = stack.client.post(stack.base + "/v1/videos/generations", json={**body, "seed": -1})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "seed"
    wrong = stack.client.put(stack.base + "/v1/videos/generations")
    assert wrong.status_code == 405 and wrong.json()["error"]["code"] == "method_not_allowed"
    # The same kind of job as POST /v1/videos: it completes and reads back like one.
    done = wait_status(stack, video["id"], ("completed", "failed", "cancelled"), timeout=300)
    assert done["status"] == "completed", done
    assert (done["prompt"], done["size"], done["seconds"]) == ("by the alias", "64x64", "1.0625")
    assert (done["shotloom"]["seed"], done["shotloom"]["frames"]) == (21, 17)
    version = stack.get(f"/version/{done['shotloom']['version_id']}").json()
    assert version["kind"] == "r2v" and version["work_id"] == "sdk-work"
    for vid in (video["id"], form.json()["id"]):
        stack.client.delete(stack.base + f"/v1/videos/{vid}")


def wav_bytes(seconds: float = 0.5, rate: int = 16000) -> bytes:
    import wave

    samples = (0.3 * np.sin(2 * np.pi * 440 * np.arange(int(rate * seconds)) / rate) * 32767).astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(samples.tobytes())
    return buf.getvalue()


def guide_form(guides: list[dict], files: dict[str, tuple[str, bytes, str]], **fields: str) -> list:
    """A multipart form as curl -F sends it: text fields, ``guides`` as JSON, the guides' files."""
    text = {
        "prompt": "a kite, guided",
        "size": "64x64",
        "seconds": "1",
        **fields,
        "guides": json.dumps(guides),
    }
    return [(k, (None, v)) for k, v in text.items()] + list(files.items())


def test_a_guide_image_anchored_at_a_frame_from_the_end_makes_a_video(stack, tmp_path):
    form = guide_form(
        [{"file": "guide_0", "frame": -9, "kind": "video"}],
        {"guide_0": ("kite.png", png_bytes(12), "image/png")},
        seed="21",
    )
    resp = stack.client.post(stack.base + "/v1/videos", files=form)
    assert resp.status_code == 200, resp.text
    done = wait_status(stack, resp.json()["id"], ("completed", "failed", "cancelled"))
    assert done["status"] == "completed", done["error"]
    content = stack.client.get(stack.base + f"/v1/videos/{done['id']}/content")
    info = decode(content.content, tmp_path)
    assert (info.frames, info.width, info.height) == (17, 64, 64)
    # The run took the stored image at frame 8 (-9 of 17 frames), recorded by content.
    request = stack.get(f"/version/{done['shotloom']['version_id']}").json()["request"]
    guide = request["inputs"]["guides[0]"]
    assert (guide["frame"], guide["kind"], guide["media_type"]) == (8, "video", "image/png")
    assert request["guides"] == [{"file": "guide_0", "frame": -9, "kind": "video"}]  # as sent


@pytest.mark.parametrize(
    ("guides", "files", "param"),
    [
        ([{"file": "guide_1", "frame": 0}], {"guide_0": "png"}, "guides[0].file"),  # no such file part
        ([{"file": "guide_0", "frame": 0}], {"guide_0": "png", "stray": "png"}, "stray"),  # named nowhere
        ([{"file": "guide_0", "frame": 17}], {"guide_0": "png"}, "guides[0].frame"),  # 17 frames: 0..16
        ([{"file": "guide_0", "frame": 4, "kind": "audio"}], {"guide_0": "wav"}, "guides[0].kind"),  # Wan
        ([{"file": "guide_0", "frame": 4, "kind": "still"}], {"guide_0": "png"}, "guides[0].kind"),
        ([{"file": "guide_0", "frame": 4}], {"guide_0": "wav"}, "guides[0]"),  # no image, no video
    ],
)
def test_guide_refusals_name_the_field(stack, guides, files, param):
    media = {"png": ("g.png", png_bytes(3), "image/png"), "wav": ("g.wav", wav_bytes(), "audio/wav")}
    form = guide_form(guides, {name: media[kind] for name, kind in files.items()})
    resp = stack.client.post(stack.base + "/v1/videos", files=form)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == param, error
    assert error["message"] and error["type"] == "invalid_request_error"


def test_a_native_model_samples_the_steps_and_guidance_a_request_asks_for(client, stack):
    """Issue 22: /v1 and /r2v choose steps and guidance within the server's limits; the job's
    status and the shot's Dagster materialization record what it ran with."""
    card = client.models.retrieve(MODEL).model_extra
    assert card["sampling"]["mode"] == "native" and card["sampling"]["num_inference_steps"] == 3
    assert card["sampling"]["limits"] == {
        "num_inference_steps": {"min": 1, "max": 8},
        "guidance_scale": {"min": 1.0, "max": 10.0},  # the server's [1, 20] within Wan's [1, 10]
        "step_cache": ["none", "fbc"],  # issue 23: the model's presets, all offered here
    }
    assert card["sampling"]["step_cache"] == "none"
    assert client.models.retrieve("draft").model_extra["sampling"]["num_inference_steps"] == 2

    asked = client.videos.create(
        model=MODEL,
        prompt="a kite over the dunes",
        size="64x64",
        seconds="1",
        extra_body={"seed": 11, "num_inference_steps": 5, "guidance_scale": 2.0, "negative_prompt": "blur"},
    )
    draft = client.videos.create(
        model="draft", prompt="a kite over the dunes", size="64x64", seconds="1", extra_body={"seed": 11}
    )
    shot = stack.post(
        "/r2v",
        {
            "work_id": "sampling",
            "shot_id": "s1",
            "prompt": "a kite over the sea",
            "memory_slots": [],
            "num_inference_steps": 4,
            "guidance_scale": 1.5,
            "step_cache": "fbc",
        },
    )
    assert shot.status_code == 202, shot.text
    # Too many steps, guidance past the range, another count for the distill adapter: refused.
    for body, field in (
        ({"num_inference_steps": 9}, "num_inference_steps"),
        ({"guidance_scale": 12.0}, "guidance_scale"),
        ({"lora": {"name": "draft"}, "num_inference_steps": 4}, "num_inference_steps"),
        ({"step_cache": "mag"}, "step_cache"),  # no preset of the model
    ):
        r2v = {"work_id": "sampling", "shot_id": "s2", "prompt": "x", "memory_slots": [], **body}
        resp = stack.post("/r2v", r2v)
        assert resp.status_code == 422 and resp.json()["detail"][0]["field"] == field, resp.text
    resp = stack.post("/v1/videos/sync", {"prompt": "x", "size": "64x64", "num_inference_steps": 9})
    assert (resp.status_code, resp.json()["error"]["param"]) == (400, "num_inference_steps"), resp.text
    resp = stack.post("/v1/videos", {"prompt": "x", "size": "64x64", "step_cache": "mag"})
    assert (resp.status_code, resp.json()["error"]["param"]) == (400, "step_cache"), resp.text
    with pytest.raises(openai.BadRequestError) as info:
        client.images.generate(prompt="a kite", size="64x64", extra_body={"num_inference_steps": 9})
    assert info.value.body["param"] == "num_inference_steps"

    done = client.videos.poll(asked.id, poll_interval_ms=300)
    assert done.status == "completed", done.error
    ext = done.model_extra["shotloom"]
    assert (ext["steps"], ext["guidance_scale"], ext["sampler_mode"]) == (5, 2.0, "native")
    assert ext["step_cache"] == "none"  # unasked: the model's default
    version_id = ext["version_id"]
    version = stack.get(f"/version/{version_id}").json()
    assert (version["num_inference_steps"], version["guidance_scale"]) == (5, 2.0)
    assert version["result"]["sampler"]["dit_calls_per_step"] == 2  # CFG: two DiT calls a step
    metadata = [
        m.metadata for r in stack.runs_of(version_id) for m in stack.gateway().materializations(r.run_id)
    ]
    recorded = next(m for m in metadata if "num_inference_steps" in m)
    assert (recorded["num_inference_steps"], recorded["guidance_scale"]) == (5, 2.0)
    assert recorded["sampler"]["mode"] == "native" and recorded["sampler"]["steps"] == 5

    done = client.videos.poll(draft.id, poll_interval_ms=300)
    assert done.status == "completed", done.error
    ext = done.model_extra["shotloom"]
    assert (ext["steps"], ext["guidance_scale"], ext["sampler_mode"]) == (2, 1.0, "dmd")

    version = stack.wait_version(shot.json()["version_id"])
    assert version["status"] == "succeeded", version["error"]
    assert (version["num_inference_steps"], version["guidance_scale"], version["sampler_mode"]) == (
        4,
        1.5,
        "native",
    )
    assert version["result"]["num_inference_steps"] == 4  # from the shot's materialization
    # Issue 23: it ran with the step cache it asked for, as its materialization records.
    assert (version["step_cache"], version["result"]["step_cache"]) == ("fbc", "fbc")
    assert version["result"]["sampler"]["step_cache"] == {
        "name": "fbc",
        "kind": "first_block",
        "threshold": 0.2,
    }


# -- what only real worker processes show ------------------------------------------------------------
@pytest.mark.slow  # the whole service (server.py): run alone
class TestOnWorkerProcesses:
    """On the whole stack started by server.py (2 CPU workers): a worker that survives a cancel
    with its model loaded, and each worker's own weight loads."""

    @pytest.fixture(scope="class")
    @classmethod
    def stack(cls, tmp_path_factory, wan_checkpoint) -> ApiStack:
        root = tmp_path_factory.mktemp("openai-workers")
        s = start_api_stack(root, wan_checkpoint, **stack_options(root, wan_checkpoint))
        yield s
        stop_api_stack(s)

    @pytest.fixture(scope="class")
    @classmethod
    def client(cls, stack) -> openai.OpenAI:
        with sdk_client(stack) as c:
            yield c

    def test_delete_queued_running_and_finished(self, client, stack):
        from api.dagster import DagsterGateway

        web = yaml.safe_load(stack.config.read_text())["webserver"]
        dagster = DagsterGateway(web["host"], web["port"])

        def run_of(video) -> str:
            version = video.model_extra["shotloom"]["version_id"]
            return wait_for(lambda: stack.get(f"/version/{version}").json().get("run_id"), 30, "the run")

        def canceled_in_dagster(run_id: str) -> None:
            wait_for(lambda: dagster.run(run_id).status == "CANCELED", 60, f"run {run_id} CANCELED")

        # A long clip first (15 s: 241 frames, far from done whenever it is first seen running), then
        # short ones that fill the other worker and the queue; cancel the last, still queued.
        videos = [
            client.videos.create(prompt=f"clip {i}", size="64x64", seconds=seconds)
            for i, seconds in enumerate(("15", "2", "2", "2"))
        ]
        last = videos[-1]
        last_run = run_of(last)  # handed to Dagster: its queued run is canceled there too
        deleted = client.videos.delete(last.id)
        assert deleted.deleted is False and deleted.model_extra["status"] == "cancelled"
        assert client.videos.retrieve(last.id).status == "cancelled"
        canceled_in_dagster(last_run)

        # A running one: answered at once, stops at its next step or piece; its worker survives with
        # its model (ready again, the weights not loaded again).
        running = wait_status(stack, videos[0].id, ("in_progress", "completed", "failed"), timeout=300)
        assert running["status"] == "in_progress", running
        worker = wait_for(
            lambda: stack.get(f"/v1/videos/{videos[0].id}").json()["shotloom"]["worker"], 30, "its worker"
        )
        loads = {w["name"]: w["loads"] for w in stack.get("/health").json()["inference"]["workers"]}
        deleted = client.videos.delete(videos[0].id)
        assert deleted.deleted is False and deleted.model_extra["status"] in ("in_progress", "cancelled")
        done = wait_status(stack, videos[0].id, ("cancelled", "completed", "failed"))
        assert done["status"] == "cancelled", done
        canceled_in_dagster(run_of(videos[0]))

        def ready_again():
            found = next(
                w for w in stack.get("/health").json()["inference"]["workers"] if w["name"] == worker
            )
            return found if found["ready"] else None

        assert wait_for(ready_again, 60, f"{worker} ready again")["loads"] == loads[worker]

        # A finished one goes with its files; a cancelled one goes at the second DELETE.
        finished = wait_status(stack, videos[1].id, ("completed",))
        from settings.server import ServerConfig

        version = stack.get(f"/version/{finished['shotloom']['version_id']}").json()
        folder = (
            ServerConfig.load(stack.config).media_root / version["video_url"].split("/media/", 1)[1]
        ).parent
        assert (folder / "thumbnail.png").is_file() and (folder / "reference" / "middle.png").is_file()
        gone = client.videos.delete(finished["id"])
        assert gone.deleted is True and gone.object == "video.deleted"
        assert not folder.exists()  # the MP4, its stills and the frames it kept for later shots
        with pytest.raises(openai.NotFoundError):
            client.videos.retrieve(finished["id"])
        assert client.videos.delete(last.id).deleted is True
        with pytest.raises(openai.NotFoundError):
            client.videos.retrieve(last.id)

        # The workers and their model survived: a new job completes.
        after = client.videos.create_and_poll(prompt="after the cancels", size="64x64", seconds="1")
        assert after.status == "completed"

    def test_an_adapter_by_model_nickname_or_lora_and_unconfigured_ones_refused(self, client, stack):
        common = {"prompt": "a detective in the rain", "size": "64x64", "seconds": "1"}
        base = client.videos.create(**common, extra_body={"seed": 5})
        by_model = client.videos.create(model="noir", **common, extra_body={"seed": 5})
        by_lora = client.videos.create(
            **common, extra_body={"seed": 5, "lora": {"name": "anime", "scale": 0.8}}
        )
        assert by_model.model == "noir"
        digests = []
        for video in (base, by_model, by_lora):
            done = client.videos.poll(video.id, poll_interval_ms=300)
            assert done.status == "completed", done.error
            version = stack.get(f"/version/{done.model_extra['shotloom']['version_id']}").json()
            digests.append(next(a["sha256"] for a in version["artifacts"] if a["kind"] == "video"))
        assert len(set(digests)) == 3  # same prompt and seed: each adapter changed the result
        # The workers loaded the base weights once each, whatever the adapters asked.
        loads = [w["loads"] for w in stack.get("/health").json()["inference"]["workers"]]
        assert loads == [1, 1], loads
        for body, param in (
            ({"lora": {"name": "pixar"}}, "lora"),
            ({"lora": {"name": "anime", "path": "/tmp/x.safetensors"}}, "lora.path"),
            ({"model": "noir", "lora": {"name": "anime"}}, "lora"),
        ):
            resp = stack.post("/v1/videos", {**common, **body})
            assert (resp.status_code, resp.json()["error"]["param"]) == (400, param), resp.text
        assert (
            "pixar"
            in stack.post("/v1/videos", {"prompt": "x", "lora": {"name": "pixar"}}).json()["error"]["message"]
        )
        r2v = {"work_id": "w", "shot_id": "s", "prompt": "x", "memory_slots": []}
        resp = stack.post("/r2v", {**r2v, "lora": {"name": "pixar"}})
        assert resp.status_code == 422 and "lora" in resp.text
