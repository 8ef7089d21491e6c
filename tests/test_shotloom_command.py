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
import httpx
import pytest
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


def _built_wheel(out: Path) -> Path:
    """The wheel `pip install .` installs, built from what a clone of this tree holds (tracked and
    new files, nothing ignored: no stale build/ folder), unpacked as pip lays out a pure wheel."""
    src = out / "src"
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=REPO_ROOT, capture_output=True, check=True, text=True,
    ).stdout  # fmt: skip
    for name in filter(None, listed.split("\0")):
        if (REPO_ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO_ROOT / name, src / name)
    pip = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    built = subprocess.run([*pip, "-w", str(out), "."], cwd=src, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    (wheel,) = out.glob("shotloom-*.whl")
    site = out / "site"
    shutil.unpack_archive(wheel, site, format="zip")
    return site


@pytest.mark.slow
def test_the_installed_package_serves_from_an_empty_directory_on_its_shipped_configs(tmp_path):
    """`pip install .`, then `shotloom serve` in a directory of the user's: the shipped YAMLs are
    found, the code location loads without a workspace file, and every process keeps its state
    (the tiny checkpoint, the database, the MP4) under that directory, not beside the packages."""
    from api_stack import wait_for
    from conftest import free_port, stop_server

    site = _built_wheel(tmp_path / "wheel")
    assert (site / "configs" / "server.cpu.yaml").is_file()
    assert (site / "configs" / "models" / "wan2.1-t2v-1.3b.yaml").is_file()
    work = tmp_path / "work"
    work.mkdir()
    # A user's directory holds files of theirs named as our packages are: never imported instead.
    (work / "settings.py").write_text("raise SystemExit('the working directory was imported from')\n")
    (work / "api").mkdir()
    (work / "api" / "__init__.py").write_text("raise SystemExit('the working directory was imported from')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SHOTLOOM_", "ECHO_", "DAGSTER_"))}
    env["PYTHONPATH"] = str(site)  # ahead of this checkout's editable install
    cli = [sys.executable, "-P", "-m", "orchestration.cli"]  # as the `shotloom` script: no cwd on the path

    done = subprocess.run(
        [*cli, "check", "--config", "configs/server.cpu.yaml"],
        cwd=work, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"state in {work / 'var' / 'server'}" in done.stdout
    assert f"{work / 'checkpoints' / 'wan-tiny'} is missing" in done.stdout  # built at first load

    api_port = free_port()
    (work / "server.yaml").write_text(
        yaml.safe_dump(
            {
                "inference": {"config": "configs/inference.wan-tiny.yaml"},  # the shipped one
                "webserver": {"host": "127.0.0.1", "port": free_port()},
                "workers": {"warm": True, "devices": [{"device": "cpu", "threads": 1}]},
                "api": {"host": "127.0.0.1", "port": api_port},
            }
        )
    )
    out = open(work / "serve.out", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [*cli, "serve", "--config", "server.yaml"],
        cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{api_port}"

    def explain() -> str:
        logs = sorted((work / "var" / "server" / "logs").glob("*.log"))
        return "\n".join(p.read_text()[-3000:] for p in [work / "serve.out", *logs] if p.is_file())

    try:

        def ready() -> bool:
            assert proc.poll() is None, explain()
            try:
                return httpx.get(base + "/health", timeout=5).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(ready, 240, "the installed service to be ready", interval=1, explain=explain)
        accepted = httpx.post(
            base + "/r2v",
            json={"work_id": "w", "shot_id": "s1", "prompt": "a kite", "memory_slots": [], "seed": 1},
            timeout=30,
        )
        assert accepted.status_code == 202, accepted.text
        version = accepted.json()["version_id"]

        def finished() -> dict | None:
            body = httpx.get(f"{base}/version/{version}", timeout=10).json()
            return body if body["status"] in ("succeeded", "failed") else None

        body = wait_for(finished, 180, f"version {version}", interval=0.5, explain=explain)
        assert body["status"] == "succeeded", body
        media = list((work / "var" / "server" / "media").rglob("*.mp4"))
        assert media, explain()
        with av.open(str(media[0])) as clip:
            assert sum(1 for _ in clip.decode(video=0)) > 0
        assert (work / "checkpoints" / "wan-tiny" / "model_index.json").is_file()
        assert (work / "var" / "server" / "api" / "service.sqlite").is_file()
        assert not (site / "var").exists() and not (site / "checkpoints").exists()
    finally:
        stop_server(proc, grace=60)
        out.close()
