"""The R2V scheduler API over real HTTP, on the whole stack started by server.py.

One stack per module (2 CPU workers, the tiny Wan checkpoint, temporary state, free ports) and a
callback receiver that refuses its first deliveries. Tests run in file order: later ones use the
shots earlier ones produced (memory by shot_id, merge).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import numpy as np
import pytest
import yaml
from PIL import Image

from api_stack import ApiStack, free_port, start_api_stack, stop_api_stack, wait_for

pytestmark = pytest.mark.slow


def png_data_url(seed: int = 0, size: int = 64) -> str:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 255, (size, size, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


class Receiver:
    """Callback endpoint that answers 500 to its first ``refuse`` deliveries."""

    def __init__(self, refuse: int):
        self.refuse = refuse
        self.attempts: list[dict] = []
        self.delivered: list[dict] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                entry = {
                    "body": body,
                    "delivery_id": self.headers.get("X-Shotloom-Delivery-Id"),
                    "secret": self.headers.get("X-Nanobot-Director-Secret"),
                    "at": time.time(),
                }
                receiver.attempts.append(entry)
                ok = len(receiver.attempts) > receiver.refuse
                if ok:
                    receiver.delivered.append(entry)
                self.send_response(200 if ok else 500)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()


@pytest.fixture(scope="module")
def receiver():
    r = Receiver(refuse=2)
    yield r
    r.close()


@pytest.fixture(scope="module")
def api(tmp_path_factory, wan_checkpoint) -> ApiStack:
    from shotloom.families.weights import build_tiny_lora

    root = tmp_path_factory.mktemp("api")
    (root / "allowed").mkdir()
    # A LoRA adapter in the server YAML (real diffusers LoRA files, random weights) for `lora`.
    adapters = [{"name": "anime", "path": str(build_tiny_lora(wan_checkpoint, root / "anime", seed=1))}]
    stack = start_api_stack(
        root,
        wan_checkpoint,
        api={"callback_backoff_seconds": 0.2, "inputs": {"allowed_roots": [str(root / "allowed")]}},
        adapters=adapters,
        # Offered stopped, as the shipped nightly and weekly ones: an operator switches it on (a
        # minute's cron so that its tick comes during the module; it matches no shot).
        rerender_offered=[{"name": "rerender_every_minute", "cron": "* * * * *", "shots": ["no-such-shot"]}],
    )
    try:
        yield stack
    finally:
        stop_api_stack(stack)


def shot(shot_id: str, **extra) -> dict:
    return {
        "work_id": "film",
        "shot_id": shot_id,
        "prompt": f"shot {shot_id}",
        "memory_slots": [],
        "seed": 7,
        **extra,
    }


def test_health_reports_every_part_ready(api):
    body = api.get("/health").json()
    assert body["status"] == "ok", body
    assert body["inference"]["enabled"] is True
    workers = body["inference"]["workers"]
    assert [w["name"] for w in workers] == ["cpu-0", "cpu-1"]
    assert all(w["ready"] and w["weight_location"] and w["resources"]["ram_total_bytes"] for w in workers)
    assert set(body["queues"]) == {"r2v", "merge"}
    assert set(body["queues"]["r2v"]) == {"queued", "running", "succeeded", "failed", "cancelled"}
    assert body["scheduler"]["workers_total"] == 2
    assert body["ffmpeg_available"] is True
    assert body["inference"]["residency"] == "auto"
    assert "swagger" in api.get("/docs").text.lower()


def test_the_dagster_ui_asks_no_one_to_sign_up(api):
    web = yaml.safe_load(api.config.read_text())["webserver"]
    answer = httpx.post(f"http://{web['host']}:{web['port']}/graphql", json={"query": "{ shouldShowNux }"})
    assert answer.json()["data"]["shouldShowNux"] is False  # no "Join the Dagster community" dialog


SCHEDULES_QUERY = """
query Automation($repo: RepositorySelector!) {
  schedulesOrError(repositorySelector: $repo) {
    __typename
    ... on Schedules { results { name scheduleState { id status ticks(limit: 5) { status runIds } } } }
  }
  sensorsOrError(repositorySelector: $repo) {
    __typename
    ... on Sensors { results { name sensorState { status } } }
  }
}
"""
START_SCHEDULE = """
mutation Start($selector: ScheduleSelector!) {
  startSchedule(scheduleSelector: $selector) {
    __typename
    ... on ScheduleStateResult { scheduleState { status } }
    ... on PythonError { message }
  }
}
"""
STOP_SCHEDULE = """
mutation Stop($id: String!) {
  stopRunningSchedule(id: $id) {
    __typename
    ... on ScheduleStateResult { scheduleState { status } }
  }
}
"""


def automation(api) -> tuple[dict[str, dict], dict[str, str]]:
    """The schedules (name -> state) and sensors (name -> status) the UI's Automation page lists."""
    gateway = api.gateway()
    loc = gateway.location()
    repo = {"repositoryLocationName": loc.location_name, "repositoryName": loc.repository_name}
    data = gateway.execute(SCHEDULES_QUERY, {"repo": repo})
    schedules = {s["name"]: s["scheduleState"] for s in data["schedulesOrError"]["results"]}
    sensors = {s["name"]: s["sensorState"]["status"] for s in data["sensorsOrError"]["results"]}
    return schedules, sensors


def test_an_operator_switches_on_a_schedule_the_yaml_does_not_list(api):
    """The code location defines the offered re-render schedules and the checkpoint sensor stopped
    (the YAML lists none); switched on over GraphQL (as the Automation page's toggle does), the
    schedule runs: its tick's run is checked by the last test of this module, a minute later."""
    schedules, sensors = automation(api)
    assert {name: state["status"] for name, state in schedules.items()} == {
        "rerender_every_minute": "STOPPED",
    }
    assert sensors == {"rerender_on_new_checkpoint": "STOPPED"}
    gateway = api.gateway()
    loc = gateway.location()
    selector = {
        "repositoryLocationName": loc.location_name,
        "repositoryName": loc.repository_name,
        "scheduleName": "rerender_every_minute",
    }
    started = gateway.execute(START_SCHEDULE, {"selector": selector})["startSchedule"]
    assert started["scheduleState"]["status"] == "RUNNING", started
    assert automation(api)[0]["rerender_every_minute"]["status"] == "RUNNING"


def test_r2v_with_inline_first_frame_succeeds_and_calls_back(api, receiver):
    req = shot(
        "s1",
        job_id="film-s1-v1",
        condition_img=png_data_url(1),
        callback_url=receiver.url,
        callback_context={"row": 3},
    )
    resp = api.post("/r2v", req)
    assert resp.status_code == 202, resp.text
    body = resp.json()
    vid = body["version_id"]
    assert body["task_id"] == vid == body["remote_task_id"]
    assert body["kind"] == "r2v" and body["accepted"] is True and body["status"] == "queued"
    assert body["stage"] == "queued" and body["queue_position"] >= 1
    assert body["status_url"] == f"{api.base}/version/{vid}"

    done = api.wait_version(vid)
    assert done["status"] == "succeeded", done["error"]
    assert done["stage"] == "succeeded"
    assert {"claimed", "inferring", "decoding", "writing"} <= set(done["stage_times"])
    assert done["worker"]["name"] in ("cpu-0", "cpu-1")
    assert done["video_url"].startswith(api.base + "/media/r2v/film/s1/")
    assert png_data_url(1)[-80:] not in json.dumps(done["request"])  # inline data is not echoed back
    [art] = [a for a in done["artifacts"] if a["kind"] == "video"]
    assert art["url"] == done["video_url"] and art["sha256"] and art["bytes"] > 0
    stills = {a["role"]: a for a in done["artifacts"] if a["kind"] == "image"}
    assert set(stills) == {"thumbnail", "spritesheet"}  # made once, when the video was written
    assert api.client.get(stills["thumbnail"]["url"]).headers["content-type"] == "image/png"
    assert "/tmp" not in json.dumps(api.get(f"/artifact/{art['artifact_id']}").json())

    media = httpx.get(done["video_url"], headers={"Range": "bytes=0-99"})
    assert media.status_code == 206 and len(media.content) == 100
    full = httpx.get(done["video_url"]).content
    assert len(full) == art["bytes"] and full[4:8] == b"ftyp"

    wait_for(lambda: receiver.delivered, 30, "callback delivery")
    assert len(receiver.attempts) == 3  # refused twice, retried with backoff, then delivered
    assert len({a["delivery_id"] for a in receiver.attempts}) == 1  # one delivery id across retries
    cb = receiver.delivered[0]["body"]
    assert cb["remote_task_id"] == vid and cb["status"] == "completed" and cb["job_id"] == "film-s1-v1"
    assert cb["shot_id"] == "s1" and cb["video_url"] == done["video_url"]
    # The Echo Director's words: status completed, the URL under the names its receiver reads first.
    assert cb["result_url"] == cb["artifact_url"] == done["video_url"] and cb["completed_at"].endswith("Z")
    assert cb["callback_context"] == {"row": 3}


def test_same_job_id_returns_the_original_version_and_other_payload_conflicts(api):
    first = api.post("/r2v", shot("s2", job_id="film-s2-v1"))
    assert first.status_code == 202
    again = api.post("/r2v", shot("s2", job_id="film-s2-v1"))
    assert again.status_code == 200 and again.json()["version_id"] == first.json()["version_id"]
    other = api.post("/r2v", shot("s2", job_id="film-s2-v1", prompt="something else"))
    assert other.status_code == 409 and "film-s2-v1" in other.json()["error"]

    with ThreadPoolExecutor(4) as pool:  # concurrent first requests with one new key
        answers = list(pool.map(lambda _: api.post("/r2v", shot("s3", job_id="film-s3-v1")), range(4)))
    assert sorted(a.status_code for a in answers) == [200, 200, 200, 202]
    assert len({a.json()["version_id"] for a in answers}) == 1
    assert api.wait_version(first.json()["version_id"])["status"] == "succeeded"


@pytest.mark.parametrize(
    ("patch", "status", "field"),
    [
        ({"memory_slots": [{"image_url": png_data_url()}] * 8}, 422, "memory_slots"),
        ({"memory_slots": [{"shot_id": "s1", "image_url": png_data_url()}]}, 422, "memory_slots[0]"),
        ({"memory_slots": [{"image_url": png_data_url(), "image_mode": "x"}]}, 422, "memory_slots[0]"),
        ({"memory_slots": [{"shot_id": "s1", "audio_mode": "empty"}]}, 422, "memory_slots[0]"),
        (
            {"memory_slots": [{"image_url": "data:image/png;base64,aGVsbG8="}]},
            422,
            "memory_slots[0].image_url",
        ),
        ({"condition_img": "/etc/passwd"}, 422, "condition_img"),
        ({"condition_img": "http://127.0.0.1:1/x.png"}, 422, "condition_img"),
        ({"prompt": "  "}, 422, "prompt"),
        ({"num_frames": 0}, 422, "num_frames"),
        ({"callback_url": "ftp://x"}, 422, "callback_url"),
        ({"memory_slots": [{"shot_id": "never-made"}]}, 409, "memory_slots[0].shot_id"),
        # Ids name folders of the media store: none may lead out of it (once a 202, then a failed write).
        ({"work_id": "../.."}, 422, "work_id"),
        ({"shot_id": "/etc"}, 422, "shot_id"),
        ({"shot_id": "a/../../b"}, 422, "shot_id"),
        ({"work_id": "a\\b"}, 422, "work_id"),
    ],
)
def test_bad_requests_are_refused_before_queueing(api, patch, status, field):
    before = api.get("/health").json()["queues"]["r2v"]
    resp = api.post("/r2v", {**shot("bad"), **patch})
    assert resp.status_code == status, resp.text
    assert resp.json()["error"].startswith(field), resp.json()
    assert api.get("/health").json()["queues"]["r2v"]["queued"] <= before["queued"]


def test_unknown_ids_and_traversal_are_404(api):
    assert api.get("/version/nope").status_code == 404
    assert api.get("/artifact/nope").status_code == 404
    for path in ("/media/../server.yaml", "/media/%2e%2e/server.yaml", "/media/r2v/missing.mp4"):
        assert httpx.get(api.base + path).status_code == 404, path


def test_memory_slot_by_shot_id_uses_the_newest_shot_of_the_work(api):
    from settings.server import ServerConfig
    from shotloom.media import file_sha256

    gateway = api.gateway()
    taken = len(gateway.find_runs_by_tag("shotloom/kind", "reference"))
    resp = api.post("/r2v", shot("s4", memory_slots=[{"shot_id": "s1"}]))
    assert resp.status_code == 202, resp.text
    done = api.wait_version(resp.json()["version_id"])
    assert done["status"] == "succeeded", done["error"]
    slot = done["request"]["inputs"]["memory_slots[0]"]
    assert slot["image"]["media_type"] == "image/png"
    # s1 kept its middle frame when its stills were made: the accept ran no media work for it.
    assert len(gateway.find_runs_by_tag("shotloom/kind", "reference")) == taken
    s1 = api.get(f"/version/{api.find_version('s1')}").json()["video_url"].split("/media/", 1)[1]
    kept = ServerConfig.load(api.config).media_root / s1
    assert slot["image"]["sha256"] == file_sha256(kept.parent / "reference" / "middle.png")


def test_ids_with_url_characters_give_urls_that_serve_their_files(api):
    """A client's own work and shot ids with '#', '?', '%', spaces and a '/': the video's URL and
    its artifacts' reach the files, and a later shot takes that shot by id as its memory."""
    work, take = "scene 1/act%41", "take #2? 100%"
    first = api.post("/r2v", shot(take, work_id=work))
    assert first.status_code == 202, first.text
    done = api.wait_version(first.json()["version_id"])
    assert done["status"] == "succeeded", done["error"]
    assert "/scene%201/act%2541/take%20%232%3F%20100%25/" in done["video_url"]
    assert httpx.get(done["video_url"]).content[4:8] == b"ftyp"
    assert all(httpx.get(a["url"]).status_code == 200 for a in done["artifacts"])
    later = api.post("/r2v", shot("next", work_id=work, memory_slots=[{"shot_id": take}]))
    assert later.status_code == 202, later.text
    assert api.wait_version(later.json()["version_id"])["status"] == "succeeded"


def test_a_source_video_slot_runs_video_to_video_from_an_earlier_version(api):
    s1 = api.find_version("s1")
    resp = api.post("/r2v", shot("s1-redo", memory_slots=[{"version_id": s1, "strength": 0.5}]))
    assert resp.status_code == 202, resp.text
    done = api.wait_version(resp.json()["version_id"])
    assert done["status"] == "succeeded", done["error"]
    assert done["request"]["inputs"]["memory_slots[0].version_id"]["version_id"] == s1
    assert done["result"]["frames"] == 17


def video_digest(version: dict) -> str:
    return next(a["sha256"] for a in version["artifacts"] if a["kind"] == "video")


def test_a_shot_with_a_configured_lora_runs_end_to_end(api):
    plain = api.post("/r2v", shot("lora-base", prompt="a detective in the rain"))
    styled = api.post(
        "/r2v", shot("lora-anime", prompt="a detective in the rain", lora={"name": "anime", "scale": 0.8})
    )
    assert plain.status_code == styled.status_code == 202, styled.text
    base, done = (api.wait_version(r.json()["version_id"]) for r in (plain, styled))
    assert base["status"] == done["status"] == "succeeded", done["error"]
    assert done["request"]["lora"] == {"name": "anime", "scale": 0.8}
    [art] = [a for a in done["artifacts"] if a["kind"] == "video"]
    assert art["metadata"]["adapter"] == "anime"  # recorded on the shot's materialization
    assert done["result"]["frames"] == 17
    assert video_digest(done) != video_digest(base)  # same prompt and seed: the adapter changed it


def test_a_source_video_slot_by_video_url_runs_video_to_video(api):
    from shotloom.media import file_sha256, write_mp4

    frames = np.zeros((17, 64, 64, 3), np.uint8)
    for i in range(17):
        frames[i, 20:40, 2 * i : 2 * i + 20] = (255, 255, 0)  # a square crossing the frame
    source = api.state.parent / "allowed" / "source.mp4"  # under the stack's api.inputs.allowed_roots
    write_mp4(source, frames, 16, None, None)
    slot = {"video_url": source.as_uri(), "strength": 0.5}
    from_video = api.post("/r2v", shot("v2v-url", prompt="a yellow kite", memory_slots=[slot]))
    text_only = api.post("/r2v", shot("v2v-url-text", prompt="a yellow kite"))
    assert from_video.status_code == text_only.status_code == 202, from_video.text
    done, alone = (api.wait_version(r.json()["version_id"]) for r in (from_video, text_only))
    assert done["status"] == alone["status"] == "succeeded", done["error"]
    used = done["request"]["inputs"]["memory_slots[0].video_url"]
    assert used["sha256"] == file_sha256(source) and used["media_type"] == "video/mp4"
    assert done["inputs"]["memory_slots[0].video_url"] == {"sha256": file_sha256(source)}
    assert done["request"]["memory_slots"] == [slot] and done["derived_from"] == []
    assert done["result"]["frames"] == 17
    assert video_digest(done) != video_digest(alone)  # same prompt and seed: the source changed it


def test_a_character_is_a_memory_slot_of_an_r2v_shot(api):
    s1 = api.get(f"/version/{api.find_version('s1')}").json()
    mp4 = api.client.get(s1["video_url"]).content
    made = api.client.post(
        api.base + "/v1/videos/characters",
        data={"name": "Ada"},
        files={"video": ("s1.mp4", mp4, "video/mp4")},
    )
    assert made.status_code == 200, made.text
    character = made.json()["id"]
    resp = api.post("/r2v", shot("s5", memory_slots=[{"character_id": character}]))
    assert resp.status_code == 202, resp.text
    done = api.wait_version(resp.json()["version_id"])
    assert done["status"] == "succeeded", done["error"]
    assert done["request"]["inputs"]["memory_slots[0].character_id"]["image"]["media_type"] == "image/png"
    unknown = api.post("/r2v", shot("s6", memory_slots=[{"character_id": "char_" + "0" * 32}]))
    assert unknown.status_code == 422 and "memory_slots[0].character_id" in unknown.text


def test_runs_show_few_tags_and_report_stages_as_events(api):
    """What an operator filters by is a tag (at most 8 listed); stage times, progress, plans and
    pids are run events and hidden tags: not listed, yet the API still reads every stage."""
    from api.dagster import DagsterGateway
    from contracts.events import PROGRESS_EVENT, STAGE_EVENT

    done = api.get(f"/version/{api.find_version('s1')}").json()
    web = yaml.safe_load(api.config.read_text())["webserver"]
    gateway = DagsterGateway(web["host"], web["port"])
    tags = gateway.run(done["run_id"]).tags  # as GraphQL (and the UI) list them
    assert len(tags) <= 8, tags
    assert (
        tags["shotloom/kind"] == "r2v"
        and tags["shotloom/work_id"] == "film"
        and tags["shotloom/shot_id"] == "s1"
    )
    assert tags["shotloom/worker"] in ("cpu-0", "cpu-1") and tags["user"] == "api"
    assert tags["shotloom/version_id"] == done["version_id"]
    assert not any(k.startswith(".dagster") or "stage" in k for k in tags)  # read from events instead
    events, _ = gateway.engine_events(done["run_id"])
    entered = [e.metadata[STAGE_EVENT] for e in events if STAGE_EVENT in e.metadata]
    assert entered[:2] == ["claimed", "validating"] and {"inferring", "decoding", "writing"} <= set(entered)
    assert any(PROGRESS_EVENT in e.metadata for e in events)
    assert list(done["stage_times"])[:2] == ["claimed", "validating"]  # the API read them back


def test_operators_pause_reorder_and_cancel_the_queue(api):
    from api.dagster import DagsterGateway

    web = yaml.safe_load(api.config.read_text())["webserver"]
    gateway = DagsterGateway(web["host"], web["port"])
    assert api.client.post(api.base + "/queue/pause").json()["paused"] is True
    try:
        a, b, c = (api.post("/r2v", shot(f"q-{n}")).json()["version_id"] for n in "abc")
        scratch = [
            api.post("/r2v", {**shot(f"tmp-{n}"), "work_id": "scratch"}).json()["version_id"] for n in (1, 2)
        ]
        runs = {
            v: wait_for(lambda v=v: api.get(f"/version/{v}").json().get("run_id"), 30, "runs")
            for v in (a, b, c, *scratch)
        }
        time.sleep(3)  # several dequeues: nothing starts while intake is paused
        assert all(api.get(f"/version/{v}").json()["stage"] == "queued" for v in (a, b, c))

        moved = api.client.post(api.base + f"/queue/jobs/{c}/priority", json={"priority": 10}).json()
        assert (moved["priority"], moved["position"]) == (10, 1)
        order = [q["version_id"] for q in api.get("/queue").json()["queued"]]
        assert order[:3] == [c, a, b]
        finished = api.find_version("s1")
        resp = api.client.post(api.base + f"/queue/jobs/{finished}/priority", json={"priority": 1})
        assert resp.status_code == 409

        cancelled = api.client.post(api.base + "/queue/works/scratch/cancel").json()["cancelled"]
        assert sorted(cancelled) == sorted(scratch)
        for v in scratch:  # at once when Dagster had queued the run, else when the follower retries
            wait_for(lambda v=v: api.get(f"/version/{v}").json()["stage"] == "canceled", 30, f"{v} cancelled")

        # Each action is an event on the runs it touched (recorded by the daemon's coordinator).
        def messages(v: str) -> list[str]:
            return [e.message for e in gateway.engine_events(runs[v])[0]]

        wait_for(lambda: any("Queue priority set to 10" in m for m in messages(c)), 30, "the priority event")
        assert any("Intake to the devices paused" in m for m in messages(a))
        wait_for(
            lambda: any("Cancelled by api with every queued job of work scratch" in e.message
                        for e in gateway.engine_events(runs[scratch[0]])[0]),
            30, "the cancel event on the run",
        )  # fmt: skip
    finally:
        assert api.client.post(api.base + "/queue/resume").json()["paused"] is False
    done = {v: api.wait_version(v) for v in (a, b, c)}
    assert all(d["status"] == "succeeded" for d in done.values())
    times = [done[v]["stage_times"]["claimed"] for v in (c, a, b)]
    assert times == sorted(times)  # the raised one went first, then FIFO
    assert any("resumed" in e.message for e in gateway.engine_events(runs[b])[0])


def test_a_run_dagster_refuses_fails_its_job_and_blocks_no_other(api):
    """A job whose run Dagster refuses (here a run config its schema does not know, as after an
    upgrade that renamed a field) fails with Dagster's reason; the jobs behind it still run."""
    from api.store import NewJob, Store

    store = Store(f"sqlite:///{api.state / 'api' / 'service.sqlite'}", create=False)
    try:
        config = {"work_id": "film", "shot_id": "bad", "prompt": "x", "no_such_field": 1}
        bad = store.accept(
            NewJob(
                kind="r2v",
                work_id="film",
                shot_id="bad",
                payload_hash="0" * 64,
                request={"job_name": "r2v", "run_config": {"ops": {"condition_op": {"config": config}}}},
            )
        ).version_id
    finally:
        store.close()
    good = api.post("/r2v", shot("after-bad")).json()["version_id"]
    assert api.wait_version(good)["status"] == "succeeded"
    failed = api.wait_version(bad, timeout=60)
    assert failed["status"] == "failed" and "Dagster refused the run" in failed["error"]
    assert "no_such_field" in failed["error"]


def test_a_client_reads_a_whole_job_as_server_sent_events_and_resumes(api):
    version = api.post("/r2v", shot("streamed")).json()["version_id"]
    events = api.events(f"/version/{version}/events")
    kinds = [e["event"] for e in events]
    assert kinds[-1] == "done" and set(kinds[:-1]) == {"update"}
    final = events[-1]["data"]
    assert final == api.get(f"/version/{version}").json()  # the same view polling answers
    assert final["status"] == "succeeded" and final["video_url"]
    stages_seen = [e["data"]["stage"] for e in events]
    assert len(set(stages_seen)) >= 3, stages_seen  # stage changes arrived as they happened
    ids = [int(e["id"]) for e in events]
    assert ids == sorted(ids)
    # Reconnecting: after the end, 204 (an EventSource stops); from an earlier id, the final view.
    after_end = api.client.get(
        api.base + f"/version/{version}/events", headers={"Last-Event-ID": events[-1]["id"]}
    )
    assert after_end.status_code == 204
    resumed = api.events(f"/version/{version}/events", last_event_id=events[0]["id"])
    assert [e["event"] for e in resumed] == ["done"] and resumed[0]["data"] == final
    assert api.client.get(api.base + "/version/nope/events").status_code == 404


def test_merge_by_version_ids_produces_one_film(api, receiver):
    versions = [api.find_version("s1"), api.find_version("s4")]
    receiver.refuse, receiver.attempts, receiver.delivered = 0, [], []
    resp = api.post(
        "/merge",
        {
            "payload": {"work_id": "film", "shots": [{"version_id": v} for v in versions]},
            "job": {"job_id": "film-merge-v1"},
        },
        headers={"X-Nanobot-Director-Callback-Url": receiver.url},
    )
    assert resp.status_code == 202, resp.text
    body = resp.json()
    assert body["kind"] == "merge"
    done = api.wait_version(body["version_id"])
    assert done["status"] == "succeeded", done["error"]
    assert done["video_url"].startswith(api.base + "/media/merge/film/")
    [art] = [a for a in done["artifacts"] if a["kind"] == "video"]
    assert art["role"] == "film" and art["metadata"]["frames"] == 2 * 17
    assert {a["role"] for a in done["artifacts"] if a["kind"] == "image"} == {"thumbnail", "spritesheet"}
    wait_for(lambda: receiver.delivered, 30, "merge callback")
    cb = receiver.delivered[0]["body"]
    assert cb["job_id"] == "film-merge-v1" and cb["result"]["video_url"] == done["video_url"]
    assert cb["status"] == "completed" and cb["result"]["result_url"] == done["video_url"]

    missing = api.post("/merge", {"work_id": "film", "shots": [{"version_id": "nope"}]})
    assert missing.status_code == 409 and missing.json()["error"].startswith("shots[0].version_id")
    outside = api.post("/merge", {"work_id": "..", "shots": [{"version_id": v} for v in versions]})
    assert outside.status_code == 422 and outside.json()["error"].startswith("work_id"), outside.text

    # The merge ran in the long-lived media worker's process (no process started per merge).
    from contracts.tags import WORKER_TAG
    from orchestration.launcher import read_workers

    media = sorted(w.name for w in read_workers(api.state, "media"))
    health = api.get("/health").json()
    assert [w["name"] for w in health["media_workers"]] == media and health["ready"]["media_workers"]

    # Lineage, walked through Dagster's GraphQL as an operator's tool would: the film's
    # materialization names its shots' versions; each version's run recorded its shot with the
    # inputs it was conditioned on (content hashes, and the earlier version a memory slot came from).
    from api.dagster import DagsterGateway
    from contracts.tags import VERSION_TAG

    web = yaml.safe_load(api.config.read_text())["webserver"]
    gateway = DagsterGateway(web["host"], web["port"])
    merge_run = gateway.run(done["run_id"])
    assert merge_run.tags[WORKER_TAG] in media
    [film] = [m for m in gateway.materializations(done["run_id"]) if m.asset_key == ("film",)]
    assert film.metadata["versions"] == versions
    assert done["derived_from"] == versions  # GET /version says the same
    shots = {}
    for version in versions:
        # The shot's runs: the generation on a device worker, then its stills on the media worker
        # (the device slot was free before the PNGs were made).
        runs = sorted(gateway.find_runs_by_tag(VERSION_TAG, version), key=lambda r: r.create_time or 0)
        assert [(r.job_name, r.status) for r in runs] == [("r2v", "SUCCESS"), ("shot_stills", "SUCCESS")]
        assert runs[0].tags[WORKER_TAG].startswith("cpu-") and runs[1].tags[WORKER_TAG] in media
        assert runs[0].run_id == api.get(f"/version/{version}").json()["run_id"]  # the one that made it
        [shot] = [m for m in gateway.materializations(runs[0].run_id) if m.asset_key == ("shot",)]
        [stills] = [m for m in gateway.materializations(runs[1].run_id) if m.asset_key == ("shot_stills",)]
        assert stills.metadata["video"] == shot.metadata["path"]
        shots[version] = shot.metadata
    s1, s4 = (shots[v] for v in versions)
    assert s1["derived_from"] == [] and s1["checkpoint"] and s1["version_id"] == versions[0]
    first_frame = base64.b64decode(png_data_url(1).split(",", 1)[1])
    assert s1["inputs"]["condition_img"]["sha256"] == hashlib.sha256(first_frame).hexdigest()
    assert s4["derived_from"] == [versions[0]]  # s4 took s1 as memory
    slot = s4["inputs"]["memory_slots[0]"]
    assert slot["version_id"] == versions[0] and slot["shot_id"] == "s1" and len(slot["sha256"]) == 64
    assert api.get(f"/version/{versions[1]}").json()["inputs"] == s4["inputs"]


# -- the Dagster UI, in a real headless Chromium -------------------------------------------------
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(
    CHROMIUM is None and not os.environ.get("CI"),
    reason="Debian's chromium is not installed (.ci/run installs it)",
)
def test_an_operator_sees_lineage_runs_stages_and_partitions_in_the_ui(api, tmp_path):
    """Runs after the shots and the merge above: the pages an operator opens, rendered by Chromium
    (Debian's package, driven by Playwright; no browser is downloaded), with screenshots."""
    from playwright.sync_api import sync_playwright

    web = yaml.safe_load(api.config.read_text())["webserver"]
    ui = f"http://{web['host']}:{web['port']}"
    s1 = api.get(f"/version/{api.find_version('s1')}").json()
    seen: dict[str, str] = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1600, "height": 1000})

        def visit(name: str, path: str, expect: str) -> str:
            page.goto(ui + path)
            page.get_by_text(expect).first.wait_for(timeout=30_000)
            page.wait_for_load_state("networkidle")
            page.screenshot(path=tmp_path / f"{name}.png")
            seen[name] = text = page.inner_text("body")
            return text

        try:
            lineage = visit("lineage", "/asset-groups", "Global asset lineage")
            assert "shot" in lineage and "film" in lineage
            upstream = visit("film-lineage", "/assets/film?view=lineage", "Lineage")
            assert "shot" in upstream  # the edge: film depends on shot
            runs = visit("runs", "/runs", "Launched by")
            assert "shotloom/worker: cpu-0" in runs and "shotloom/worker: cpu-1" in runs  # each run's device
            assert "shotloom/work_id: film" in runs and "shotloom/kind: merge" in runs
            assert "shotloom/stage_at" not in runs and "admission_plan" not in runs  # hidden, not listed
            run = visit("run", f"/runs/{s1['run_id']}", "ENGINE_EVENT")
            assert "stage: " in run and "shotloom/stage" in run  # stage events with their metadata
            partitions = visit("shot-partitions", "/assets/shot?view=partitions", "Materialized")
            assert "s1" in partitions and "film" in partitions

            def preview(name: str, path: str) -> list[dict]:
                """Open the newest materialization's preview: its images, as Chromium drew them."""
                visit(name, path, "[Show Markdown]")
                page.get_by_text("[Show Markdown]").first.click()
                dialog = page.get_by_role("dialog")
                dialog.locator("img").first.wait_for(timeout=30_000)
                page.wait_for_function(
                    "() => [...document.querySelectorAll('[role=dialog] img')].every(i => i.complete)"
                )
                page.screenshot(path=tmp_path / f"{name}-preview.png")
                seen[f"{name}-preview"] = dialog.inner_text()
                images = dialog.locator("img").evaluate_all(
                    "imgs => imgs.map(i => ({alt: i.alt, width: i.naturalWidth, height: i.naturalHeight}))"
                )
                page.keyboard.press("Escape")
                return images

            # A shot's stills: its thumbnail drawn, links to its MP4 and spritesheet beside it.
            [thumb] = preview("shot-stills", "/assets/shot_stills?view=events")
            assert thumb["alt"] == "thumbnail" and thumb["width"] > 0 and thumb["height"] > 0
            assert "MP4" in seen["shot-stills-preview"] and "spritesheet" in seen["shot-stills-preview"]
            # A film: its own thumbnail, then its shots' in order.
            film, *shots = preview("film", "/assets/film?view=events")
            assert film["alt"] == "film" and film["width"] > 0
            assert [s["alt"] for s in shots] == ["s1", "s4"] and all(s["width"] > 0 for s in shots)
        finally:
            browser.close()
    for name, text in seen.items():
        assert "Join the Dagster community" not in text and "Sign up" not in text, name
    assert sorted(x.name for x in tmp_path.glob("*.png")) == sorted(f"{n}.png" for n in seen)
    print(f"screenshots: {tmp_path}")


# Last: it makes new versions of s1 (the tests above read s1 as first made).
def test_a_manual_rerender_makes_new_versions_below_interactive_work(api):
    from api.dagster import DagsterGateway

    before = api.find_version("s1")
    unseeded = {k: v for k, v in shot("s9").items() if k != "seed"}  # the worker draws its seed
    first_s9 = api.wait_version(api.post("/r2v", unseeded).json()["version_id"])
    body = {"works": ["film"], "shots": ["s1"], "seed": "keep", "reason": "new-checkpoint", "key": "tick-1"}
    answer = api.client.post(api.base + "/queue/rerender", json=body).json()
    [made] = answer["accepted"]
    assert (made["shot_id"], made["rerender_of"], made["created"]) == ("s1", before, True)
    again = api.client.post(api.base + "/queue/rerender", json=body).json()["accepted"]
    assert [(a["version_id"], a["created"]) for a in again] == [(made["version_id"], False)]  # same key: once
    done = api.wait_version(made["version_id"])
    assert done["status"] == "succeeded" and done["derived_from"] == [before]
    assert api.find_version("s1") == made["version_id"]  # memory by shot_id now takes the re-render
    old = api.get(f"/version/{before}").json()
    assert done["result"]["seed"] == old["result"]["seed"]  # seed kept
    web = yaml.safe_load(api.config.read_text())["webserver"]
    tags = DagsterGateway(web["host"], web["port"]).run(done["run_id"]).tags
    assert tags["shotloom/rerender"] == "new-checkpoint" and tags["dagster/priority"] == "-10"
    listed = {"work_id", "shot_id", "version_id", "kind", "worker", "rerender"}
    assert set(tags) <= {f"shotloom/{k}" for k in listed} | {
        "user",
        "dagster/priority",
        "dagster/code_location",
    }
    kept = api.client.post(api.base + "/queue/rerender", json={"shots": ["s9"], "key": "tick-4"}).json()
    redone = api.wait_version(kept["accepted"][0]["version_id"])
    assert redone["result"]["seed"] == first_s9["result"]["seed"]  # drawn once, then kept
    fresh = api.client.post(
        api.base + "/queue/rerender", json={**body, "seed": "new", "key": "tick-2"}
    ).json()
    new_seed = api.wait_version(fresh["accepted"][0]["version_id"])["result"]["seed"]
    assert new_seed != old["result"]["seed"]
    # A tag filter: only shots whose runs carry these tags.
    nobody = {"shots": ["s1"], "key": "tick-x", "match": {"user": "studio-z"}}
    assert api.client.post(api.base + "/queue/rerender", json=nobody).json()["accepted"] == []
    # s4 took s1 as memory: its re-render takes the newest s1, not the frame of its first making.
    newest_s1 = api.find_version("s1")
    ask = {"shots": ["s4"], "key": "tick-3", "match": {"shotloom/kind": "r2v", "user": "api"}}
    s4 = api.client.post(api.base + "/queue/rerender", json=ask).json()
    redo = api.wait_version(s4["accepted"][0]["version_id"])
    assert redo["status"] == "succeeded", redo["error"]
    assert redo["inputs"]["memory_slots[0]"]["version_id"] == newest_s1 != before


def test_the_rerender_job_from_the_launchpad_goes_through_the_api(api):
    """What an operator launches from the Launchpad (and what a schedule tick runs): the small
    rerender job, on the stock launcher (no device), asking the API for new versions."""
    from api.dagster import DagsterGateway

    before = api.find_version("s2")
    web = yaml.safe_load(api.config.read_text())["webserver"]
    gateway = DagsterGateway(web["host"], web["port"])
    config = {
        "works": ["film"],
        "shots": ["s2"],
        "seed": "keep",
        "priority": -5,
        "reason": "launchpad",
        "key": "lp-1",
    }
    run_id = gateway.submit("rerender", {"ops": {"rerender_op": {"config": config}}}, {})
    run = wait_for(lambda: (r := gateway.run(run_id)).finished and r, 120, "the rerender run")
    assert run.status == "SUCCESS", run
    assert "shotloom/worker" not in run.tags  # no device worker took it: the stock launcher ran it
    newer = wait_for(lambda: (v := api.find_version("s2")) != before and v, 120, "the new version of s2")
    done = api.wait_version(newer)
    assert done["derived_from"] == [before] and done["status"] == "succeeded"
    assert gateway.run(done["run_id"]).tags["user"] == "launchpad"  # "launched by" who asked


def test_the_schedule_switched_on_ticks_and_its_run_asks_the_api(api):
    """The schedule switched on at the top of this module has ticked by now (its cron: every
    minute): the tick launched the rerender job, which succeeded (it matched no shot)."""
    gateway = api.gateway()

    def ticked() -> list[str] | None:
        state = automation(api)[0]["rerender_every_minute"]
        runs = [run_id for tick in state["ticks"] if tick["status"] == "SUCCESS" for run_id in tick["runIds"]]
        return runs or None

    [run_id, *_] = wait_for(ticked, 150, "a tick of the schedule switched on")
    run = wait_for(lambda: (r := gateway.run(run_id)).finished and r, 120, "the tick's rerender run")
    assert run.job_name == "rerender" and run.status == "SUCCESS", run
    assert run.tags.get("dagster/schedule_name") == "rerender_every_minute"
    state = automation(api)[0]["rerender_every_minute"]
    stopped = gateway.execute(STOP_SCHEDULE, {"id": state["id"]})["stopRunningSchedule"]
    assert stopped["scheduleState"]["status"] == "STOPPED", stopped
