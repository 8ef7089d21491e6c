"""Shared fixtures: tiny checkpoints built once per session, temp configs and media roots."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Tiny models are many small kernels: one thread each is much faster than two fighting
# over 2 cores (also inherited by the subprocesses tests start).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import httpx
import numpy as np
import pytest
import yaml
from PIL import Image


def write_inference_yaml(path: Path, family: str, checkpoint: Path, cache_dir: Path, **overrides) -> Path:
    data = {
        "family": family,
        "paths": {"checkpoint": str(checkpoint), "cache_dir": str(cache_dir)},
        "dtype": "float32",
        "sampler": {"sigmas": [1.0, 0.75, 0.5, 0.25], "shift": 1.0},
        "tiling": {"enabled": True, "tile_px": 32, "stride_px": 16, "tile_frames": 16, "stride_frames": 8},
    }
    if family == "wan":
        data["defaults"] = {"width": 64, "height": 64, "num_frames": 17, "fps": 16}
    for key, value in overrides.items():
        data[key] = value
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny models make thousands of tiny kernel calls; with 2 OpenMP threads on a shared 2-core box,
    every call waits at a barrier for a descheduled thread (10-20x slower). One thread is faster anyway."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def wan_checkpoint(tmp_path_factory) -> Path:
    from shotloom.families.wan import WanAdapter

    return WanAdapter.build_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "wan-tiny", seed=0)


@pytest.fixture
def wan_config(tmp_path, wan_checkpoint) -> Path:
    return write_inference_yaml(tmp_path / "inference.yaml", "wan", wan_checkpoint, tmp_path / "cache")


@pytest.fixture
def image_file(tmp_path) -> Path:
    """A 64x64 PNG with a gradient (a first frame / reference image)."""
    y, x = np.mgrid[0:64, 0:64]
    pixels = np.stack([x * 4, y * 4, (x + y) * 2], axis=-1).astype(np.uint8)
    path = tmp_path / "frame.png"
    Image.fromarray(pixels).save(path)
    return path


# -- the whole service (server.py) for slow tests: temp state, free ports --------------------------
# Shared by test_workers.py and test_recovery.py. Dagster is imported lazily (not every test needs it).
REPO = Path(__file__).resolve().parent.parent
LOCATION = {"repository_location_name": "orchestration.definitions", "repository_name": "__repository__"}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_server_yaml(
    path: Path,
    state: Path,
    port: int,
    inference: Path,
    workers: int = 2,
    adapters: list | None = None,
    **extra,
) -> Path:
    """A server YAML with ``workers`` one-thread CPU workers (warm) on a temp state dir and free ports."""
    from settings.server import ServerConfig

    data = {
        "state_dir": str(state),
        "webserver": {"host": "127.0.0.1", "port": port},
        "inference": {"config": str(inference), **({"adapters": adapters} if adapters is not None else {})},
        "workers": {"warm": True, "devices": [{"device": "cpu", "threads": 1}] * workers},
        "monitoring": {"poll_interval_seconds": 2},
        **extra,
    }
    if "api" in ServerConfig.model_fields and "api" not in data:
        data["api"] = {"port": free_port()}  # when server.py also starts the HTTP API: never a fixed port
    path.write_text(yaml.safe_dump(data))
    return path


@dataclass
class Stack:
    """``server.py`` started by a test, with what the tests ask of it."""

    proc: subprocess.Popen
    config: Path
    state: Path
    port: int
    client: Any  # DagsterGraphQLClient
    n_workers: int = 2

    def log(self, name: str = "server") -> str:
        path = self.state / "logs" / f"{name}.log" if name != "server" else self.state / "server.out"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def workers(self) -> dict[str, dict]:
        from orchestration.launcher import read_workers

        out = {}
        for record in read_workers(self.state, "device"):
            try:
                with urllib.request.urlopen(record.url + "/status", timeout=2) as resp:
                    out[record.name] = json.loads(resp.read())
            except OSError:
                pass
        return out

    def instance(self):
        from dagster import DagsterInstance

        return DagsterInstance.from_config(str(self.state / "dagster_home"))

    def submit(self, shot_id: str, **shot) -> str:
        config = {"work_id": "w", "shot_id": shot_id, "prompt": f"shot {shot_id}", "seed": 1, **shot}
        return self.client.submit_job_execution(
            "r2v", run_config={"ops": {"condition_op": {"config": config}}}, **LOCATION
        )

    def wait(self, run_ids: list[str], timeout: float = 90) -> list:
        """Final statuses as a GraphQL client sees them (or the last seen ones at the timeout)."""
        from dagster import DagsterRunStatus

        done = (DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED)
        deadline = time.monotonic() + timeout
        while True:
            statuses = [self.client.get_run_status(r) for r in run_ids]
            if all(s in done for s in statuses) or time.monotonic() > deadline:
                return statuses
            time.sleep(0.5)

    def wait_stored(self, run_ids: list[str], timeout: float = 90) -> list:
        """Final statuses read from run storage: works while the webserver is down."""
        deadline = time.monotonic() + timeout
        with self.instance() as instance:
            while True:
                runs = [instance.get_run_by_id(r) for r in run_ids]
                if all(r is not None and r.is_finished for r in runs) or time.monotonic() > deadline:
                    return [r.status if r is not None else None for r in runs]
                time.sleep(0.5)

    def children(self) -> dict[str, Any]:
        """server.py's direct children by role: 'daemon', 'webserver', 'worker-<name>' -> psutil.Process."""
        import psutil

        out = {}
        for child in psutil.Process(self.proc.pid).children():
            try:
                cmd = child.cmdline()
            except psutil.NoSuchProcess:
                continue
            if "orchestration.daemon" in cmd:
                out["daemon"] = child
            elif "dagster_webserver" in cmd:
                out["webserver"] = child
            elif "orchestration.worker" in cmd:
                out[f"worker-{cmd[cmd.index('--name') + 1]}"] = child
        return out

    def webserver_up(self) -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/server_info", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False


def spawn_server(
    config: Path, state: Path, role: str | None = None, wrap: Callable[[list[str]], list[str]] | None = None
) -> subprocess.Popen:
    """``server.py --config [--role]`` in its own process group, its output in ``<state>/server.out``;
    ``wrap``: the command as run (e.g. inside another network namespace)."""
    out = open(state / "server.out", "ab")  # noqa: SIM115 - lives as long as the process
    argv = [sys.executable, "server.py", "--config", str(config), *(["--role", role] if role else [])]
    return subprocess.Popen(
        wrap(argv) if wrap else argv,
        cwd=REPO,
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def start_stack(config: Path, state: Path, port: int, workers: int = 2) -> Stack:
    """server.py on ``config``; returns once the webserver answers and every worker is idle."""
    from dagster_graphql import DagsterGraphQLClient

    proc = spawn_server(config, state)
    stack = Stack(proc, config, state, port, DagsterGraphQLClient("127.0.0.1", port_number=port), workers)
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:
        assert proc.poll() is None, stack.log()
        up = stack.webserver_up()
        states = stack.workers()
        if up and len(states) == workers and all(w["state"] == "idle" for w in states.values()):
            return stack
        time.sleep(1)
    logs = stack.log() + stack.log("webserver")
    stop_server(proc, grace=10)  # a stack that never came up must not load the tests after it
    raise AssertionError("stack did not come up\n" + logs)


def stop_server(proc: subprocess.Popen, grace: float = 60) -> None:
    """SIGTERM to server.py's process group (it stops its children), SIGKILL after ``grace``."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def kill_tree(pid: int) -> None:
    """kill -9 ``pid`` and every process it started (each child leads its own process group)."""
    import psutil

    procs = [psutil.Process(pid)]
    try:
        procs += procs[0].children(recursive=True)
    except psutil.NoSuchProcess:
        pass
    # Deepest first: children get SIGTERM from the kernel when server.py dies (PR_SET_PDEATHSIG),
    # which would let them stop gracefully; this is a crash.
    for p in reversed(procs):
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=10)


def stop_stack(stack: Stack) -> None:
    stop_server(stack.proc)


def first_submit(stack: Stack, shot_id: str, **shot) -> str:
    deadline = time.monotonic() + 90
    while True:  # the code location may still be loading
        try:
            return stack.submit(shot_id, **shot)
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


# -- a small disk that fills up (tmpfs; root only) ----------------------------------------------------
@contextlib.contextmanager
def small_disk_at(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted on ``path`` (made if missing) for the block, unmounted after;
    skips the test where it cannot be mounted."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(disk: Path) -> Path:
    """Take every free byte of ``disk``."""
    filler = disk / "filler.bin"
    block = b"\0" * (1 << 16)
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(block)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    for size in (4096, 512, 1):  # the last pages a 64 KiB block did not fit in
        with open(filler, "ab", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * size)
            except OSError:
                pass
    return filler
