"""The installed ``shotloom`` command (``pip install .``): ``serve`` is server.py, ``generate`` is
inference.py with its steps shown as they go, ``check`` validates a YAML and its checkpoint folder
without loading weights and names what is wrong."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import av
import yaml

from shotloom.config import REPO_ROOT

SHOTLOOM = str(Path(sys.executable).with_name("shotloom"))


def shotloom(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [SHOTLOOM, *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
    )


def test_check_passes_the_shipped_config_and_names_the_key_that_is_wrong(tmp_path, wan_checkpoint):
    # The shipped config, its checkpoint built (SHOTLOOM_CHECKPOINT points it elsewhere, as a user may).
    done = shotloom(
        "check", "--config", "configs/server.cpu.yaml", env={"SHOTLOOM_CHECKPOINT": str(wan_checkpoint)}
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "ok" and "WanVACEPipeline" in done.stdout
    # Not built yet (a fresh clone): the tiny random checkpoint is built at load, so that passes too.
    fresh = tmp_path / "not-built-yet"
    done = shotloom("check", "--config", "configs/server.cpu.yaml", env={"SHOTLOOM_CHECKPOINT": str(fresh)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "ok" and f"{fresh} is missing" in done.stdout

    server = yaml.safe_load((REPO_ROOT / "configs" / "server.cpu.yaml").read_text())
    server["workers"]["bogus"] = 1
    bad = tmp_path / "server.yaml"
    bad.write_text(yaml.safe_dump(server))
    done = shotloom("check", "--config", str(bad))
    assert done.returncode == 2 and "workers.bogus" in done.stderr, done.stderr

    broken = tmp_path / "ckpt"
    shutil.copytree(wan_checkpoint, broken)
    shutil.rmtree(broken / "vae")
    inference = tmp_path / "inference.yaml"
    inference.write_text(yaml.safe_dump({"family": "wan", "paths": {"checkpoint": str(broken)}}))
    done = shotloom("check", "--config", str(inference))
    assert done.returncode == 2, done.stdout
    assert "paths.checkpoint" in done.stderr and "'vae'" in done.stderr


def test_generate_shows_each_step_and_prints_the_summary(wan_config, tmp_path):
    out = tmp_path / "kite.mp4"
    done = shotloom(
        "generate", "--config", str(wan_config), "--prompt", "a kite", "--seed", "3", "--output", str(out)
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    steps = summary["sampling"]["steps"]
    # Not a terminal: a plain line a step (a bar on a terminal), on stderr, stdout kept for the summary.
    shown = [line for line in done.stderr.splitlines() if line.startswith("denoise step ")]
    assert shown == [f"denoise step {i}/{steps}" for i in range(1, steps + 1)]
    with av.open(str(out)) as clip:
        assert sum(1 for _ in clip.decode(video=0)) == summary["frames"] > 0


def test_serve_is_the_servers_own_command():
    done = shotloom("serve", "--help")
    assert done.returncode == 0 and "--role" in done.stdout and "--config" in done.stdout
    assert shotloom("--help").stdout.count("serve") >= 1


def test_an_installed_package_reads_relative_paths_from_the_working_directory(tmp_path):
    """`pip install .` puts the packages in site-packages, with no configs/ beside them: the
    YAMLs' relative paths are then the working directory's (a checkout's own stay the checkout's)."""
    site, work = tmp_path / "site-packages", tmp_path / "work"
    shutil.copytree(REPO_ROOT / "shotloom", site / "shotloom", ignore=shutil.ignore_patterns("__pycache__"))
    work.mkdir()
    code = "from shotloom.config import REPO_ROOT; print(REPO_ROOT)"
    env = {**os.environ, "PYTHONPATH": str(site)}
    installed = subprocess.run(
        [sys.executable, "-c", code], cwd=work, env=env, capture_output=True, text=True
    )
    assert installed.returncode == 0, installed.stderr
    assert installed.stdout.strip() == str(work)
    checkout = subprocess.run([sys.executable, "-c", code], cwd=work, capture_output=True, text=True)
    assert checkout.stdout.strip() == str(REPO_ROOT)
