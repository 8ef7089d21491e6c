"""The OpenAPI documents, run against the running server by schemathesis (property-based),
and the /v1 backpressure, on a stack with small limits: each dialect's document, then what else
``/openapi.json`` holds (the operator's queue, metrics, the workers' calls), so every route of the
shipped service is run; and both Server-Sent Events routes on real jobs, each event checked
against the documented one.

For every operation of ``/v1/openapi.json`` and ``/r2v/openapi.json`` (as the server publishes
them, with the loaded model's grids written in), schema-valid requests are generated and sent
over real HTTP to the API, served in the test process on the in-process Dagster gateway (its runs
executed for real): no answer may be a server error, use a status the document does not declare,
or carry a body outside its declared schema. The stack runs with small limits
(clips of at most 1 s at 64x64, a queue of 2) so that accepted requests are cheap jobs and most
later ones meet a full queue (429/503, both declared). Bounded: a fixed number of examples per
operation, derandomized so a CI run is repeatable.

``POST /v1/videos/sync`` and the image routes are left out: they hold the connection until their
jobs end or the configured wait runs out (a declared 504); tests/test_openai_api.py drives them.
"""

from __future__ import annotations

from collections import Counter

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from api_stack import ApiStack, start_api_stack, stop_api_stack, wait_for

QUEUE_FULL_R2V = ("/r2v", "/merge")


@schemathesis.check
def no_server_error(ctx, response, case) -> None:
    """No 5xx, except the one the R2V contract prescribes: 503 for a full queue
    (../shared/spec/r2v-scheduler.md; the /v1 dialect answers the same condition with 429)."""
    if response.status_code == 503 and case.path in QUEUE_FULL_R2V and "queue is full" in response.text:
        return None
    return not_a_server_error(ctx, response, case)


CHECKS = [no_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
EXAMPLES = {"POST": 25, "GET": 10, "DELETE": 10, "HEAD": 5}
# Routes that hold the connection until generations end (or their configured wait, a declared 504):
# tests/test_openai_api.py drives them directly.
SKIP = {
    ("POST", "/v1/videos/sync"),
    ("POST", "/v1/images"),
    ("POST", "/v1/images/generations"),
    ("POST", "/v1/images/edits"),
}


@pytest.fixture(scope="module")
def stack(tmp_path_factory, wan_checkpoint) -> ApiStack:
    s = start_api_stack(
        tmp_path_factory.mktemp("fuzz"),
        wan_checkpoint,
        api={
            "max_queue": 2,
            "inputs": {"fetch_urls": False},  # no generated URL reaches the network
            "openai": {"max_seconds": 1, "max_width": 64, "max_height": 64},
        },
        in_process=True,
    )
    yield s
    stop_api_stack(s)


def document(stack: ApiStack, path: str) -> dict:
    return stack.client.get(stack.base + path, timeout=30).raise_for_status().json()


def operations(doc: dict) -> set[tuple[str, str]]:
    return {(method.upper(), path) for path, item in doc["paths"].items() for method in item}


def run_document(stack: ApiStack, path: str, covered: frozenset = frozenset()) -> dict[str, Counter]:
    """Statuses seen per operation ("POST /v1/videos": Counter({200: 3, 429: 20, ...})), but those
    ``covered`` elsewhere; every operation is run, then every failure and error of any of them is
    reported at once."""
    schema = schemathesis.openapi.from_dict(document(stack, path))
    seen: dict[str, Counter] = {}
    problems: list[str] = []
    for result in schema.get_all_operations():
        operation = result.ok()
        if (operation.method.upper(), operation.path) in SKIP | covered:
            continue

        @settings(
            max_examples=EXAMPLES.get(operation.method.upper(), 10),
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=operation.as_strategy())
        def exercise(case, statuses: Counter) -> None:
            response = case.call_and_validate(base_url=stack.base, checks=CHECKS, timeout=60)
            statuses[response.status_code] += 1

        name = f"{operation.method.upper()} {operation.path}"
        try:
            exercise(statuses=seen.setdefault(name, Counter()))
        except Exception as exc:  # a failed check, or a request schemathesis cannot make: both count
            problems.append(f"{name}: {type(exc).__name__}: {str(exc)[:1500]}")
    print({op: dict(c) for op, c in seen.items()})
    assert not problems, "\n\n".join(problems)
    return seen


def test_past_max_queue_a_video_is_429_queue_full_with_a_retry_after(stack):
    """Backpressure on the stack's queue of 2: refused at admission, with when to come back."""
    accepted, refused = [], None
    for i in range(8):
        resp = stack.post("/v1/videos", {"prompt": f"backpressure {i}", "size": "64x64", "seconds": 1})
        if resp.status_code == 429:
            refused = resp
            break
        assert resp.status_code == 200, resp.text
        accepted.append(resp.json()["id"])
    assert refused is not None, "the queue never filled"
    error = refused.json()["error"]
    assert (error["code"], error["type"]) == ("queue_full", "rate_limit_error")
    assert int(refused.headers["retry-after"]) >= 2
    for vid in accepted:
        stack.client.delete(stack.base + f"/v1/videos/{vid}")


def test_the_v1_document_holds_against_the_server(stack):
    doc = httpx.get(stack.base + "/v1/openapi.json").json()
    form = doc["components"]["schemas"]["VideoCreateForm"]["properties"]
    # The loaded model's size grid (multiples of 16) and the server's 64x64 limit are written in.
    assert form["size"]["anyOf"][0]["pattern"] == "^(16|32|48|64)x(16|32|48|64)$"
    seen = run_document(stack, "/v1/openapi.json")
    assert {"GET /v1/videos/{video_id}", "DELETE /v1/videos/{video_id}"} <= set(seen)
    assert seen["POST /v1/videos"][200] >= 1  # generated requests do get accepted, not only refused


def test_the_r2v_document_holds_against_the_server(stack):
    # The /v1 run above left jobs in the shared queue: let them start, so some /r2v get accepted.
    wait_for(lambda: stack.get("/health").json()["queues"]["r2v"]["queued"] == 0, 300, "an empty queue")
    seen = run_document(stack, "/r2v/openapi.json")
    assert {"POST /merge", "GET /version/{version_id}", "GET /health"} <= set(seen)
    assert seen["POST /r2v"][202] >= 1


def test_the_whole_document_holds_against_the_server(stack):
    """``/openapi.json``, every route of the shipped service: those of the two dialects' documents
    are run above (with the model's grids written in); here the rest (the operator's queue,
    metrics, media, the workers' calls). Together: every operation but the SKIP list's."""
    whole = document(stack, "/openapi.json")
    dialects = operations(document(stack, "/v1/openapi.json")) | operations(
        document(stack, "/r2v/openapi.json")
    )
    assert operations(whole) >= dialects
    seen = run_document(stack, "/openapi.json", covered=frozenset(dialects))
    assert {"GET /metrics", "GET /queue", "POST /queue/rerender"} <= set(seen)


def test_a_job_event_stream_holds_its_documented_events(stack):
    """Both SSE routes on real jobs (generated ids above only meet 404s): every event of the
    stream, to its ``done``, is checked against the documented event by schemathesis."""
    wait_for(lambda: stack.get("/health").json()["queues"]["r2v"]["queued"] == 0, 300, "an empty queue")
    shot = stack.post("/r2v", {"work_id": "sse", "shot_id": "s1", "prompt": "a kite", "memory_slots": []})
    video = stack.post("/v1/videos", {"prompt": "a kite", "size": "64x64", "seconds": 1})
    assert shot.status_code == 202 and video.status_code == 200, (shot.text, video.text)
    schema = schemathesis.openapi.from_dict(document(stack, "/openapi.json"))
    for path, param, job_id in (
        ("/version/{version_id}/events", "version_id", shot.json()["version_id"]),
        ("/v1/videos/{video_id}/events", "video_id", video.json()["id"]),
    ):
        case = schema[path]["GET"].Case(path_parameters={param: job_id})
        response = case.call_and_validate(base_url=stack.base, checks=CHECKS, timeout=300)
        assert response.status_code == 200 and "event: done" in response.text, response.text[-500:]
