#!/usr/bin/env python
"""HTTP API latency: POST /r2v and POST /v1/videos accept time, and GET /version and
GET /v1/videos/{id} under concurrent pollers.

Starts the whole service with ``server.py`` (Dagster webserver, daemon, two warm one-thread
CPU workers on the tiny Wan checkpoint, the FastAPI app) on a temporary state dir and free
ports, waits for ``GET /health`` to answer 200, then measures over real HTTP:

* accept: ``--requests`` sequential ``POST /r2v`` (distinct shot ids, a small inline
  ``data:`` PNG as condition_img; every 10th also one memory slot with a ``data:`` image),
  client wall time per request: p50, p99 (target p50 <= 500 ms);
* version: ``--pollers`` connections, each looping ``GET /version/{id}`` on one of the accepted
  versions with no pause for ``--seconds`` while the workers process the queue: p50, p99,
  requests/s (target p99 <= 100 ms). Every poller keeps one HTTP/1.1 connection open; one
  asyncio loop drives them all (little client CPU, so the figures are mostly the server's);
* v1 accept: ``--v1-requests`` sequential ``POST /v1/videos`` as the ``openai`` SDK sends them
  (multipart/form-data, ``extra_body`` flattened to bracketed string fields), p50/p99
  (target p50 <= 50 ms);
* v1 poll: the same pollers looping ``GET /v1/videos/{id}`` (target p99 <= 100 ms);
* start: ``server.py`` launch to the first ``GET /health`` 200 (target <= 20 s);
* burst: with intake to the devices paused (workers stay free), ``--burst`` ``POST /r2v`` as fast
  as one client sends them, then the time from the first accept until all are runs in Dagster's
  queue (read from Dagster's run storage; target <= 5 s) and whether Dagster queued them in accept
  order; the burst's jobs are then cancelled (``POST /queue/works/burst/cancel``) and intake resumed;
* merge: ``--merges`` sequential ``POST /merge`` of three finished shots while the workers still
  compute the accepted jobs, each timed to ``succeeded`` (polled every 20 ms; target p50 <= 1.5 s).

Also shown: CPU time the API process spent per request in each phase (from /proc, via psutil).
The service is stopped with SIGTERM to its process group (SIGKILL after 60 s), also on errors.

With ``--baseline REV`` the same measurement runs on git revision REV (its own ``bench/api.py``, in
a temporary worktree, the service started from that tree) and on this tree, each in a process of
its own, ``--rounds`` times each in alternating order (REV, this, this, REV, ...): whichever runs
second on this host measures worse (a run of this tree against itself: GET /version p99 30.5 ms
first, 42.6 ms second), so a fixed order would charge that to one side. The RESULT line carries
this tree's medians over its rounds and REV's as ``baseline_*`` (e.g. ``--baseline 5ccdd20``, the
last tree that runs before the store-invalidated view caches: the commits between import a
protocol committed after them).

    python bench/api.py [--requests 60] [--pollers 50] [--seconds 10] [--burst 100] [--merges 5] [--keep]
                        [--baseline REV [--rounds 2]]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import http.client
import io
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil
import yaml
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, result_line  # noqa: E402

sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
from api_stack import ApiStack, free_port, launch, stop_api_stack, wait_ready  # noqa: E402

TARGETS = {
    "accept_p50_ms": 500.0,
    "version_p99_ms": 50.0,
    "v1_accept_p50_ms": 50.0,
    "v1_poll_p99_ms": 100.0,
    "start_s": 20.0,
    "burst_queued_s": 5.0,
    "merge_p50_s": 1.5,
}
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


# -- the service ---------------------------------------------------------------------------------
def write_config(
    root: Path,
    max_queue: int,
    cpu_nice: int | None = None,
    dequeue_interval: float | None = None,
    media_workers: int | None = None,
) -> tuple[Path, Path]:
    """Server YAML: 2 one-thread CPU workers, the tiny Wan model built into ``root``, free ports."""
    from shotloom.families.wan import WanAdapter

    checkpoint = WanAdapter.build_tiny_checkpoint(root / "wan-tiny", seed=0)
    inference = yaml.safe_load((REPO / "configs" / "inference.wan-tiny.yaml").read_text())
    inference["paths"] = {"checkpoint": str(checkpoint), "cache_dir": str(root / "cache")}
    (root / "inference.yaml").write_text(yaml.safe_dump(inference))
    state = root / "state"
    state.mkdir()
    config = root / "server.yaml"
    config.write_text(yaml.safe_dump({
        "state_dir": str(state),
        "media_root": str(root / "media"),
        "step_storage": str(root / "steps"),
        "webserver": {"host": "127.0.0.1", "port": free_port()},
        "inference": {"config": str(root / "inference.yaml")},
        "workers": {
            "warm": True,
            "devices": [{"device": "cpu", "threads": 1}] * 2,
            **({} if cpu_nice is None else {"cpu_nice": cpu_nice}),
            **({} if media_workers is None else {"media": media_workers}),
        },
        "monitoring": {"poll_interval_seconds": 2},
        "api": {"host": "127.0.0.1", "port": free_port(), "max_queue": max_queue},
        **({} if dequeue_interval is None else {"dequeue_interval_seconds": dequeue_interval}),
    }))  # fmt: skip
    return config, state


def api_process(stack: ApiStack) -> psutil.Process | None:
    """The ``python -m api`` child of server.py (for its CPU time)."""
    try:
        for p in psutil.Process(stack.proc.pid).children(recursive=True):
            cmd = p.cmdline()
            if "-m" in cmd and cmd[cmd.index("-m") + 1 : cmd.index("-m") + 2] == ["api"]:
                return p
    except psutil.Error:
        pass
    return None


def tree_cpu_seconds(stack: ApiStack) -> dict[str, float]:
    """CPU seconds of server.py and everything it started, by role (server, webserver, daemon,
    code-server, api, worker-<name>; the total under "total")."""
    try:
        procs = [psutil.Process(stack.proc.pid)]
        procs += procs[0].children(recursive=True)
    except psutil.Error:
        return {"total": float("nan")}
    out: dict[str, float] = {}
    for p in procs:
        role = process_role(p)
        out[role] = out.get(role, 0.0) + cpu_seconds(p)
    out["total"] = sum(out.values())
    return out


def process_role(p: psutil.Process) -> str:
    try:
        cmd = " ".join(p.cmdline())
    except psutil.Error:
        return "gone"
    for needle, role in (
        ("orchestration.daemon", "daemon"), ("dagster_webserver", "webserver"), ("-m api", "api"),
        ("code_server", "code-server"), ("api_grpc", "code-server"), ("server.py", "server"),
    ):  # fmt: skip
        if needle in cmd:
            return role
    if "orchestration.worker" in cmd:
        return "worker-" + cmd.split("--name ", 1)[-1].split(" ", 1)[0]
    return "other"


def cpu_seconds(proc: psutil.Process | None) -> float:
    if proc is None:
        return float("nan")
    try:
        t = proc.cpu_times()
        return t.user + t.system
    except psutil.Error:
        return float("nan")


def loop_cpu_seconds(proc: psutil.Process | None) -> float:
    """CPU time of the API's main thread, where Uvicorn's event loop answers every request (its
    background threads, the tracker's GraphQL reads among them, are left out): the part of a poll's
    cost the API's own code decides, while the p99 on a host the workers keep busy is mostly the
    scheduler's."""
    if proc is None:
        return float("nan")
    try:
        main = next((t for t in proc.threads() if t.id == proc.pid), None)
        return float("nan") if main is None else main.user_time + main.system_time
    except psutil.Error:
        return float("nan")


def submitted_count(state: Path) -> int:
    """Accepted jobs the API has handed to Dagster so far (read from the service store)."""
    url = f"file:{state / 'api' / 'service.sqlite'}?mode=ro"
    with contextlib.closing(sqlite3.connect(url, uri=True)) as db:
        return db.execute("SELECT count(*) FROM jobs WHERE submitted_at IS NOT NULL").fetchone()[0]


# -- requests ------------------------------------------------------------------------------------
def png_data_url(seed: int, size: int = 64) -> str:
    pixels = np.random.default_rng(seed).integers(0, 255, (size, size, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def r2v_body(i: int) -> dict:
    body = {
        "work_id": "bench",
        "shot_id": f"shot-{i:04d}",
        "job_id": f"bench-shot-{i:04d}",
        "prompt": f"api bench shot {i}: a paper boat drifting down a rain gutter",
        "seed": i,
        "condition_img": png_data_url(i),
        "memory_slots": [],
    }
    if i % 10 == 5:
        body["memory_slots"] = [{"image_url": png_data_url(10_000 + i)}]
    return body


class Conn:
    """One keep-alive HTTP/1.1 connection (reconnects once if the server closed it)."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.conn = http.client.HTTPConnection(host, port, timeout=60)

    def request(
        self, method: str, path: str, body: bytes | None = None, content_type: str = "application/json"
    ) -> tuple[int, bytes]:
        headers = {"Content-Type": content_type} if body is not None else {}
        for attempt in (0, 1):
            try:
                self.conn.request(method, path, body=body, headers=headers)
                resp = self.conn.getresponse()
                return resp.status, resp.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self.conn.close()
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        self.conn.close()


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(np.ceil(q / 100 * len(ordered)))))
    return ordered[rank - 1]


# -- measurements --------------------------------------------------------------------------------
def v1_form(i: int) -> tuple[bytes, str]:
    """A POST /v1/videos body exactly as the openai SDK (3.51) builds one: multipart, every value a
    string, extra_body's nested fields under bracketed keys."""
    import httpx

    fields = [
        ("prompt", f"bench clip {i}: a paper boat drifting on a pond"),
        ("model", "wan-tiny"),
        ("seconds", "1"),
        ("size", "64x64"),
        ("seed", str(i)),
        ("video_params[fps]", "16"),
    ]
    request = httpx.Request("POST", "http://bench/v1/videos", files=[(k, (None, v)) for k, v in fields])
    return request.read(), request.headers["Content-Type"]


def measure_accept(
    host: str, port: int, n: int, api: psutil.Process | None, v1: bool = False
) -> tuple[dict, list[str]]:
    """``n`` sequential accepts: POST /r2v (JSON), or POST /v1/videos (the SDK's multipart)."""
    if v1:
        bodies, kind = zip(*(v1_form(i) for i in range(n)), strict=True)
        path, expected, id_key = "/v1/videos", 200, "id"
    else:
        bodies = [json.dumps(r2v_body(i)).encode() for i in range(n)]  # encoded up front: not timed
        kind, path, expected, id_key = ["application/json"] * n, "/r2v", 202, "version_id"
    conn = Conn(host, port)
    times, versions, positions = [], [], []
    cpu0 = cpu_seconds(api)
    try:
        for body, content_type in zip(bodies, kind, strict=True):
            start = time.perf_counter()
            status, raw = conn.request("POST", path, body, content_type)
            times.append(time.perf_counter() - start)
            if status != expected:
                raise RuntimeError(f"POST {path} answered {status}: {raw[:500]!r}")
            answer = json.loads(raw)
            versions.append(answer[id_key])
            positions.append(answer.get("queue_position") or answer.get("shotloom", {}).get("queue_position"))
    finally:
        conn.close()
    cpu = cpu_seconds(api) - cpu0
    ms = [t * 1000 for t in times]
    return {
        "n": n,
        "p50_ms": percentile(ms, 50),
        "p99_ms": percentile(ms, 99),
        "mean_ms": statistics.mean(ms),
        "max_ms": max(ms),
        "first_ms": ms[0],
        "api_cpu_ms_per_req": cpu * 1000 / n,
        "last_queue_position": positions[-1],
        "body_kib": statistics.mean(len(b) for b in bodies) / 1024,
    }, versions


def measure_burst(stack: ApiStack, state: Path, n: int) -> dict:
    """``n`` accepts as fast as one client sends them; seconds until all are runs in Dagster."""
    from dagster import DagsterInstance, RunsFilter

    from contracts.tags import VERSION_TAG

    assert stack.client.post(stack.base + "/queue/pause").status_code == 200
    bodies = [{**r2v_body(i), "work_id": "burst", "job_id": f"burst-{i:04d}"} for i in range(n)]
    conn = Conn("127.0.0.1", int(stack.base.rsplit(":", 1)[1]))
    accepted: list[str] = []
    with DagsterInstance.from_config(str(state / "dagster_home")) as instance:
        burst = RunsFilter(tags={"shotloom/work_id": "burst"})
        start = time.perf_counter()
        for body in bodies:
            status, raw = conn.request("POST", "/r2v", json.dumps(body).encode())
            if status != 202:
                raise RuntimeError(f"POST /r2v answered {status}: {raw[:300]!r}")
            accepted.append(json.loads(raw)["version_id"])
        accept_s = time.perf_counter() - start
        while instance.get_runs_count(burst) < n:
            if time.perf_counter() - start > 300:
                raise RuntimeError("the burst did not reach Dagster in 300 s")
            time.sleep(0.05)
        queued_s = time.perf_counter() - start
        runs = sorted(instance.get_run_records(burst), key=lambda r: r.storage_id)  # Dagster's FIFO order
        order = [r.dagster_run.tags[VERSION_TAG] for r in runs]
    conn.close()
    stack.client.post(stack.base + "/queue/works/burst/cancel")
    stack.client.post(stack.base + "/queue/resume")
    return {"n": n, "accept_s": accept_s, "queued_s": queued_s, "in_order": order == accepted}


def measure_merges(stack: ApiStack, versions: list[str], merges: int) -> dict:
    """Sequential merges of three finished shots, each from POST /merge to succeeded."""

    def succeeded() -> list[str]:
        done = [v for v in versions if stack.get(f"/version/{v}").json()["status"] == "succeeded"]
        return done[:3] if len(done) >= 3 else []

    deadline = time.monotonic() + 600
    shots = succeeded()
    while not shots:
        if time.monotonic() > deadline:
            raise RuntimeError("fewer than 3 shots succeeded in 600 s")
        time.sleep(1)
        shots = succeeded()
    times, phases = [], []
    gateway = stack.gateway()
    for n in range(merges):
        body = {"work_id": f"bench-film-{n}", "shots": [{"version_id": v} for v in shots]}
        start, wall = time.perf_counter(), time.time()
        resp = stack.post("/merge", body)
        if resp.status_code != 202:
            raise RuntimeError(f"POST /merge answered {resp.status_code}: {resp.text[:300]}")
        version = resp.json()["version_id"]
        while (status := stack.get(f"/version/{version}").json()["status"]) not in ("succeeded", "failed"):
            if time.perf_counter() - start > 120:
                raise RuntimeError(f"merge {version} still {status} after 120 s")
            time.sleep(0.02)
        if status != "succeeded":
            raise RuntimeError(f"merge {version} failed")
        times.append(time.perf_counter() - start)
        run = gateway.run(stack.get(f"/version/{version}").json()["run_id"])
        seen = wall + times[-1]
        phases.append({  # where the time went: into Dagster, in its queue, running, until the API saw it
            "submit": run.creation_time - wall,
            "queue": run.start_time - run.creation_time,
            "run": run.end_time - run.start_time,
            "notice": seen - run.end_time,
        })  # fmt: skip
    medians = {k: statistics.median(p[k] for p in phases) for k in phases[0]}
    return {
        "n": merges, "p50_s": statistics.median(times), "max_s": max(times), "times": times, "phases": medians
    }  # fmt: skip


async def _get(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes
) -> tuple[int, bytes]:
    """One keep-alive HTTP/1.1 GET on an open connection: (status, body)."""
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    length = next(
        int(v) for k, _, v in (x.partition(":") for x in lines[1:]) if k.lower() == "content-length"
    )
    return status, await reader.readexactly(length)


def measure_version(host: str, port: int, versions: list[str], pollers: int, seconds: float,
                    api: psutil.Process | None, stack: ApiStack | None = None,
                    prefix: str = "/version/") -> dict:  # fmt: skip
    """``pollers`` keep-alive connections, each looping GET /version/{id} with no pause, driven by one
    asyncio loop in this thread: a light client (a thread per poller spent its time fighting over
    the GIL, and that wait showed up in the latencies), so the figures are mostly the server's."""
    per_poller: list[list[float]] = [[] for _ in range(pollers)]
    errors: list[str] = []
    statuses: dict[str, int] = {}

    async def poll(k: int, start: asyncio.Event, stop_at: list[float]) -> None:
        path = f"{prefix}{versions[k % len(versions)]}"
        request = f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode()
        reader, writer = await asyncio.open_connection(host, port)
        mine = per_poller[k]
        try:
            await _get(reader, writer, request)  # connected and warm, not timed
            await start.wait()
            while time.perf_counter() < stop_at[0]:
                began = time.perf_counter()
                status, body = await _get(reader, writer, request)
                mine.append(time.perf_counter() - began)
                if status != 200:
                    errors.append(f"{status}: {body[:200]!r}")
                    continue
                state = json.loads(body)["status"]
                statuses[state] = statuses.get(state, 0) + 1
        except (OSError, asyncio.IncompleteReadError, ValueError, KeyError) as exc:
            errors.append(f"{type(exc).__name__}: {exc}")  # counted, the bench goes on
        finally:
            writer.close()

    async def run_all() -> float:
        start, stop_at = asyncio.Event(), [float("inf")]
        tasks = [asyncio.create_task(poll(k, start, stop_at)) for k in range(pollers)]
        await asyncio.sleep(1.0)  # every poller connects and warms up
        began = time.perf_counter()
        stop_at[0] = began + seconds
        start.set()
        await asyncio.gather(*tasks)
        return time.perf_counter() - began

    cpu0, loop0, client0 = cpu_seconds(api), loop_cpu_seconds(api), time.process_time()
    tree0 = tree_cpu_seconds(stack) if stack else {"total": float("nan")}
    psutil.cpu_percent()
    elapsed = asyncio.run(run_all())
    cpu, client_cpu = cpu_seconds(api) - cpu0, time.process_time() - client0
    loop_cpu = loop_cpu_seconds(api) - loop0
    host_busy = psutil.cpu_percent() / 100 * (os.cpu_count() or 1)
    tree1 = tree_cpu_seconds(stack) if stack else {"total": float("nan")}
    roles = {r: (tree1[r] - tree0.get(r, 0.0)) / elapsed for r in tree1 if r != "total"}
    tree = tree1["total"] - tree0["total"]
    ms = [t * 1000 for times in per_poller for t in times]
    if not ms:
        raise RuntimeError(f"no GET /version answered: {errors[:5]}")
    return {
        "requests": len(ms),
        "p50_ms": percentile(ms, 50),
        "p90_ms": percentile(ms, 90),
        "p99_ms": percentile(ms, 99),
        "max_ms": max(ms),
        "rps": len(ms) / elapsed,
        "errors": len(errors),
        "first_errors": errors[:3],
        "statuses": statuses,
        "api_cpu_ms_per_req": cpu * 1000 / len(ms),
        "loop_cpu_us_per_req": loop_cpu * 1e6 / len(ms),
        "api_cpu_util": cpu / elapsed,
        "client_cpu_util": client_cpu / elapsed,
        "service_cpu_util": tree / elapsed,
        "roles_cpu_util": dict(sorted(roles.items(), key=lambda kv: -kv[1])),
        "host_cpu_util": host_busy,
    }


# -- main ----------------------------------------------------------------------------------------
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=60, help="sequential POST /r2v requests")
    p.add_argument("--pollers", type=int, default=50, help="concurrent GET /version pollers")
    p.add_argument("--seconds", type=float, default=10.0, help="how long the pollers run")
    p.add_argument("--v1-requests", type=int, default=60, help="sequential POST /v1/videos requests")
    p.add_argument("--burst", type=int, default=100, help="POST /r2v sent as fast as possible")
    p.add_argument("--merges", type=int, default=5, help="sequential POST /merge of three finished shots")
    p.add_argument("--cpu-nice", type=int, help="workers.cpu_nice (default: the server's)")
    p.add_argument("--dequeue-interval", type=float, help="dequeue_interval_seconds (default: the server's)")
    p.add_argument("--media-workers", type=int, help="workers.media (default: the server's)")
    p.add_argument("--keep", action="store_true", help="keep the temporary state dir")
    p.add_argument("--baseline", metavar="REV", help="also measure git revision REV, side by side")
    p.add_argument(
        "--rounds", type=int, default=2, help="with --baseline: runs of each tree, order alternating"
    )
    args = p.parse_args()
    if args.baseline:
        compare(args.baseline, args.rounds)
        return
    for key, value in ONE_THREAD.items():
        os.environ.setdefault(key, value)  # inherited by server.py's workers

    root = Path(tempfile.mkdtemp(prefix="shotloom-bench-api-"))
    print(f"state under {root}", flush=True)
    stack = None
    try:
        max_queue = max(1000, 2 * (args.requests + args.v1_requests))
        config, state = write_config(
            root,
            max_queue=max_queue,
            cpu_nice=args.cpu_nice,
            dequeue_interval=args.dequeue_interval,
            media_workers=args.media_workers,
        )
        print("starting server.py (webserver, daemon, 2 CPU workers, API) ...", flush=True)
        started = time.monotonic()
        stack = launch(config, state)
        wait_ready(stack, timeout=300, interval=0.1)
        start_s = time.monotonic() - started
        print(f"  /health 200 after {start_s:.1f} s", flush=True)
        host, port = "127.0.0.1", int(stack.base.rsplit(":", 1)[1])
        api = api_process(stack)
        print(f"  API pid {api.pid if api else '?'}", flush=True)

        print(
            f"burst: POST /r2v x {args.burst} with intake paused, until all are Dagster runs ...", flush=True
        )
        burst = measure_burst(stack, state, args.burst)
        print(f"POST /r2v x {args.requests} (sequential) ...", flush=True)
        accept, versions = measure_accept(host, port, args.requests, api)
        print(f"GET /version: {args.pollers} pollers for {args.seconds:g} s ...", flush=True)
        version = measure_version(host, port, versions, args.pollers, args.seconds, api, stack)
        print(
            f"POST /v1/videos x {args.v1_requests} (sequential, multipart as the SDK sends) ...", flush=True
        )
        v1_accept, videos = measure_accept(host, port, args.v1_requests, api, v1=True)
        print(f"GET /v1/videos/{{id}}: {args.pollers} pollers for {args.seconds:g} s ...", flush=True)
        v1_poll = measure_version(host, port, videos, args.pollers, args.seconds, api, stack, "/v1/videos/")
        print(f"merge of 3 finished shots x {args.merges} (workers computing) ...", flush=True)
        merge = measure_merges(stack, versions, args.merges)
        health = stack.get("/health").json()
        health["submitted"] = submitted_count(state)
    except BaseException:
        if stack is not None:
            print(f"--- server.out ---\n{stack.log()}\n--- api.log ---\n{stack.log('api')}", file=sys.stderr)
        raise
    finally:
        if stack is not None:
            stopping = time.monotonic()
            stop_api_stack(stack)
            print(f"service stopped in {time.monotonic() - stopping:.1f} s (rc {stack.proc.returncode})")
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)

    report(args, accept, version, v1_accept, v1_poll, health, start_s, burst, merge)


COMPARED = (
    "accept_p50_ms",
    "version_p99_ms",
    "v1_accept_p50_ms",
    "v1_poll_p99_ms",
    "version_rps",
    "version_loop_us",  # None for a baseline whose bench did not measure it yet
    "v1_poll_loop_us",
)


def compare(rev: str, rounds: int) -> None:
    """This tree and ``rev``, ``rounds`` runs each in alternating order, each run a process of its
    own (same arguments, less the comparison's); one RESULT line of medians."""
    argv, skip = [], False
    for arg in sys.argv[1:]:
        if skip or arg.startswith(("--baseline", "--rounds")):
            skip = not skip and "=" not in arg  # the flag's value follows it
            continue
        argv.append(arg)
    tree = Path(tempfile.mkdtemp(prefix="shotloom-bench-baseline-"))
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), rev], check=True)
    runs: dict[Path, list[dict[str, str]]] = {tree: [], REPO: []}
    try:
        for i in range(rounds):
            for root in (tree, REPO) if i % 2 == 0 else (REPO, tree):
                print(f"--- round {i + 1}: {rev if root == tree else 'this tree'} ({root}) ---", flush=True)
                proc = subprocess.run(
                    [sys.executable, str(root / "bench" / "api.py"), *argv],
                    cwd=root, env={**os.environ, "PYTHONPATH": str(root)}, stdout=subprocess.PIPE,
                    text=True, check=True,
                )  # fmt: skip
                print(proc.stdout, flush=True)
                [line] = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1:]
                runs[root].append(dict(field.split("=", 1) for field in line.split()[1:]))
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], check=False)
    for key in COMPARED:
        print(
            f"{key}: {rev} {[r.get(key) for r in runs[tree]]}, this tree {[r.get(key) for r in runs[REPO]]}"
        )
    medians = {key: _median(r.get(key) for r in runs[REPO]) for key in runs[REPO][0]}
    before = {f"baseline_{key}": _median(r.get(key) for r in runs[tree]) for key in COMPARED}
    print(result_line({**medians, "rounds": rounds, **before}))


def _median(values) -> object:
    """The median of numbers given as text; a non-number as the last run gave it."""
    given = [v for v in values if v is not None]
    try:
        if all(v.lstrip("-").isdigit() for v in given):
            return round(statistics.median(int(v) for v in given))
        return round(statistics.median(float(v) for v in given), 2)
    except ValueError:
        return given[-1] if given else None


def report(
    args: argparse.Namespace,
    accept: dict,
    version: dict,
    v1_accept: dict,
    v1_poll: dict,
    health: dict,
    start_s: float,
    burst: dict,
    merge: dict,
) -> None:
    queue = health["queues"]["r2v"]
    print()
    print(f"{'measure':<24}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}{'req/s':>9}{'API CPU ms/req':>16}")
    print(
        f"{'POST /r2v (accept)':<24}{accept['p50_ms']:>9.1f}{accept['p99_ms']:>9.1f}{accept['max_ms']:>9.1f}"
        f"{1000 / accept['mean_ms']:>9.1f}{accept['api_cpu_ms_per_req']:>16.2f}"
    )
    print(
        f"{f'GET /version x{args.pollers}':<24}{version['p50_ms']:>9.1f}{version['p99_ms']:>9.1f}"
        f"{version['max_ms']:>9.1f}{version['rps']:>9.1f}{version['api_cpu_ms_per_req']:>16.2f}"
    )
    print(
        f"{'POST /v1/videos':<24}{v1_accept['p50_ms']:>9.1f}{v1_accept['p99_ms']:>9.1f}"
        f"{v1_accept['max_ms']:>9.1f}{1000 / v1_accept['mean_ms']:>9.1f}"
        f"{v1_accept['api_cpu_ms_per_req']:>16.2f}"
    )
    print(
        f"{f'GET /v1/videos/id x{args.pollers}':<24}{v1_poll['p50_ms']:>9.1f}{v1_poll['p99_ms']:>9.1f}"
        f"{v1_poll['max_ms']:>9.1f}{v1_poll['rps']:>9.1f}{v1_poll['api_cpu_ms_per_req']:>16.2f}"
    )
    print(
        f"accept: first request {accept['first_ms']:.1f} ms, mean {accept['mean_ms']:.1f} ms, "
        f"body {accept['body_kib']:.1f} KiB, last queue_position {accept['last_queue_position']}"
    )
    print(
        f"version: {version['requests']} requests, p90 {version['p90_ms']:.1f} ms, errors {version['errors']}"
        f" {version['first_errors'] or ''}, statuses seen {version['statuses']}"
    )
    print(
        f"CPU while polling (cores): API process {version['api_cpu_util']:.2f}, whole service "
        f"{version['service_cpu_util']:.2f}, bench client {version['client_cpu_util']:.2f}, "
        f"host {version['host_cpu_util']:.2f} of {os.cpu_count()}"
    )
    print("  by process: " + ", ".join(f"{r} {c:.2f}" for r, c in version["roles_cpu_util"].items()))
    print(
        f"API event-loop thread CPU per poll: GET /version {version['loop_cpu_us_per_req']:.0f} us, "
        f"GET /v1/videos/{{id}} {v1_poll['loop_cpu_us_per_req']:.0f} us"
    )
    print(f"r2v queue at the end (API's view): {queue}; submitted to Dagster: {health['submitted']}")
    print(f"start: GET /health 200 {start_s:.1f} s after server.py was launched")
    print(
        f"burst: {burst['n']} accepted in {burst['accept_s']:.2f} s, all runs in Dagster after "
        f"{burst['queued_s']:.2f} s, queued in accept order: {burst['in_order']}"
    )
    print(
        f"merge of 3 shots: p50 {merge['p50_s']:.2f} s, max {merge['max_s']:.2f} s "
        f"({', '.join(f'{t:.2f}' for t in merge['times'])}); medians: "
        + ", ".join(f"{k} {v:.2f} s" for k, v in merge["phases"].items())
    )
    verdict = {
        "accept_p50_ms": accept["p50_ms"] <= TARGETS["accept_p50_ms"],
        "version_p99_ms": version["p99_ms"] <= TARGETS["version_p99_ms"],
        "v1_accept_p50_ms": v1_accept["p50_ms"] <= TARGETS["v1_accept_p50_ms"],
        "v1_poll_p99_ms": v1_poll["p99_ms"] <= TARGETS["v1_poll_p99_ms"],
        "start_s": start_s <= TARGETS["start_s"],
        "burst_queued_s": burst["queued_s"] <= TARGETS["burst_queued_s"] and burst["in_order"],
        "merge_p50_s": merge["p50_s"] <= TARGETS["merge_p50_s"],
    }
    for key, ok in verdict.items():
        print(f"target {key} <= {TARGETS[key]:g}: {'met' if ok else 'MISSED'}")
    print(result_line({
        "accept_p50_ms": round(accept["p50_ms"], 1),
        "accept_p99_ms": round(accept["p99_ms"], 1),
        "version_p50_ms": round(version["p50_ms"], 1),
        "version_p99_ms": round(version["p99_ms"], 1),
        "version_rps": round(version["rps"], 1),
        "v1_accept_p50_ms": round(v1_accept["p50_ms"], 1),
        "v1_accept_p99_ms": round(v1_accept["p99_ms"], 1),
        "v1_poll_p50_ms": round(v1_poll["p50_ms"], 1),
        "v1_poll_p99_ms": round(v1_poll["p99_ms"], 1),
        "version_loop_us": round(version["loop_cpu_us_per_req"]),
        "v1_poll_loop_us": round(v1_poll["loop_cpu_us_per_req"]),
        "pollers": args.pollers,
        "n_accept": accept["n"],
        "start_s": round(start_s, 1),
        "burst_n": burst["n"],
        "burst_queued_s": round(burst["queued_s"], 2),
        "burst_in_order": burst["in_order"],
        "merge_p50_s": round(merge["p50_s"], 2),
        **{f"merge_{k}_p50_s": round(v, 2) for k, v in merge["phases"].items()},
    }))  # fmt: skip


if __name__ == "__main__":
    main()
