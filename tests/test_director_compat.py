"""What the Echo Director (nanobot) sends and reads, held to the r2v spec's promises: its /merge
envelope ("/merge also accepts the Echo Director envelope fields payload, job.job_id, and callback"),
the routing it reads back from a callback's top level ("callback_context: Object copied into
supported callback context fields"), and the /health counters its admission reads ("the
`scheduler` counters consumed by Echo Director admission").

The shapes below are the Director's own: its merge envelope as ``_build_remote_request_envelope``
and ``_build_merge_payload`` build it (nanobot/agent/tools/director.py, and its "Director Merge
Protocol" document), the ``callback_context`` its ``_submit_r2v_request`` sends to /r2v, the keys
its callback channel reads (``body.get("session_key" | "channel" | "chat_id")``), and its admission
rule (nanobot/integrations/echo_admission.py): ``workers = scheduler.queues.inference.workers``,
``works = scheduler.gpu_busy + scheduler.total_queued``, busy when ``works >= workers``."""

from __future__ import annotations

import pytest
from bare_api import bare_app, r2v_refusal

from api.core.limits import MAX_SEED
from api.core.outcome import CONTEXT_FIELDS, callback_payload
from api.r2v.protocol import DIRECTOR_PROTOCOL, MergeRequest
from api.store import NewJob, Store, payload_hash
from settings.api import ApiConfig

SESSION = {
    "session_key": "websocket:cafc067e-c8e3-4fb2-af11-62bc5c04e8d2",
    "channel": "websocket",
    "chat_id": "cafc067e-c8e3-4fb2-af11-62bc5c04e8d2",
}
JOB_ID = "merge-work-20260429-demo-final-20260429T140000Z"


def director_merge(**over) -> dict:
    """The Director's POST /merge body (protocol director-http-v1, operation merge_shot)."""
    body = {
        "protocol_version": DIRECTOR_PROTOCOL,
        "operation": "merge_shot",
        "job": {
            "job_id": JOB_ID,
            "work_id": "work-20260429-demo",
            "target": "final",
            "created_at": "2026-04-29T14:00:00Z",
        },
        "callback": {
            "event_type": "director_remote_result",
            "protocol_version": DIRECTOR_PROTOCOL,
            "operation": "merge_shot",
            "work_id": "work-20260429-demo",
            "job_id": JOB_ID,
            "target": "final",
            **SESSION,
            "inject_back_to_agent": True,
            "note": "When the backend finishes, ...",
            "url": "http://127.0.0.1:18791/api/director/merge-shot/callback",
        },
        "payload": {
            "work_id": "work-20260429-demo",
            "shot_ids": [1, 2],
            "shots": [
                {"shot_id": 1, "version_id": "r2v-version-id-for-shot-001"},
                {"shot_id": 2, "video_url": "https://cdn.example/shot_002.mp4"},
            ],
        },
    }
    body.update(over)
    return body


# -- the merge envelope ---------------------------------------------------------------------------


def test_the_directors_merge_envelope_is_accepted_with_its_callback_routing():
    req = MergeRequest.model_validate(director_merge())
    assert req.normalized() == {
        "work_id": "work-20260429-demo",
        "job_id": JOB_ID,
        "shots": [
            {"version_id": "r2v-version-id-for-shot-001"},
            {"video_url": "https://cdn.example/shot_002.mp4"},
        ],
        "callback_url": "http://127.0.0.1:18791/api/director/merge-shot/callback",
        "callback_context": SESSION,
    }
    spec = req.to_spec()
    assert spec.job_id == JOB_ID and spec.callback_context == SESSION
    assert spec.callback_url == "http://127.0.0.1:18791/api/director/merge-shot/callback"
    assert [s.field for s in spec.shots] == ["shots[0].version_id", "shots[1].video_url"]
    # The envelope's extras change nothing the idempotency key covers: the same merge, flat.
    flat = MergeRequest.model_validate({"work_id": "work-20260429-demo", "shots": req.normalized()["shots"]})
    assert payload_hash(req.idempotency_payload()) == payload_hash(flat.idempotency_payload())


def test_an_explicit_callback_context_keeps_its_keys_and_gains_the_routing():
    body = director_merge()
    body["callback"]["context"] = {"row": 3}
    assert MergeRequest.model_validate(body).normalized()["callback_context"] == {"row": 3, **SESSION}
    body["callback"]["context"] = {"row": 3, "channel": "telegram"}
    assert (
        "callback.channel and the callback context's channel disagree"
        in r2v_refusal(MergeRequest, body)["error"]
    )


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (("protocol_version",), 1, "protocol_version"),
        (("protocol_version",), "", "protocol_version"),
        (("operation",), "r2v_generate", "operation"),
        (("payload", "shots", 0, "shot_id"), True, "payload.shots[0].shot_id"),
        (("payload", "shots", 0, "shot_id"), -1, "payload.shots[0].shot_id"),
        (("payload", "shots", 0, "shot_id"), {"n": 1}, "payload.shots[0].shot_id"),
        (("payload", "shot_ids"), [1, None], "payload.shot_ids[1]"),
        (("callback", "session_key"), 7, "callback.session_key"),
        (("callback", "chat_id"), ["x"], "callback.chat_id"),
        (("surprise",), 1, "surprise"),  # still strict: only the Director's own fields are new
    ],
)
def test_the_envelope_fields_are_type_checked_naming_them(path, value, field):
    body = director_merge()
    node = body
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    detail = r2v_refusal(MergeRequest, body)["detail"]
    assert any(d["field"].startswith(field) for d in detail), detail


def test_a_shot_of_the_envelope_still_needs_a_source():
    body = director_merge()
    body["payload"]["shots"] = [{"shot_id": 1}]
    assert r2v_refusal(MergeRequest, body)["detail"][0]["field"] == "payload.shots[0]"


# -- callbacks ------------------------------------------------------------------------------------


@pytest.fixture
def store(tmp_path):
    s = Store(f"sqlite:///{tmp_path / 'service.sqlite'}")
    yield s
    s.close()


def _accept(store: Store, kind: str, context: dict | None, **fields):
    request = {"kind": kind, "n": fields.pop("n", 0)}
    return store.accept(
        NewJob(
            kind=kind,
            work_id="work-20260429-demo",
            request=request,
            payload_hash=payload_hash(request),
            callback_url="http://127.0.0.1:18791/api/director/echo-generate-shot/callback",
            callback_context=context,
            **fields,
        )
    ).job


def test_an_r2v_callback_carries_the_directors_routing_at_the_top_level(store):
    # What _submit_r2v_request sends: callback_context = {session_key, channel, chat_id}.
    context = {**SESSION, "row": 3}
    job = _accept(store, "r2v", context, shot_id="shot_001", job_id="echo-w-shot_001-x")
    job = store.update_status(job.version_id, status="failed", stage="failed", error="boom")
    body = callback_payload(job, store, ApiConfig())
    for key in CONTEXT_FIELDS:  # where the Director's callback channel reads them
        assert body[key] == SESSION[key]
    assert "row" not in body  # only the supported fields are copied
    assert body["callback_context"] == context  # and the context stays whole (additive)
    assert (body["status"], body["error"], body["shot_id"]) == ("failed", "boom", "shot_001")


def test_a_merge_accepted_from_the_envelope_calls_back_with_its_routing(store):
    spec = MergeRequest.model_validate(director_merge()).to_spec()
    job = _accept(store, "merge", spec.callback_context, job_id=spec.job_id)
    job = store.update_status(job.version_id, status="failed", stage="failed", error="merge failed")
    body = callback_payload(job, store, ApiConfig())
    assert {k: body[k] for k in CONTEXT_FIELDS} == SESSION
    assert (body["job_id"], body["work_id"]) == (JOB_ID, "work-20260429-demo")


def test_a_success_calls_back_as_the_directors_receivers_accept_it(store):
    """Its receivers answer 400 to a status other than completed or failed, and read the video's
    URL first as result_url, then artifact_url, then video_url (the merge's under result)."""
    url = "http://127.0.0.1:8221/media/r2v/w/shot_001/r1/output.mp4"
    shot = _accept(store, "r2v", dict(SESSION), shot_id="shot_001", job_id="echo-w-shot_001-x")
    shot = store.update_status(
        shot.version_id, status="succeeded", stage="succeeded", result={"video_path": url.split("/media/")[1]}
    )
    body = callback_payload(shot, store, ApiConfig())
    assert body["status"] == "completed" and body["completed_at"].endswith("Z")
    assert body["result_url"] == body["artifact_url"] == body["video_url"] == url
    film = _accept(store, "merge", dict(SESSION), job_id=JOB_ID)
    film = store.update_status(
        film.version_id, status="succeeded", stage="succeeded", result={"video_path": "merge/w/r2/film.mp4"}
    )
    result = callback_payload(film, store, ApiConfig())["result"]
    assert result["result_url"] == result["artifact_url"] == result["video_url"]
    assert result["video_url"].endswith("/media/merge/w/r2/film.mp4")
    # The service's own word stays succeeded where a client polls it.
    assert store.get(film.version_id).status == "succeeded"


def test_a_context_without_the_fields_adds_nothing_and_none_stays_absent(store):
    plain = callback_payload(_accept(store, "r2v", {"row": 3}, n=1), store, ApiConfig())
    none = callback_payload(_accept(store, "r2v", None, n=2), store, ApiConfig())
    assert not set(CONTEXT_FIELDS) & set(plain) and plain["callback_context"] == {"row": 3}
    assert not set(CONTEXT_FIELDS) & set(none) and "callback_context" not in none


# -- the HTTP routes: /r2v's seed, /merge's envelope, /health's counters -------------------------


@pytest.mark.parametrize("seed", [2**64, MAX_SEED, -1])
def test_r2v_refuses_a_seed_the_worker_cannot_take_naming_it_before_queueing(tmp_path, seed):
    client, ctx = bare_app(tmp_path)
    ctx.background.started = True
    body = {"work_id": "w", "shot_id": "s", "prompt": "rain", "memory_slots": [], "seed": seed}
    resp = client.post("/r2v", json=body)
    assert resp.status_code == 422, resp.text
    assert resp.json()["error"].startswith("seed: ")
    assert ctx.store.counts_by_status("r2v")["queued"] == 0  # nothing was queued
    ctx.store.close()


def test_merge_route_takes_the_directors_envelope(tmp_path):
    client, ctx = bare_app(tmp_path)
    ctx.background.started = True
    body = director_merge()
    body["payload"]["shots"] = [{"shot_id": 1, "version_id": "no-such-version"}]
    resp = client.post(
        "/merge", json=body, headers={"X-Nanobot-Director-Callback-Url": body["callback"]["url"]}
    )
    # Past validation: the shot it names is looked up (the envelope itself is not refused).
    assert resp.status_code != 422, resp.text
    assert "no-such-version" in resp.text
    bad = client.post("/merge", json={**body, "operation": "r2v_generate"})
    assert bad.status_code == 422 and bad.json()["error"].startswith("operation: ")
    ctx.store.close()


def _director_admission(health: dict) -> tuple[float | None, float | None]:
    """EchoAdmissionController.extract_signals, as the Director reads /health."""
    scheduler = health.get("scheduler") or {}
    workers = ((scheduler.get("queues") or {}).get("inference") or {}).get("workers")
    busy, queued = scheduler.get("gpu_busy"), scheduler.get("total_queued")
    works = None if busy is None or queued is None else busy + queued
    return workers, works


def test_health_sends_the_counters_the_directors_admission_reads(tmp_path):
    client, ctx = bare_app(tmp_path, worker_names=["gpu-0", "gpu-1"])
    ctx.background.workers = {
        "gpu-0": {"pool": "device", "state": "busy", "run_id": None},
        "gpu-1": {"pool": "device", "state": "idle"},
        "media-0": {"pool": "media", "state": "busy"},
    }
    _accept(ctx.store, "r2v", None, n=1)  # a shot waiting for a device worker
    _accept(ctx.store, "merge", None, n=2)  # a merge waits for a media worker: not counted
    scheduler = client.get("/health").json()["scheduler"]
    assert scheduler["queues"] == {"inference": {"workers": 2}}
    assert (scheduler["gpu_busy"], scheduler["total_queued"]) == (1, 1)
    # The counters that were there stay (additive).
    assert (scheduler["workers_total"], scheduler["workers_busy"], scheduler["pending_tasks"]) == (2, 1, 2)
    workers, works = _director_admission({"scheduler": scheduler})
    assert (workers, works) == (2, 2)  # the Director holds the next generation back: 2 >= 2
    ctx.store.close()
