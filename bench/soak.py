#!/usr/bin/env python
"""Fault soak: a mixed load while faults are injected at random, then an audit of what came out.

Starts the whole service (``server.py``: Dagster webserver, daemon, two one-thread CPU device
workers and a media worker on the tiny Wan checkpoint, the API) on a throwaway PostgreSQL cluster
(``tests/pg.py``: Dagster's storage and the service store), with a callback receiver, then:

* load: ``--jobs`` submissions, one every ``--pace`` seconds: r2v shots with a callback (60%),
  ``/v1`` videos through the ``openai`` SDK (25%), ``/v1`` extensions of a finished ``/v1`` video
  (10%) and merges of three finished shots (5%). A submission is retried (same ``job_id`` or
  ``Idempotency-Key``) until it is accepted; one that was never accepted is not counted.
* faults, every ``--fault-every`` seconds on average (each once the service is healthy again after
  the one before), each kind as often in a random order: ``kill -9`` of one child (a worker, the
  daemon, the webserver, the API, at random), ``kill -9`` of the whole service (then started again
  on the same state), ``SIGSTOP`` of a device worker past the heartbeat timeout (then
  ``SIGCONT``), and a PostgreSQL restart (away ``--pg-down`` seconds).
* audit, once every accepted job has finished (faults stopped): ``lost`` (accepted, then unknown or
  never finished), ``ran_twice`` (a step of a job that succeeded more than once in Dagster's event
  log), ``missing_callbacks`` / ``dup_callbacks`` (finished r2v jobs whose receiver got none / more
  than one delivery), ``bad_media`` (a succeeded job whose video does not decode with PyAV),
  ``failed`` (jobs that ended failed: allowed, reported), and ``launches_deduplicated`` (second
  submissions of a step that the run queue canceled unrun: a launch sent again after its answer
  was lost; reported).

    python bench/soak.py [--jobs 200] [--pace 2] [--fault-every 20] [--seed 0] [--keep]

Ends with ``RESULT jobs=... lost=0 ran_twice=0 missing_callbacks=0 bad_media=0 ...``.
"""

from __future__ import annotations

import argparse
import collections
import io
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

import httpx
import psutil
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, result_line  # noqa: E402

sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
import pg  # noqa: E402
from conftest import free_port, spawn_server  # noqa: E402
from test_api_http import Receiver  # noqa: E402

HEARTBEAT_TIMEOUT_S = 5
FINISHED = ("succeeded", "failed", "cancelled", "completed")


class Service:
    """server.py on one state dir, started again after a kill of the whole service."""

    def __init__(self, root: Path, database_url: str):
        from shotloom.families.wan import WanAdapter

        checkpoint = WanAdapter.build_tiny_checkpoint(root / "wan-tiny", seed=0)
        inference = yaml.safe_load((REPO / "configs" / "inference.wan-tiny.yaml").read_text())
        inference["paths"] = {"checkpoint": str(checkpoint), "cache_dir": str(root / "cache")}
        inference.setdefault("defaults", {}).update({"width": 64, "height": 64, "num_frames": 9, "fps": 16})
        (root / "inference.yaml").write_text(yaml.safe_dump(inference))
        self.state = root / "state"
        self.state.mkdir()
        os.environ["SHOTLOOM_POSTGRES_URL"] = database_url
        self.port = free_port()
        self.config = root / "server.yaml"
        self.config.write_text(yaml.safe_dump({
            "state_dir": str(self.state),
            "media_root": str(root / "media"),
            "storage": {"postgres_url_env": "SHOTLOOM_POSTGRES_URL"},
            "webserver": {"host": "127.0.0.1", "port": free_port()},
            "inference": {"config": str(root / "inference.yaml")},
            "workers": {"warm": True, "devices": [{"device": "cpu", "threads": 1}] * 2, "media": 1},
            "monitoring": {"poll_interval_seconds": 1},
            "runtime": {"heartbeat_seconds": 1, "heartbeat_timeout_seconds": HEARTBEAT_TIMEOUT_S},
            "supervision": {"restart_limit": 1000},
            "api": {"host": "127.0.0.1", "port": self.port, "max_queue": 1000,
                    "callback_backoff_seconds": 0.5},
        }))  # fmt: skip
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc = None
        self.start()

    def start(self) -> None:
        self.proc = spawn_server(self.config, self.state)

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        for p in psutil.process_iter(["cmdline"]):  # anything of it left (a worker's own group)
            if str(self.config) in " ".join(p.info["cmdline"] or []) or str(self.state) in " ".join(
                p.info["cmdline"] or []
            ):
                p.kill()

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=60)
        except (ProcessLookupError, Exception):
            self.kill()

    def children(self) -> dict[str, psutil.Process]:
        """Its processes by role (worker names, daemon, webserver, api)."""
        out = {}
        try:
            tree = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return out
        for p in tree:
            try:
                line = " ".join(p.cmdline())
            except psutil.Error:
                continue
            if "orchestration.worker" in line:
                name = line.split("--name ", 1)[1].split()[0] if "--name " in line else f"worker-{p.pid}"
                out[name] = p
            elif "dagster-daemon" in line or "dagster_daemon" in line:
                out["daemon"] = p
            elif "dagster-webserver" in line or "dagster_webserver" in line:
                out["webserver"] = p
            elif " -m api" in line:
                out["api"] = p
        return out

    def wait_healthy(self, timeout: float = 300) -> float:
        """Seconds until ``GET /health`` answers 200."""
        start = time.time()
        while time.time() < start + timeout:
            try:
                if httpx.get(self.base + "/health", timeout=5).status_code == 200:
                    return time.time() - start
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise RuntimeError(f"the service did not become healthy in {timeout:g} s (logs: {self.state}/logs)")


class Load:
    """Submits the mix, each until accepted; remembers what was accepted."""

    def __init__(self, service: Service, receiver: Receiver, rng: random.Random):
        import openai

        self.service, self.receiver, self.rng = service, receiver, rng
        self.http = httpx.Client(timeout=30)
        self.sdk = openai.OpenAI(base_url=service.base + "/v1", api_key="soak", max_retries=0, timeout=30)
        self.accepted: dict[str, str] = {}  # version id or video id -> kind (r2v, v1, extend, merge)
        self.callbacks: set[str] = set()  # versions that asked for a callback
        self.refusals = 0
        self.succeeded: set[str] = set()

    def until_accepted(self, submit) -> str | None:
        for _ in range(600):
            try:
                version = submit()
            except Refused:
                raise
            except Exception as exc:  # the service away (killed, restarting, its database away)
                if getattr(exc, "status_code", 500) < 500 and getattr(exc, "status_code", 500) != 429:
                    raise  # the SDK's 4xx: this script's bug
                version = None
            if version:
                return version
            self.refusals += 1
            time.sleep(1)
        return None

    def finished(self, kind: str) -> list[str]:
        """Accepted jobs of ``kind`` that succeeded (asking only about those not known to have)."""
        for key, k in list(self.accepted.items()):
            if k == kind and key not in self.succeeded and self.status(key) in ("succeeded", "completed"):
                self.succeeded.add(key)
        return [key for key in self.succeeded if self.accepted[key] == kind]

    def status(self, key: str) -> str | None:
        """A job's status as its client reads it (``GET /version``, or ``GET /v1/videos/{id}``)."""
        path = f"/v1/videos/{key}" if key.startswith("video_") else f"/version/{key}"
        try:
            resp = self.http.get(self.service.base + path)
            return resp.json().get("status") if resp.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None

    def error(self, key: str) -> str:
        """Why a job failed, as its client reads it."""
        path = f"/v1/videos/{key}" if key.startswith("video_") else f"/version/{key}"
        body = self.http.get(self.service.base + path).json()
        error = body.get("error")
        return str(error.get("message") if isinstance(error, dict) else error)

    def content(self, key: str) -> bytes:
        if key.startswith("video_"):
            return self.http.get(f"{self.service.base}/v1/videos/{key}/content").content
        return self.http.get(self.http.get(f"{self.service.base}/version/{key}").json()["video_url"]).content

    def submit(self, n: int) -> None:
        roll = self.rng.random()
        if roll < 0.05 and len(shots := self.finished("r2v")) >= 3:
            self._merge(n, self.rng.sample(sorted(shots), 3))
        elif roll < 0.15 and (videos := self.finished("v1")):
            self._extend(n, self.rng.choice(videos))
        elif roll < 0.40:
            self._v1(n)
        else:
            self._r2v(n)

    def _r2v(self, n: int) -> None:
        body = {"work_id": "soak", "shot_id": f"s{n:04d}", "job_id": f"soak-{n}", "prompt": f"shot {n}",
                "memory_slots": [], "seed": n, "callback_url": self.receiver.url}  # fmt: skip

        def post():
            return accepted(self.http.post(self.service.base + "/r2v", json=body))

        if version := self.until_accepted(post):
            self.accepted[version], _ = "r2v", self.callbacks.add(version)

    def _v1(self, n: int) -> None:
        def create():
            video = self.sdk.videos.create(
                prompt=f"video {n}", extra_headers={"Idempotency-Key": f"soak-v1-{n}"}
            )
            return video.id

        if version := self.until_accepted(create):
            self.accepted[version] = "v1"

    def _extend(self, n: int, source: str) -> None:
        from openai import omit

        def extend():
            video = self.sdk.videos.extend(
                prompt=f"more {n}", seconds="1", video=omit, extra_body={"video": {"id": source}},
                extra_headers={"Idempotency-Key": f"soak-ext-{n}"},
            )  # fmt: skip
            return video.id

        if version := self.until_accepted(extend):
            self.accepted[version] = "extend"

    def _merge(self, n: int, shots: list[str]) -> None:
        body = {"work_id": "soak-film", "job_id": f"soak-merge-{n}",
                "shots": [{"version_id": v} for v in shots], "callback_url": self.receiver.url}  # fmt: skip

        def post():
            return accepted(self.http.post(self.service.base + "/merge", json=body))

        if version := self.until_accepted(post):
            self.accepted[version], _ = "merge", self.callbacks.add(version)


class Refused(Exception):
    """The service refused a submission for what it is (4xx): a bug of this script, not a fault."""


def accepted(resp: httpx.Response) -> str | None:
    """The version an r2v/merge submission was accepted as; None: not now (5xx); 4xx raises."""
    if resp.status_code in (200, 202):
        return resp.json()["version_id"]
    if 400 <= resp.status_code < 500 and resp.status_code != 429:
        raise Refused(f"{resp.status_code} {resp.text}")
    return None


class Faults:
    def __init__(self, service: Service, server: pg.PostgresServer, rng: random.Random, pg_down_s: float):
        self.service, self.server, self.rng, self.pg_down_s = service, server, rng, pg_down_s
        self.done: collections.Counter[str] = collections.Counter()
        self.recovery_s: list[float] = []
        self.deck: list[str] = []

    KINDS = ("kill_child", "kill_service", "stop_worker", "restart_postgres")

    def inject(self) -> str:
        """The next fault of a shuffled deck of every kind (each kind as often, in random order)."""
        if not self.deck:
            self.deck = self.rng.sample(self.KINDS, len(self.KINDS))
        kind = self.deck.pop()
        children = self.service.children()
        if kind == "kill_child" and children:
            name = self.rng.choice(sorted(children))
            children[name].kill()
            kind = f"kill_{'worker' if 'cpu' in name or 'media' in name else name}"
        elif kind == "kill_service":
            self.service.kill()
            time.sleep(2)
            self.service.start()
        elif kind == "stop_worker" and (workers := [p for n, p in children.items() if "cpu" in n]):
            victim = self.rng.choice(workers)
            victim.suspend()
            time.sleep(HEARTBEAT_TIMEOUT_S + 3)
            try:
                victim.resume()
            except psutil.NoSuchProcess:
                pass
        elif kind == "restart_postgres":
            self.server.go_away()
            time.sleep(self.pg_down_s)
            self.server.come_back()
        else:
            return "none"
        self.done[kind] += 1
        return kind


def audit(load: Load, receiver: Receiver, database_url: str) -> dict[str, int]:
    import av
    import psycopg
    from sqlalchemy.engine import make_url

    statuses = {v: load.status(v) for v in load.accepted}
    lost = sum(1 for s in statuses.values() if s not in FINISHED)  # unknown (None) or never finished
    failed = sum(1 for s in statuses.values() if s == "failed")
    deliveries = collections.Counter(d["body"]["version_id"] for d in receiver.delivered)
    ids = collections.defaultdict(list)  # version -> the delivery ids it got, in order
    for d in receiver.delivered:
        ids[d["body"]["version_id"]].append(d["delivery_id"])
    missing = sum(1 for v in load.callbacks if statuses[v] in FINISHED and deliveries[v] == 0)
    # Two deliveries of one job: the same delivery again (an attempt whose outcome its process did
    # not live to record: the contract's at-least-once, dropped by the delivery id) or two ids.
    repeated = {v: got for v, got in ids.items() if len(got) > 1}
    dup = sum(1 for got in repeated.values() if len(set(got)) > 1)
    conninfo = make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(conninfo) as conn:
        twice = conn.execute(
            "SELECT t.value, e.step_key, count(*), array_agg(e.run_id), array_agg(e.timestamp::text) "
            "FROM event_logs e JOIN run_tags t ON t.run_id = e.run_id AND t.key = 'shotloom/version_id' "
            "WHERE e.dagster_event_type = 'STEP_SUCCESS' GROUP BY 1, 2 HAVING count(*) > 1"
        ).fetchall()
        # Second submissions of a step the run queue canceled unrun (a launch sent again).
        [(deduplicated,)] = conn.execute(
            "SELECT count(*) FROM run_tags WHERE key = 'shotloom/duplicate_of'"
        ).fetchall()
    for row in twice:
        print("ran twice:", row, flush=True)
    for key in (k for k, s in statuses.items() if s == "failed"):
        print("failed:", key, load.error(key), flush=True)
    for version, got in repeated.items():
        print("delivered again:", version, got, flush=True)
    bad = 0
    for key, status in statuses.items():
        if status not in ("succeeded", "completed"):
            continue
        try:
            with av.open(io.BytesIO(load.content(key))) as container:
                frames = sum(1 for _ in container.decode(video=0))
            bad += frames == 0
        except Exception:
            bad += 1
    return {"lost": lost, "ran_twice": len({row[0] for row in twice}), "missing_callbacks": missing,
            "dup_callbacks": dup, "repeated_deliveries": len(repeated) - dup, "bad_media": bad,
            "failed": failed, "launches_deduplicated": deduplicated}  # fmt: skip


def main() -> None:
    # The SDK warns at every videos call that the hosted API it was written for has shut down.
    warnings.filterwarnings("ignore", message="The Sora API", category=DeprecationWarning)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=200)
    p.add_argument("--pace", type=float, default=2.0, help="seconds between submissions")
    p.add_argument("--fault-every", type=float, default=20.0, help="mean seconds between faults")
    p.add_argument("--pg-down", type=float, default=10.0, help="seconds PostgreSQL stays away")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = p.parse_args()
    if reason := pg.missing_reason():
        sys.exit(f"soak needs PostgreSQL: {reason}")

    rng = random.Random(args.seed)
    root = Path(tempfile.mkdtemp(prefix="shotloom-soak-"))
    server = pg.start()
    service = None
    started = time.time()
    try:
        from orchestration.storage import dagster_postgres_url

        database_url = dagster_postgres_url(server.fresh_database("soak"))
        service = Service(root, database_url)
        service.wait_healthy()
        receiver = Receiver(refuse=0)
        load = Load(service, receiver, rng)
        faults = Faults(service, server, random.Random(args.seed + 1), args.pg_down)
        stop_faults = threading.Event()

        def inject_faults():
            while not stop_faults.wait(rng.expovariate(1 / args.fault_every)):
                kind = faults.inject()
                # The next fault comes once the service has recovered from this one (a fault soak,
                # not a service kept down): its recovery time is part of the figures.
                took = service.wait_healthy(timeout=600)
                print(f"{time.time() - started:7.1f}s fault: {kind}, healthy again after {took:.1f}s, "
                      f"{len(load.accepted)} accepted so far", flush=True)  # fmt: skip
                faults.recovery_s.append(took)

        injector = threading.Thread(target=inject_faults, daemon=True)
        injector.start()
        for n in range(args.jobs):
            load.submit(n)
            time.sleep(args.pace)
        print(f"{time.time() - started:7.1f}s all {len(load.accepted)} accepted; faults stop", flush=True)
        stop_faults.set()
        injector.join()
        service.wait_healthy()
        deadline = time.time() + 1800
        while time.time() < deadline:
            unfinished = [v for v in load.accepted if load.status(v) not in FINISHED]
            if not unfinished:
                break
            time.sleep(2)
        time.sleep(5)  # the last callbacks
        figures = audit(load, receiver, database_url)
        kinds = collections.Counter(load.accepted.values())
        print(result_line({
            "jobs": len(load.accepted),
            **figures,
            "r2v": kinds["r2v"], "v1": kinds["v1"], "extensions": kinds["extend"], "merges": kinds["merge"],
            "faults": sum(faults.done.values()),
            **{f"fault_{k}": v for k, v in sorted(faults.done.items())},
            "refused_submissions": load.refusals,
            "recovery_max_s": round(max(faults.recovery_s, default=0), 1),
            "wall_s": round(time.time() - started),
        }))  # fmt: skip
    finally:
        if service is not None:
            service.stop()
        server.stop()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
