"""`dagster dev -w workspace.yaml` for real: the code location loads and a launched run makes an MP4."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from dagster import DagsterRunStatus
from dagster_graphql import DagsterGraphQLClient

from shotloom import media

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@pytest.fixture
def dagster_dev(tmp_path, wan_config):
    port = free_port()
    home = tmp_path / "dagster_home"
    home.mkdir()
    env = {
        **os.environ,
        # the venv may not be activated (make test): dagster dev starts its children from PATH
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "DAGSTER_HOME": str(home),
        "SHOTLOOM_INFERENCE_CONFIG": str(wan_config),
        "SHOTLOOM_MEDIA_ROOT": str(tmp_path / "media"),
        "SHOTLOOM_STEP_STORAGE": str(tmp_path / "steps"),
    }
    log = open(tmp_path / "dagster-dev.log", "wb")
    proc = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "dagster"),
            "dev",
            "-w",
            "workspace.yaml",
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
        ],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        # Ctrl+C must reach it: a child inherits an ignored or blocked SIGINT, and a test earlier in
        # the same pytest process may have left it so (dagster dev then waited out the 30 s).
        preexec_fn=_default_sigint,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/server_info", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, (tmp_path / "dagster-dev.log").read_text()
            time.sleep(1)
        yield port, tmp_path
    finally:
        # Ctrl+C, as an operator stops it: dagster dev then stops its children and exits (on
        # SIGTERM to the group it waited out the whole 30 s).
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def test_run_launched_through_graphql_produces_mp4(dagster_dev):
    port, tmp_path = dagster_dev
    client = DagsterGraphQLClient("127.0.0.1", port_number=port)
    run_config = {
        "ops": {"condition_op": {"config": {"work_id": "demo", "shot_id": "s1", "prompt": "rain", "seed": 3}}}
    }
    deadline = time.monotonic() + 120
    while True:  # the code location may still be loading
        try:
            run_id = client.submit_job_execution("r2v", run_config=run_config)
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(2)
    status = None
    while time.monotonic() < deadline + 120:
        status = client.get_run_status(run_id)
        if status in (DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED):
            break
        time.sleep(1)
    assert status == DagsterRunStatus.SUCCESS, (tmp_path / "dagster-dev.log").read_text()[-4000:]
    [mp4] = (tmp_path / "media" / "r2v" / "demo" / "s1").glob("*/output.mp4")
    assert media.probe(mp4).frames == 17
