#!/usr/bin/env python
"""Device-worker scheduler: throughput on 1 vs 2 CPU workers, submit-to-first-op latency, overhead.

Starts the real stack with ``server.py`` (webserver, daemon, warm device workers with
one torch thread each) in a temporary state dir, once with one CPU worker and once
with two, and submits tiny-Wan r2v runs over GraphQL. First one subprocess with one
thread calibrates the job sizes (``--job-seconds``, ``--long-seconds``); another keeps
the weights loaded and times the same jobs with ``ModelRuntime.generate``: what
``inference.py`` does, in one process, without Dagster. Each overhead sample is one job
there and the same job on the stack, back to back (alternating which goes first), so
the noise of this shared machine hits both sides alike. Every job has its own prompt
and seed, and every side its own cold conditioning cache.

Figures (targets from the issue):

* throughput_1w / throughput_2w: jobs per minute when ``--jobs`` runs are submitted
  at once (jobs / (last run end - first submit)); ratio = 2w / 1w (>= 1.7);
  ratio_ceiling: two in-process jobs at once against one, the most this machine allows.
* submit_to_first_op_p50_s: submit call -> first STEP_START, runs submitted one at a
  time to idle workers (<= 0.5 s).
* orchestration_p50_s: per run, submit -> run end minus the time its ops spent in the model
  stages (conditioning, inferring, decoding, writing): what the control plane costs (<= 0.5 s).
* overhead_per_run_s: median over those runs of (submit -> run end) minus the same
  job in-process (<= 1.5 s), and per run the time outside the ops' model stages;
  overhead_long_pct: the same for ``--long-samples``
  ~``--long-seconds`` jobs, median in % of their in-process time (<= 10%).
* foreign_cores: CPU that processes outside this bench used during each phase, in cores
  (system-wide busy time minus this bench's process tree). The figures above compare
  wall-clock times, so on a shared machine they are only meaningful when this is ~0.

* with ``--hosts 2``: instead, throughput with one and with two worker hosts (one one-thread CPU
  worker each) behind one control host, all sharing a throwaway PostgreSQL cluster (started here,
  as tests/test_hosts.py does) and the media directory; ratio = 2 hosts / 1 host.

    python bench/scheduler.py [--jobs 8] [--job-seconds 10] [--long-seconds 20] [--long-samples 5]
                              [--samples 7] [--quick] [--keep] [--hosts 2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, result_line, run_measured  # noqa: E402

sys.path.insert(0, str(REPO))

LOCATION = {"repository_location_name": "orchestration.definitions", "repository_name": "__repository__"}
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
SIDES = (32, 256)  # square sizes tried by the calibration (multiples of 16 for Wan)
MAX_FRAMES = 81


def job_request(name: str, size: list[int]) -> dict:
    """The shot fields of one job: distinct prompt and seed per name (no conditioning-cache hits)."""
    w, h, n = size
    prompt = f"scheduler bench {name}: a paper boat drifting down a rain gutter"
    return {
        "prompt": prompt,
        "seed": zlib.crc32(name.encode()) % 100_000,
        "width": w,
        "height": h,
        "num_frames": n,
    }


# -- other load on the machine ------------------------------------------------------
def _busy_seconds() -> float:
    import psutil

    t = psutil.cpu_times()  # Linux: guest time is already inside user/nice; iowait is idle
    not_busy = ("idle", "iowait", "guest", "guest_nice")
    return sum(t) - sum(getattr(t, name, 0.0) for name in not_busy)


def _own_seconds() -> dict[int, float]:
    """CPU seconds of this process (with the children it waited for) and of every live descendant."""
    import psutil

    me = psutil.Process()
    out = {}
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
            out[p.pid] = t.user + t.system + (t.children_user + t.children_system if p is me else 0.0)
        except psutil.Error:
            pass
    return out


class ForeignLoad:
    """Cores used by processes outside this bench between start() and stop() (a shared machine
    skews every wall-clock figure; descendants that exit before stop() count as foreign)."""

    def __init__(self) -> None:
        self.start()

    def start(self) -> None:
        self.t0, self.busy0, self.own0 = time.monotonic(), _busy_seconds(), _own_seconds()

    def stop(self) -> float:
        own1, busy1 = _own_seconds(), _busy_seconds()
        own = sum(v - self.own0.get(pid, 0.0) for pid, v in own1.items())
        return max(0.0, busy1 - self.busy0 - own) / max(time.monotonic() - self.t0, 1e-9)


# -- in-process baseline (a subprocess with one thread) ------------------------------
def choose_size(c0: float, c1: float, target: float) -> list[int]:
    """The square size and 4k+1 frame count whose predicted time c0 + c1*w*h*n is closest to target."""
    best, best_err = [64, 64, 17], float("inf")
    for side in range(SIDES[0], SIDES[1] + 1, 16):
        for n in range(9, MAX_FRAMES + 1, 4):
            err = abs(c0 + c1 * side * side * n - target)
            if err < best_err - 1e-9:
                best, best_err = [side, side, n], err
    return best


def child(spec_path: str) -> None:
    """One subprocess with one thread and the weights loaded before anything is timed (as on a
    warm worker). ``calibrate``: fit the job sizes, print one JSON line. ``baseline``: run the
    untimed ``warm`` jobs, then one job per ``{"name", "size"}`` line read from stdin, answering
    each with a JSON line of its wall time (until stdin closes)."""
    import torch

    torch.set_num_threads(1)
    from shotloom.runtime import get_runtime

    spec = json.loads(Path(spec_path).read_text())
    runtime = get_runtime(spec["config"])
    runtime.adapter  # noqa: B018 - loads the weights
    out = Path(spec["out_dir"])
    out.mkdir(parents=True, exist_ok=True)

    def timed(name: str, size: list[int], clock=time.perf_counter) -> float:
        req = runtime.resolve(**job_request(name, size))
        start = clock()
        runtime.generate(req, out / f"{name}.mp4")
        return clock() - start

    if spec["mode"] == "baseline":
        for name, size in spec["warm"]:
            timed(name, size)
        print(json.dumps({"ready": True}), flush=True)
        for line in sys.stdin:
            job = json.loads(line)
            print(json.dumps({"name": job["name"], "seconds": timed(job["name"], job["size"])}), flush=True)
        return

    def sized(name: str, size: list[int]) -> float:
        # Sizing by CPU time (one thread: the same as wall time on an idle machine), so other
        # load while calibrating does not shrink the jobs; the baseline itself is wall time.
        return timed(name, size, time.process_time)

    timed("warmup", [32, 32, 5])
    (a, ta), (b, tb) = [(p, sized(f"probe-{i}", p)) for i, p in enumerate(spec["probes"])]
    va, vb = a[0] * a[1] * a[2], b[0] * b[1] * b[2]
    c1 = max((tb - ta) / (vb - va), 1e-9)
    c0 = max(ta - c1 * va, 0.0)
    sizes, calib = {}, []
    for kind, target in spec["targets"].items():
        size = choose_size(c0, c1, target)
        for attempt in range(3):  # check the prediction; refit the slope on the measured point
            seconds = sized(f"calib-{kind}-{attempt}", size)
            calib.append({"kind": kind, "size": size, "seconds": round(seconds, 2)})
            if abs(seconds - target) <= 0.15 * target:
                break
            c1 = max((seconds - c0) / (size[0] * size[1] * size[2]), 1e-9)
            new = choose_size(c0, c1, target)
            if new == size:
                break
            size = new
        sizes[kind] = size
    print(json.dumps({"sizes": sizes, "calibration": calib}))


def run_child(root: Path, spec: dict) -> dict:
    spec_path = root / f"{spec['mode']}.json"
    spec_path.write_text(json.dumps(spec))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", str(spec_path)]
    _, _, stdout = run_measured(cmd, env=ONE_THREAD)
    return json.loads(stdout.strip().splitlines()[-1])


def calibrate(root: Path, inference: Path, args: argparse.Namespace) -> dict:
    probes = [[32, 32, 9], [64, 64, 17]] if args.job_seconds < 4 else [[64, 64, 17], [112, 112, 17]]
    targets = {"short": args.job_seconds, "long": args.long_seconds}
    spec = {"mode": "calibrate", "config": str(inference), "probes": probes, "targets": targets}
    return run_child(root, {**spec, "out_dir": str(root / "calibration-out")})


class Baseline:
    """The jobs in one long-lived process, as ``inference.py`` runs them one after another. Its
    jobs interleave with the stack's (each sample is one job here and the same job there, back
    to back), so a slow spell of this shared machine hits both sides of a comparison alike. Like
    the workers, it has run short jobs before (``warm``) and meets the long size for the first
    time in a timed job: first calls at a new shape cost extra on both sides."""

    def __init__(self, root: Path, inference: Path, warm: list):
        spec = {
            "mode": "baseline",
            "config": str(inference),
            "warm": warm,
            "out_dir": str(root / "baseline-out"),
        }
        spec_path = root / "baseline.json"
        spec_path.write_text(json.dumps(spec))
        self.stderr = open(root / "baseline.err", "w+")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--child", str(spec_path)],
            cwd=REPO,
            env={**os.environ, **ONE_THREAD},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
        )
        self._answer()  # weights loaded, warm jobs done

    def _answer(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.stderr.seek(0)
            raise RuntimeError(f"baseline process died:\n{self.stderr.read()[-3000:]}")
        return json.loads(line)

    def time(self, name: str, size: list[int]) -> float:
        self.proc.stdin.write(json.dumps({"name": name, "size": size}) + "\n")
        self.proc.stdin.flush()
        return self._answer()["seconds"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(60)
        self.stderr.close()


def measure_ceiling(root: Path, inference: Path, baseline: Baseline, size: list[int], jobs: int = 2) -> float:
    """The 2-over-1 speed-up this machine gives two in-process jobs at once (no Dagster): ``jobs``
    one after another in ``baseline``, then ``jobs`` in each of two processes at the same time. Two
    workers cannot beat it; on a VM whose cores share caches and memory bandwidth it is under 2."""
    from concurrent.futures import ThreadPoolExecutor

    (root / "second").mkdir(parents=True, exist_ok=True)
    second = Baseline(root / "second", inference, [["warm-second", size]])
    try:
        start = time.perf_counter()
        for i in range(jobs):
            baseline.time(f"ceiling-1p-{i}", size)
        one = jobs / (time.perf_counter() - start)
        start = time.perf_counter()
        with ThreadPoolExecutor(2) as pool:
            runs = [
                pool.submit(lambda p=proc, k=side: [p.time(f"ceiling-2p-{k}-{i}", size) for i in range(jobs)])
                for side, proc in enumerate((baseline, second))
            ]
            for run in runs:
                run.result()
        two = 2 * jobs / (time.perf_counter() - start)
    finally:
        second.close()
    return two / one


# -- the stack -----------------------------------------------------------------------
def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def inference_yaml(path: Path, cache_dir: Path) -> Path:
    """The shipped tiny-Wan YAML with its own (cold) conditioning cache."""
    data = yaml.safe_load((REPO / "configs" / "inference.wan-tiny.yaml").read_text())
    data["paths"]["checkpoint"] = str(REPO / data["paths"]["checkpoint"])
    data["paths"]["cache_dir"] = str(cache_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data))
    return path


WORKSPACE_QUERY = """
query { workspaceOrError { __typename ... on Workspace {
  locationEntries { name loadStatus locationOrLoadError { __typename } } } } }
"""


class Stack:
    """server.py with ``workers`` one-thread CPU workers in its own state dir."""

    def __init__(
        self, root: Path, workers: int, cpu_nice: int | None = None, dequeue_interval: float | None = None
    ):
        self.root, self.workers, self.cpu_nice = root, workers, cpu_nice
        self.dequeue_interval = dequeue_interval
        self.state = root / "state"
        self.port = free_port()
        self.config = root / "server.yaml"
        self.proc: subprocess.Popen | None = None
        self.instance = None
        self.startup_s = self.stop_s = 0.0

    def write_config(self) -> None:
        inference = inference_yaml(self.root / "inference.yaml", self.root / "cache")
        self.config.write_text(yaml.safe_dump({
            "state_dir": str(self.state),
            "webserver": {"host": "127.0.0.1", "port": self.port},
            "inference": {"config": str(inference)},
            "workers": {
                "warm": True,
                "devices": [{"device": "cpu", "threads": 1}] * self.workers,
                **({} if self.cpu_nice is None else {"cpu_nice": self.cpu_nice}),
            },
            "media_root": str(self.root / "media"),
            "step_storage": str(self.root / "steps"),
            **({} if self.dequeue_interval is None else {"dequeue_interval_seconds": self.dequeue_interval}),
        }))  # fmt: skip

    def log(self, name: str = "server") -> str:
        path = self.root / "server.out" if name == "server" else self.state / "logs" / f"{name}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def worker_states(self) -> dict[str, dict]:
        from orchestration.launcher import WorkerError, read_workers, worker_status

        out = {}
        for record in read_workers(self.state, "device"):
            try:
                out[record.name] = worker_status(record.url, timeout=2).model_dump(mode="json")
            except WorkerError:
                pass
        return out

    def all_idle(self) -> bool:
        states = self.worker_states()
        return len(states) == self.workers and all(s["state"] == "idle" for s in states.values())

    def location_loaded(self) -> bool:
        import httpx

        try:
            resp = httpx.post(
                f"http://127.0.0.1:{self.port}/graphql", json={"query": WORKSPACE_QUERY}, timeout=5
            )
            entries = resp.json()["data"]["workspaceOrError"]["locationEntries"]
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return False
        return any(
            e["loadStatus"] == "LOADED" and e["locationOrLoadError"]["__typename"] == "RepositoryLocation"
            for e in entries
        )

    def start(self, timeout: float = 300) -> None:
        from dagster import DagsterInstance
        from dagster_graphql import DagsterGraphQLClient

        self.state.mkdir(parents=True, exist_ok=True)
        self.write_config()
        started = time.monotonic()
        with open(self.root / "server.out", "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "server.py", "--config", str(self.config)],
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server.py exited with {self.proc.returncode}:\n{self.log()}")
            if self.all_idle() and self.location_loaded():
                break
            if time.monotonic() - started > timeout:
                raise RuntimeError(
                    f"stack not ready after {timeout:.0f}s:\n{self.log()}\n{self.log('webserver')}"
                )
            time.sleep(0.5)
        self.startup_s = time.monotonic() - started
        self.client = DagsterGraphQLClient("127.0.0.1", port_number=self.port)
        self.instance = DagsterInstance.from_config(str(self.state / "dagster_home"))

    def stop(self) -> None:
        if self.instance is not None:
            self.instance.dispose()
            self.instance = None
        if self.proc is None or self.proc.poll() is not None:
            return
        asked = time.monotonic()
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(90)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.stop_s = time.monotonic() - asked

    def submit(self, name: str, size: list[int]) -> tuple[str, float]:
        from contracts.tags import GPU_TAG

        config = {"work_id": "bench", "shot_id": name, **job_request(name, size)}
        submitted = time.time()
        run_id = self.client.submit_job_execution(
            "r2v", run_config={"ops": {"condition_op": {"config": config}}}, tags={GPU_TAG: "1"}, **LOCATION
        )
        return run_id, submitted

    def wait(self, run_ids: list[str], timeout: float) -> list:
        """Wait until every run is finished; returns their RunRecords (all must have succeeded)."""
        from dagster import DagsterRunStatus, RunsFilter

        deadline = time.monotonic() + timeout
        while True:
            records = self.instance.get_run_records(filters=RunsFilter(run_ids=run_ids))
            if len(records) == len(run_ids) and all(r.dagster_run.is_finished for r in records):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"runs not finished after {timeout:.0f}s:\n{self.log('daemon')}")
            time.sleep(0.3)
        by_id = {r.dagster_run.run_id: r for r in records}
        failed = [r for r in records if r.dagster_run.status != DagsterRunStatus.SUCCESS]
        if failed:
            logs = "\n".join(self.log(f"worker-cpu-{i}") for i in range(self.workers))
            raise RuntimeError(
                f"{len(failed)} run(s) did not succeed ({failed[0].dagster_run.status}):\n{logs}"
            )
        return [by_id[r] for r in run_ids]

    def first_step_start(self, run_id: str) -> float:
        from dagster import DagsterEventType

        events = self.instance.all_logs(run_id, of_type=DagsterEventType.STEP_START)
        return min(e.timestamp for e in events)

    def stage_timings(self, run_id: str) -> dict[str, float]:
        """Seconds the ops spent in each stage (the shot materialization's metadata)."""
        from dagster import DagsterEventType

        (event,) = self.instance.all_logs(run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION)
        return event.dagster_event.event_specific_data.materialization.metadata["stage_timings"].value

    def wait_idle(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not self.all_idle() and time.monotonic() < deadline:
            time.sleep(0.2)


class HostsStack(Stack):
    """A control host (webserver, daemon, API) and ``workers`` worker hosts of one one-thread CPU
    worker each, bound to 127.0.0.2, 127.0.0.3, ..., sharing PostgreSQL storage and media."""

    TOKEN_ENV, URL_ENV = "SHOTLOOM_WORKER_TOKEN", "SHOTLOOM_POSTGRES_URL"

    def __init__(self, root: Path, workers: int, database_url: str):
        super().__init__(root, workers)
        os.environ[self.URL_ENV] = database_url  # this process reads the storage too
        os.environ.setdefault(self.TOKEN_ENV, "bench-token-" + os.urandom(8).hex())
        self.hosts: list[subprocess.Popen] = []

    def _write(self, name: str, role: str, extra: dict) -> Path:
        inference = inference_yaml(self.root / "inference.yaml", self.root / "cache")
        config = self.root / f"{name}.yaml"
        state = self.state if name == "control" else self.root / name / "state"
        state.mkdir(parents=True, exist_ok=True)
        config.write_text(yaml.safe_dump({
            "state_dir": str(state),
            "inference": {"config": str(inference)},
            "storage": {"postgres_url_env": self.URL_ENV},
            "media_root": str(self.root / "media"),
            **extra,
        }))  # fmt: skip
        return config

    def _spawn(self, config: Path, role: str, log: str) -> subprocess.Popen:
        with open(self.root / log, "ab") as out:
            return subprocess.Popen(
                [sys.executable, "server.py", "--config", str(config), "--role", role],
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def start(self, timeout: float = 300) -> None:
        from dagster import DagsterInstance
        from dagster_graphql import DagsterGraphQLClient

        started = time.monotonic()
        control = self._write(
            "control",
            "control",
            {"webserver": {"host": "127.0.0.1", "port": self.port}, "workers": {"media": 0}},
        )
        self.proc = self._spawn(control, "control", "server.out")
        for n in range(self.workers):
            workers = {
                "name_prefix": f"h{n}-",
                "bind": f"127.0.0.{n + 2}",
                "media": 0,
                "devices": [{"device": "cpu", "threads": 1}],
            }
            self.hosts.append(
                self._spawn(
                    self._write(f"host{n}", "workers", {"workers": workers}), "workers", f"host{n}.out"
                )
            )
        while True:
            for proc in [self.proc, *self.hosts]:
                if proc.poll() is not None:
                    raise RuntimeError(f"server.py exited with {proc.returncode}:\n{self.log()}")
            if self.all_idle() and self.location_loaded():
                break
            if time.monotonic() - started > timeout:
                raise RuntimeError(f"hosts not ready after {timeout:.0f}s:\n{self.log()}")
            time.sleep(0.5)
        self.startup_s = time.monotonic() - started
        self.client = DagsterGraphQLClient("127.0.0.1", port_number=self.port)
        self.instance = DagsterInstance.from_config(str(self.state / "dagster_home"))

    def stop(self) -> None:
        for proc in self.hosts:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.hosts:
            try:
                proc.wait(90)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        super().stop()


def run_hosts(root: Path, args: argparse.Namespace) -> dict:
    """Throughput with one, then two worker hosts (one CPU worker each) behind one control host."""
    sys.path.insert(0, str(REPO / "tests"))
    from orchestration.storage import dagster_postgres_url

    import pg  # the throwaway PostgreSQL cluster of the tests

    inference = inference_yaml(root / "baseline" / "inference.yaml", root / "baseline" / "cache")
    print("calibrating the job size (1 thread) ...", flush=True)
    calib = calibrate(root, inference, args)
    short = calib["sizes"]["short"]
    job_s = {c["kind"]: c["seconds"] for c in calib["calibration"]}["short"]  # the last try of each kind
    names = [f"tp-{i}" for i in range(args.jobs)]
    server = pg.start()
    tp, foreign, meter = {}, {}, ForeignLoad()
    try:
        for hosts in (1, 2):
            url = dagster_postgres_url(server.fresh_database(f"bench_hosts_{hosts}"))
            stack = HostsStack(root / f"{hosts}h", hosts, url)
            print(f"starting a control host and {hosts} worker host(s) on PostgreSQL ...", flush=True)
            try:
                stack.start()
                print(f"  ready in {stack.startup_s:.1f} s; submitting {len(names)} jobs at once", flush=True)
                meter.start()
                tp[hosts] = measure_throughput(stack, names, short, job_s)
                foreign[f"{hosts}h"] = meter.stop()
                print(
                    f"  makespan {tp[hosts]['makespan_s']:.1f} s, runs per worker {tp[hosts]['per_worker']}"
                )
            finally:
                stack.stop()
    finally:
        server.stop()
    ratio = tp[2]["jobs_per_min"] / tp[1]["jobs_per_min"]
    print()
    print(f"{'worker hosts':<20} {'1':>10} {'2':>10}")
    print(f"{'jobs/min':<20} {tp[1]['jobs_per_min']:>10.2f} {tp[2]['jobs_per_min']:>10.2f}")
    print(f"{'makespan s':<20} {tp[1]['makespan_s']:>10.1f} {tp[2]['makespan_s']:>10.1f}")
    print(f"2 hosts / 1 host: {ratio:.2f} (two hosts share this machine's 2 cores: ~1.6 is its ceiling)")
    return {
        "hosts": 2,
        "jobs": args.jobs,
        "job_s": round(job_s, 2),
        "throughput_1h": round(tp[1]["jobs_per_min"], 3),
        "throughput_2h": round(tp[2]["jobs_per_min"], 3),
        "ratio_hosts": round(ratio, 2),
        "foreign_cores_max": round(max(foreign.values()), 2),
    }


# -- measurements --------------------------------------------------------------------
def measure_throughput(stack: Stack, names: list[str], size: list[int], job_s: float) -> dict:
    from contracts.tags import WORKER_TAG

    submitted = [stack.submit(name, size) for name in names]
    first_submit = submitted[0][1]
    timeout = 120 + 4 * job_s * len(names)
    records = stack.wait([run_id for run_id, _ in submitted], timeout)
    makespan = max(r.end_time for r in records) - first_submit
    per_worker: dict[str, int] = {}
    for r in records:
        name = r.dagster_run.tags.get(WORKER_TAG, "?")
        per_worker[name] = per_worker.get(name, 0) + 1
    return {
        "makespan_s": makespan,
        "jobs_per_min": len(names) / makespan * 60,
        "run_s_mean": statistics.mean(r.end_time - r.start_time for r in records),
        "submit_s": submitted[-1][1] - first_submit,
        "per_worker": per_worker,
    }


def measure_sequential(
    stack: Stack, baseline: Baseline, names: list[str], size: list[int], timeout: float
) -> list[dict]:
    """One run at a time on idle workers, each paired with the same job in the baseline process
    just before or after it (alternately): the latency and overhead samples."""
    from contracts.tags import LAUNCHED_AT_TAG

    samples = []
    for i, name in enumerate(names):
        if i % 2 == 0:
            in_process = baseline.time(name, size)
        stack.wait_idle()
        time.sleep(0.5)
        run_id, submitted = stack.submit(name, size)
        (record,) = stack.wait([run_id], timeout)
        if i % 2 == 1:
            in_process = baseline.time(name, size)
        tags = record.dagster_run.tags
        samples.append({
            "name": name,
            "in_process": in_process,
            "launched": float(tags[LAUNCHED_AT_TAG]) - submitted,
            "first_op": stack.first_step_start(run_id) - submitted,
            "run": record.end_time - record.start_time,
            "total": record.end_time - submitted,
            "compute": sum(stack.stage_timings(run_id).values()),
        })  # fmt: skip
    return samples


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=8, help="runs submitted at once per side")
    p.add_argument("--job-seconds", type=float, default=10.0, help="target in-process time of one job")
    p.add_argument("--long-seconds", type=float, default=20.0, help="target time of the %% jobs")
    p.add_argument("--long-samples", type=int, default=5, help="long runs submitted one at a time")
    p.add_argument("--samples", type=int, default=7, help="runs submitted one at a time (latency, overhead)")
    p.add_argument("--cpu-nice", type=int, help="workers.cpu_nice (default: the server's, 10)")
    p.add_argument("--dequeue-interval", type=float, help="dequeue_interval_seconds (default: the server's)")
    p.add_argument("--quick", action="store_true", help="small jobs, few of them: a smoke run")
    p.add_argument("--keep", action="store_true", help="keep the temporary state dirs")
    p.add_argument("--hosts", type=int, choices=(1, 2), default=1, help="2: one vs two worker hosts")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.child)
        return
    if args.quick:
        args.jobs, args.job_seconds, args.long_seconds, args.samples, args.long_samples = 4, 2.0, 4.0, 3, 1

    root = Path(tempfile.mkdtemp(prefix="shotloom-bench-scheduler-"))
    print(f"state under {root}", flush=True)
    try:
        figures = run_hosts(root, args) if args.hosts == 2 else run(root, args)
    finally:
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    print(result_line(figures))


def run(root: Path, args: argparse.Namespace) -> dict:
    seq_names = [f"seq-{i}" for i in range(args.samples)]
    long_names = [f"long-{i}" for i in range(args.long_samples)]
    tp_names = [f"tp-{i}" for i in range(args.jobs)]
    inference = inference_yaml(root / "baseline" / "inference.yaml", root / "baseline" / "cache")
    foreign, meter = {}, ForeignLoad()
    print("calibrating the job sizes (1 thread) ...", flush=True)
    calib = calibrate(root, inference, args)
    short, long = calib["sizes"]["short"], calib["sizes"]["long"]
    estimate = {c["kind"]: c["seconds"] for c in calib["calibration"]}  # the last try of each kind
    print(f"  calibration: {calib['calibration']}")
    print("starting the in-process baseline (1 thread, weights loaded, 2 warm-up jobs) ...", flush=True)
    baseline = Baseline(root, inference, [[f"warm-{i}", short] for i in range(2)])

    print("two in-process jobs at once against one (this machine's ceiling for the ratio) ...", flush=True)
    ceiling = measure_ceiling(root, inference, baseline, short)
    print(f"  ceiling {ceiling:.2f}", flush=True)

    tp, stacks, seq, longs = {}, {}, [], []
    try:
        for workers in (1, 2):
            stack = Stack(root / f"{workers}w", workers, args.cpu_nice, args.dequeue_interval)
            print(f"starting the stack with {workers} worker(s) ...", flush=True)
            try:
                stack.start()
                print(
                    f"  ready in {stack.startup_s:.1f} s; submitting {len(tp_names)} jobs at once", flush=True
                )
                meter.start()
                tp[workers] = measure_throughput(stack, tp_names, short, estimate["short"])
                foreign[f"{workers}w"] = meter.stop()
                r = tp[workers]
                print(
                    f"  makespan {r['makespan_s']:.1f} s, runs per worker {r['per_worker']}; "
                    f"other processes used {foreign[f'{workers}w']:.2f} cores meanwhile",
                    flush=True,
                )
                if workers == 2:  # the shipped configuration: latency and overhead, one run at a time
                    print(
                        f"  {len(seq_names)} runs one at a time, then {len(long_names)} long ones, "
                        "each beside the same job in-process",
                        flush=True,
                    )
                    meter.start()
                    seq = measure_sequential(stack, baseline, seq_names, short, 120 + 4 * estimate["short"])
                    longs = measure_sequential(stack, baseline, long_names, long, 120 + 4 * estimate["long"])
                    foreign["sequential"] = meter.stop()
                    print(f"  other processes used {foreign['sequential']:.2f} cores meanwhile", flush=True)
            finally:
                stack.stop()
                stacks[workers] = stack
                print(f"  stopped in {stack.stop_s:.1f} s", flush=True)
    finally:
        baseline.close()

    for s in [*seq, *longs]:
        s["overhead"] = s["total"] - s["in_process"]
        s["run_overhead"] = s["run"] - s["in_process"]
        s["orchestration"] = s["total"] - s["compute"]
    short_s = statistics.mean(s["in_process"] for s in seq)
    long_s = statistics.median(s["in_process"] for s in longs)
    first_ops = [s["first_op"] for s in seq]
    overhead = statistics.median(s["overhead"] for s in seq)
    orchestration = statistics.median(s["orchestration"] for s in seq)
    long_pct = statistics.median(s["overhead"] / s["in_process"] * 100 for s in longs)
    ratio = tp[2]["jobs_per_min"] / tp[1]["jobs_per_min"]
    ideal = {w: 60 * w / short_s for w in (1, 2)}

    print()
    print(f"{'throughput':<34} {'1 worker':>10} {'2 workers':>10}")
    print(f"{'stack startup s':<34} {stacks[1].startup_s:>10.1f} {stacks[2].startup_s:>10.1f}")
    print(f"{'submit all (client) s':<34} {tp[1]['submit_s']:>10.2f} {tp[2]['submit_s']:>10.2f}")
    print(f"{'makespan s':<34} {tp[1]['makespan_s']:>10.1f} {tp[2]['makespan_s']:>10.1f}")
    print(f"{'jobs/min':<34} {tp[1]['jobs_per_min']:>10.2f} {tp[2]['jobs_per_min']:>10.2f}")
    print(f"{'jobs/min if no overhead':<34} {ideal[1]:>10.2f} {ideal[2]:>10.2f}")
    print(f"{'mean run (start->end) s':<34} {tp[1]['run_s_mean']:>10.2f} {tp[2]['run_s_mean']:>10.2f}")
    print(f"{'stack stop s':<34} {stacks[1].stop_s:>10.1f} {stacks[2].stop_s:>10.1f}")
    print(f"2w/1w ratio {ratio:.2f} (target >= 1.7); runs per worker (2w): {tp[2]['per_worker']}")
    print(f"two in-process jobs at once vs one: {ceiling:.2f} (what this machine allows the ratio)")
    print()
    header = ("run", "in-proc s", "->launch", "->1st op", "run s", "->end s", "overhead", "in run", "not ops")
    print("{:<8} {:>10} {:>9} {:>9} {:>8} {:>8} {:>9} {:>8} {:>8}".format(*header))
    for s in [*seq, *longs]:
        print(
            f"{s['name']:<8} {s['in_process']:>10.2f} {s['launched']:>9.2f} {s['first_op']:>9.2f} "
            f"{s['run']:>8.2f} {s['total']:>8.2f} {s['overhead']:>9.2f} {s['run_overhead']:>8.2f}"
            f" {s['orchestration']:>8.2f}"
        )
    p50 = statistics.median(first_ops)
    print(f"submit->first op p50 {p50:.2f} s, max {max(first_ops):.2f} s (target <= 0.5)")
    print(f"orchestration outside the model stages per run (median) {orchestration:.2f} s (target <= 0.5)")
    print(f"overhead per run (median) {overhead:.2f} s (target <= 1.5)")
    print(f"long jobs: overhead (median) {long_pct:.1f}% of the in-process time (target <= 10%)")
    print(
        "(overhead = submit->run end minus the same job in-process; 'in run' = run start->end minus it;"
        " 'not ops' = submit->run end minus the time the ops spent in the model stages)"
    )
    print(
        "cores used by other processes: "
        + ", ".join(f"{k} {v:.2f}" for k, v in foreign.items())
        + " (figures are wall-clock: anything well above 0 inflates them)"
    )
    return {
        "jobs": args.jobs,
        "job_s": round(short_s, 2),
        "long_s": round(long_s, 2),
        "throughput_1w": round(tp[1]["jobs_per_min"], 3),
        "throughput_2w": round(tp[2]["jobs_per_min"], 3),
        "ratio": round(ratio, 2),
        "ratio_ceiling": round(ceiling, 2),
        "submit_to_first_op_p50_s": round(p50, 2),
        "overhead_per_run_s": round(overhead, 2),
        "orchestration_p50_s": round(orchestration, 2),
        "overhead_long_pct": round(long_pct, 1),
        "startup_2w_s": round(stacks[2].startup_s, 1),
        "foreign_cores_max": round(max(foreign.values()), 2),
    }


if __name__ == "__main__":
    main()
