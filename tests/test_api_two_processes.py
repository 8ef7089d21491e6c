"""Two API processes on one state directory (one service store), and a third writer beside them:
each answers every GET /version with the latest write whichever process made it, never a view
it cached before (the change counters of api.store.changes), and their GET /metrics count each job
once between them (api.store.events).

The processes are ``python -m api`` alone, without Dagster: the jobs stay queued (nothing can
submit them), which is what lets the writes below (priorities, a third process's progress) be the
only ones. Store-level checks of the same (every write a view shows, both backends) are in
tests/test_api_store.py.
"""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import yaml
from dagster import DagsterInstance
from prometheus_client.parser import text_string_to_metric_families

from api.store import Store
from settings.api import ApiConfig

from api_stack import wait_for, write_server_yaml
from conftest import REPO, free_port, stop_server
from test_api_http import shot

pytestmark = pytest.mark.slow


def spawn_api(config: Path, log: Path) -> subprocess.Popen:
    """``python -m api --config`` in its own process group, its output in ``log``."""
    out = open(log, "ab")  # noqa: SIM115 - lives as long as the process
    return subprocess.Popen(
        [sys.executable, "-m", "api", "--config", str(config)],
        cwd=REPO,
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def metric_values(client: httpx.Client) -> dict[tuple[str, str], float]:
    """(sample name, its status label or else its kind) -> the sum of its samples."""
    out: dict[tuple[str, str], float] = defaultdict(float)
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            out[(sample.name, sample.labels.get("status") or sample.labels.get("kind", ""))] += sample.value
    return out


def test_two_api_processes_and_a_third_writer_never_see_a_stale_view(tmp_path, wan_checkpoint):
    config, state = write_server_yaml(tmp_path, wan_checkpoint)
    # Read by the API's worker registry (no Dagster runs here). Its storage is made once, before the
    # API processes start, as the service's launcher does: two processes creating one SQLite storage
    # at the same moment race on its tables.
    (state / "dagster_home").mkdir()
    DagsterInstance.from_config(str(state / "dagster_home")).dispose()
    data = yaml.safe_load(config.read_text())
    other = tmp_path / "server-b.yaml"
    other.write_text(yaml.safe_dump({**data, "api": {**data["api"], "port": free_port()}}))
    procs = [spawn_api(c, tmp_path / f"api-{n}.log") for n, c in (("a", config), ("b", other))]
    a, b = (httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) for port in (
        data["api"]["port"], yaml.safe_load(other.read_text())["api"]["port"]
    ))  # fmt: skip

    def up(client: httpx.Client, proc: subprocess.Popen) -> bool:
        assert proc.poll() is None, (tmp_path / "api-a.log").read_text() + (
            tmp_path / "api-b.log"
        ).read_text()
        try:
            return client.get("/version/unknown").status_code == 404
        except httpx.HTTPError:
            return False

    store = None
    try:
        for client, proc in zip((a, b), procs, strict=True):
            wait_for(lambda c=client, p=proc: up(c, p), 120, "an API process")
        first, second = (a.post("/r2v", json=shot(f"two-{n}")).json()["version_id"] for n in (1, 2))

        def position(client: httpx.Client, version_id: str) -> int | None:
            return client.get(f"/version/{version_id}").json()["queue_position"]

        # Both processes answer (and cache) the queue as A made it.
        assert [position(b, v) for v in (first, second)] == [1, 2]
        assert [position(a, v) for v in (first, second)] == [1, 2]

        # A moves the second shot up: B's next answers say so (they were cached under the old order).
        moved = a.post(f"/queue/jobs/{second}/priority", json={"priority": 10}).json()
        assert moved["position"] == 1
        assert [position(b, v) for v in (first, second)] == [2, 1]
        # And back, through B: A's cached answers follow.
        assert b.post(f"/queue/jobs/{second}/priority", json={"priority": 0}).json()["position"] == 2
        assert [position(a, v) for v in (first, second)] == [1, 2]

        # A third process writes (as a schedule or an operator's script would): both show it at once.
        store = Store(ApiConfig.model_validate(data["api"]).resolved_database_url(state))
        progress = {"stage": "validating", "done": 1, "total": 2}
        store.update_status(first, live={"progress": progress})
        assert a.get(f"/version/{first}").json()["progress"] == progress
        assert b.get(f"/version/{first}").json()["progress"] == progress
        store.update_status(first, status="failed", stage="failed", error="stopped by a script")
        for client in (a, b):
            assert client.get(f"/version/{first}").json()["status"] == "failed"
            assert position(client, second) == 1

        # GET /metrics: a job is counted by the process whose write made it so, once fleet-wide, so
        # Prometheus sums the processes. B accepts a third; both cancel the queued ones at once.
        third = b.post("/r2v", json=shot("two-3")).json()["version_id"]
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda c: c.post("/queue/works/film/cancel").raise_for_status(), (a, b)))
        for version_id in (second, third):
            assert a.get(f"/version/{version_id}").json()["stage"] == "canceled"  # the R2V words
        scraped = [metric_values(client) for client in (a, b)]
        assert [m[("shotloom_jobs_accepted_total", "r2v")] for m in scraped] == [2, 1]
        # The script's failure is no API process's; the two cancels are counted once each.
        assert sum(m[("shotloom_jobs_finished_total", "cancelled")] for m in scraped) == 2
        assert sum(m[("shotloom_jobs_finished_total", "failed")] for m in scraped) == 0
        # The queue is state, not a count: each process says what the store says.
        assert [m[("shotloom_jobs", "queued")] for m in scraped] == [0, 0]
    finally:
        if store is not None:
            store.close()
        for client in (a, b):
            client.close()
        for proc in procs:
            stop_server(proc)
