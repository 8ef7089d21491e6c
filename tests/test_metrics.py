"""``GET /metrics`` (Prometheus text): what it says agrees with the store and ``/health`` after real
jobs ran (an R2V shot with a callback, a ``/v1`` video through the openai SDK, a merge), it is
behind the key when keys are set, ``promtool check metrics`` finds nothing in it, and a real
Prometheus (Debian's ``prometheus``) scrapes it and answers queries on a job count and a stage
histogram, with data for every query of the Grafana dashboard in docs/. Two API processes on one
store counting each job once: tests/test_api_two_processes.py.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
from collections import defaultdict

import httpx
import openai
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from api_stack import start_api_stack, stop_api_stack, wait_for
from conftest import REPO, free_port, stop_server
from test_api_http import Receiver, shot

KEY = "sk-metrics-0123456789"


@pytest.fixture(scope="module")
def stack(tmp_path_factory, wan_checkpoint):
    root = tmp_path_factory.mktemp("metrics")
    keys = root / "keys.yaml"
    keys.write_text(yaml.safe_dump({"ops": KEY}))
    s = start_api_stack(
        root,
        wan_checkpoint,
        api={"callback_backoff_seconds": 0.2, "auth": {"key_file": str(keys)}},
        authorization=KEY,
        in_process=True,
    )
    try:
        yield s
    finally:
        stop_api_stack(s)


@pytest.fixture(scope="module")
def ran(stack):
    """The jobs the module's tests read the metrics of, run to their end."""
    receiver = Receiver(refuse=1)  # one failed attempt, then delivered
    try:
        shot_id = stack.post("/r2v", {**shot("m1"), "callback_url": receiver.url}).json()["version_id"]
        with openai.OpenAI(base_url=stack.base + "/v1", api_key=KEY, max_retries=0, timeout=60) as client:
            model = client.models.list().data[0].id
            video = client.videos.create_and_poll(
                model=model, prompt="a kite", size="64x64", seconds="1", poll_interval_ms=300
            )
        assert video.status == "completed", video.error
        assert stack.wait_version(shot_id)["status"] == "succeeded"
        merge = stack.post("/merge", {"work_id": "film", "shots": [{"version_id": shot_id}]}).json()
        assert stack.wait_version(merge["version_id"])["status"] == "succeeded"
        wait_for(lambda: receiver.delivered, 30, "the callback")
        yield {"shot": shot_id, "video": video.id, "merge": merge["version_id"]}
    finally:
        receiver.close()


def scrape(stack) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Sample name -> [(labels, value)]."""
    resp = stack.get("/metrics")  # the stack's client sends the key
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/plain")
    out: dict[str, list] = defaultdict(list)
    for family in text_string_to_metric_families(resp.text):
        for sample in family.samples:
            out[sample.name].append((sample.labels, sample.value))
    return out


def value(samples, name: str, **labels) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    return sum(v for have, v in samples.get(name, []) if labels.items() <= have.items())


def store_counts(stack) -> dict[tuple[str, str, str], int]:
    db = sqlite3.connect(stack.state / "api" / "service.sqlite")
    try:
        rows = db.execute("SELECT kind, dialect, status, count(*) FROM jobs GROUP BY kind, dialect, status")
        return {(k, d, s): n for k, d, s, n in rows}
    finally:
        db.close()


def test_metrics_agree_with_the_store_and_health(stack, ran):
    assert httpx.get(stack.base + "/metrics").status_code == 401  # behind the key
    samples = scrape(stack)
    counts = store_counts(stack)
    for kind in ("r2v", "merge"):
        for dialect in ("r2v", "openai"):
            accepted = sum(n for (k, d, _), n in counts.items() if (k, d) == (kind, dialect))
            assert value(samples, "shotloom_jobs_accepted_total", kind=kind, dialect=dialect) == accepted
            for status in ("succeeded", "failed", "cancelled"):
                assert value(
                    samples, "shotloom_jobs_finished_total", kind=kind, dialect=dialect, status=status
                ) == counts.get((kind, dialect, status), 0)
    assert value(samples, "shotloom_jobs_finished_total", status="succeeded") == 3

    health = stack.get("/health").json()
    for kind, pool in (("r2v", "device"), ("merge", "media")):
        for status in ("queued", "running"):
            assert (
                value(samples, "shotloom_jobs", kind=kind, pool=pool, status=status)
                == health["queues"][kind][status]
            )
    for worker in health["inference"]["workers"] + health["media_workers"]:
        assert value(samples, "shotloom_worker_up", worker=worker["name"]) == (1 if worker["ready"] else 0)
    [device] = health["inference"]["workers"]
    assert (
        value(samples, "shotloom_worker_weights", worker=device["name"], location=device["weight_location"])
        == 1
    )
    assert value(samples, "shotloom_worker_memory_bytes", worker=device["name"], memory="rss") > 0

    # Stage histograms: every shot conditioned, denoised, decoded and wrote; the merge merged.
    for stage in ("conditioning", "inferring", "decoding", "writing"):
        assert value(samples, "shotloom_stage_duration_seconds_count", kind="r2v", stage=stage) == 2, stage
    assert value(samples, "shotloom_stage_duration_seconds_count", kind="merge", stage="merging") == 1
    assert value(samples, "shotloom_job_duration_seconds_count", status="succeeded") == 3
    assert value(samples, "shotloom_denoise_step_seconds_count") == 2
    assert value(samples, "shotloom_denoise_step_seconds_sum") > 0

    # The callback: refused once, then delivered; nothing left in the outbox.
    assert value(samples, "shotloom_callback_deliveries_total", outcome="retrying") == 1
    assert value(samples, "shotloom_callback_deliveries_total", outcome="delivered") == 1
    assert value(samples, "shotloom_callback_backlog") == 0

    # Requests by route template, the pollers' fast path included; never by raw path.
    routes = {labels["route"] for labels, _ in samples["shotloom_http_request_duration_seconds_count"]}
    assert {"/r2v", "/version/{version_id}", "/v1/videos", "/merge", "/health"} <= routes
    assert not any(ran["shot"] in route for route in routes)
    assert value(samples, "shotloom_http_request_duration_seconds_count", route="/metrics", status="401") == 1


@pytest.mark.skipif(
    shutil.which("promtool") is None and not os.environ.get("CI"),
    reason="Debian's prometheus package (.ci/run installs it)",
)
def test_a_real_prometheus_scrapes_it(stack, ran, tmp_path):
    text = stack.get("/metrics").text
    lint = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
    assert lint.returncode == 0 and not lint.stdout.strip(), lint.stdout + lint.stderr

    port, target = free_port(), stack.base.removeprefix("http://")
    config = tmp_path / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s"},
                "scrape_configs": [
                    {
                        "job_name": "shotloom",
                        "authorization": {"credentials": KEY},
                        "static_configs": [{"targets": [target]}],
                    }
                ],
            }
        )
    )
    check = subprocess.run(["promtool", "check", "config", str(config)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    prom = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10)

    def query(expr: str) -> float | None:
        try:
            body = prom.get("/api/v1/query", params={"query": expr}).json()
        except (httpx.HTTPError, ValueError):
            return None
        result = body.get("data", {}).get("result", [])
        return float(result[0]["value"][1]) if result else None

    try:
        wait_for(
            lambda: query('up{job="shotloom"}') == 1, 60, "Prometheus scraping the service", interval=0.5
        )
        assert query('sum(shotloom_jobs_finished_total{status="succeeded"})') == 3
        assert query('sum(shotloom_stage_duration_seconds_count{stage="inferring"})') == 2
        # A quantile from the histogram's buckets, as a dashboard draws it.
        p50 = query(
            'histogram_quantile(0.5, sum by (le) (shotloom_stage_duration_seconds_bucket{stage="inferring"}))'
        )
        assert p50 is not None and p50 > 0
        health = stack.get("/health").json()
        ready = [w for w in health["inference"]["workers"] + health["media_workers"] if w["ready"]]
        assert query("sum(shotloom_worker_up)") == len(ready) > 0
        # Every query of the Grafana dashboard in docs/ is one Prometheus accepts and has data for
        # (a rate needs two scrapes).
        wait_for(lambda: (query('count_over_time(up{job="shotloom"}[1m])') or 0) >= 2, 30, "a second scrape")
        dashboard = json.loads((REPO / "docs" / "grafana-dashboard.json").read_text())
        for panel in dashboard["panels"]:
            for target in panel["targets"]:
                expr = target["expr"].replace("$__rate_interval", "1m")
                body = prom.get("/api/v1/query", params={"query": expr}).json()
                assert body["status"] == "success", (panel["title"], body)
                if "histogram_quantile" not in expr and "device_" not in expr:  # no CUDA memory here
                    assert body["data"]["result"], (panel["title"], expr)
    finally:
        prom.close()
        stop_server(proc)
        log.close()


def test_fastapis_own_opentelemetry_is_on_only_where_the_api_asks_for_it():
    """``api.opentelemetry``: FastAPI's request spans go to a configured tracer provider when it is
    true; false (the default) sends none, however a provider is configured."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient
    from opentelemetry import trace

    from api.app import fastapi_telemetry
    from settings.api import ApiConfig

    spans: list[str] = []

    class RecordingTracer(trace.NoOpTracer):
        def start_span(self, name, *args, **kwargs):
            spans.append(name)
            return super().start_span(name, *args, **kwargs)

    class Provider(trace.TracerProvider):
        def get_tracer(self, *args, **kwargs):
            return RecordingTracer()

    seen = {}
    for on in (False, True):
        spans.clear()
        telemetry = {**(fastapi_telemetry(ApiConfig(opentelemetry=on)) or {}), "tracer_provider": Provider()}
        app = FastAPI(telemetry=telemetry)
        app.get("/version/{version_id}")(lambda version_id: {"version_id": version_id})
        with TestClient(app) as client:
            assert client.get("/version/v1").json() == {"version_id": "v1"}
        seen[on] = list(spans)
    assert ApiConfig().opentelemetry is False
    assert seen[False] == []
    assert "GET" in seen[True], seen  # the request's span (and its endpoint's, dependencies'...)
