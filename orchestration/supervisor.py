"""Start the whole service from one server YAML.

    shotloom serve --config configs/server.cpu.yaml [--role all|control|workers]
    python server.py --config ...   (the same, from a checkout)

Writes ``<state_dir>/dagster_home/dagster.yaml`` (sqlite storage, queued run
coordinator with one gpu-tag limit, run monitoring, DeviceRunLauncher), then
starts one device worker per configured device, ``dagster-daemon run``,
``dagster-webserver`` and the HTTP API (``python -m api``), each in its own process group with logs under
``<state_dir>/logs``. A child that dies is restarted: a worker's run is resumed by
run monitoring; the daemon and webserver hold no state of their own (queued runs
live in run storage), so nothing queued is lost. A child that keeps dying
(``restart_limit`` times within ``restart_window_seconds``) stops the service.
SIGTERM/SIGINT stops everything, grandchildren included.

Roles split the service across hosts that share PostgreSQL storage (``storage.postgres_url_env``):
``control`` runs the webserver, daemon and API; ``workers`` runs the device and media workers its
YAML lists; ``all`` (the default) runs everything on one host.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from contracts.environment import API_URL_ENV
from orchestration.instance_yaml import write_dagster_yaml
from settings.server import ServerConfig
from shotloom.config import REPO_ROOT

REPO = Path(__file__).resolve().parent.parent  # the children import the packages from here
log = logging.getLogger("shotloom.server")


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM if server.py dies without cleaning up (Linux only)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class ReadyReport:
    """Logs when each child is ready (seconds since start) and when ``GET /health`` first answers
    200: where a slow start goes is in the server log."""

    def __init__(self, stack: Stack, started: float, poll: float = 0.25, give_up_s: float = 600):
        self.stack, self.started, self.poll, self.give_up_s = stack, started, poll, give_up_s
        self.ready: dict[str, float] = {}
        self.instance = None  # DagsterInstance, opened on first use

    def _probe(self, name: str) -> bool:
        import httpx

        from orchestration.launcher import WorkerError, worker_status

        cfg = self.stack.cfg
        if name.startswith("worker-"):
            record = self._registry().get(name.removeprefix("worker-"))
            try:
                alive = record is not None and record.heartbeat >= self.started
                return alive and worker_status(record.url).state in ("idle", "busy")
            except WorkerError:
                return False
        if name == "daemon":
            beats = self._instance().get_daemon_heartbeats().values()
            return any(b.timestamp >= self.started for b in beats)
        url = {
            "webserver": f"http://{cfg.webserver.host}:{cfg.webserver.port}/server_info",
            "api": f"{cfg.api.base_url()}/health",
        }[name]
        try:
            return httpx.get(url, timeout=2).status_code < 500 or name == "api"
        except httpx.HTTPError:
            return False

    def _instance(self):
        from dagster import DagsterInstance

        if self.instance is None:
            self.instance = DagsterInstance.from_config(str(self.stack.cfg.dagster_home))
        return self.instance

    def _registry(self):
        from orchestration.registry import WorkerRegistry

        return WorkerRegistry(self._instance().run_storage)

    def _healthy(self) -> bool:
        import httpx

        try:
            return httpx.get(f"{self.stack.cfg.api.base_url()}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def run(self) -> None:
        try:
            self._watch()
        finally:
            if self.instance is not None:
                self.instance.dispose()

    def _watch(self) -> None:
        while not self.stack.stopping and time.time() - self.started < self.give_up_s:
            for name in self.stack.commands:
                if name not in self.ready and self._safe_probe(name):
                    self.ready[name] = time.time() - self.started
                    log.info("%s ready %.1fs after start", name, self.ready[name])
            serves_api = "api" in self.stack.commands
            if len(self.ready) == len(self.stack.commands) and (not serves_api or self._healthy()):
                parts = ", ".join(f"{n} {t:.1f}s" for n, t in sorted(self.ready.items(), key=lambda i: i[1]))
                what = "healthy (GET /health 200)" if serves_api else "all workers ready"
                log.info("%s %.1fs after start; ready: %s", what, time.time() - self.started, parts)
                return
            time.sleep(self.poll)

    def _safe_probe(self, name: str) -> bool:
        try:
            return self._probe(name)
        except Exception:  # storage busy, a half-written record...: the next poll asks again
            return False


ROLES = ("all", "control", "workers")
STAGED_YAML = "dagster.yaml.staged"  # the instance config while its storage is being created


class Stack:
    def __init__(self, cfg: ServerConfig, config_path: Path, role: str = "all"):
        self.cfg = cfg
        self.role = role
        self.config_path = config_path
        self.logs = cfg.state_dir / "logs"
        self.procs: dict[str, subprocess.Popen] = {}
        self.commands: dict[str, list[str]] = {}
        self.restarts: dict[str, list[float]] = {}
        self.stopping = False

    def env(self) -> dict[str, str]:
        cfg = self.cfg
        path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
        return {
            **os.environ,
            "PYTHONPATH": path,  # every process must import orchestration.launcher
            # ...from there: `python -m` would put the working directory (the user's, for an installed
            # package) first on the path, where a settings.py or an api/ of theirs would shadow ours.
            "PYTHONSAFEPATH": "1",
            "DAGSTER_HOME": str(cfg.dagster_home),
            "SHOTLOOM_STATE_DIR": str(cfg.state_dir),
            "SHOTLOOM_INFERENCE_CONFIG": str(cfg.inference_config()),
            "SHOTLOOM_SERVER_CONFIG": str(self.config_path),  # the code location's schedules
            API_URL_ENV: cfg.api.base_url(),  # where runs reach the API (re-renders, media links)
            "SHOTLOOM_MEDIA_ROOT": str(cfg.media_root),
            "SHOTLOOM_STEP_STORAGE": str(cfg.step_storage),
        }

    def plan(self) -> None:
        cfg, py = self.cfg, sys.executable
        if self.role in ("all", "workers"):
            bind = ["--host", cfg.workers.bind] + (
                ["--advertise", cfg.workers.advertise] if cfg.workers.advertise else []
            )
            common = ["--state-dir", str(cfg.state_dir), "--server-config", str(self.config_path), *bind]
            for (name, device), dev in zip(cfg.worker_slots(), cfg.workers.devices, strict=True):
                cmd = [py, "-m", "orchestration.worker", "--device", device, "--name", name]
                cmd += ["--threads", str(dev.threads), "--nice", str(cfg.workers.niceness(dev)), *common]
                if dev.ids is not None and dev.parallel is not None:  # a device group: rank 0 starts the rest
                    cmd += [
                        "--group-ids",
                        ",".join(map(str, dev.ids)),
                        "--parallel",
                        dev.parallel.model_dump_json(),
                    ]
                self.commands[f"worker-{name}"] = cmd + ([] if cfg.workers.warm else ["--no-warm"])
            for name in cfg.media_worker_names():
                cmd = [py, "-m", "orchestration.worker", "--pool", "media", "--device", "cpu", "--name", name]
                self.commands[f"worker-{name}"] = [
                    *cmd, "--threads", "1", "--nice", str(cfg.workers.media_nice), *common
                ]  # fmt: skip
        if self.role in ("all", "control"):
            # The module where the packages are (not the working directory, which is the user's).
            module = ["-m", "orchestration.definitions", "-d", str(REPO)]
            workspace = ["-w", str(cfg.workspace)] if cfg.workspace else module
            self.commands["daemon"] = [py, "-m", "orchestration.daemon", "run", *workspace]
            web = cfg.webserver
            self.commands["webserver"] = [
                py, "-m", "dagster_webserver", "-h", web.host, "-p", str(web.port), *workspace
            ]  # fmt: skip
            # The HTTP API: one process (its follower threads own submission and callbacks).
            self.commands["api"] = [py, "-m", "api", "--config", str(self.config_path)]

    def spawn(self, name: str) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        with open(self.logs / f"{name}.log", "ab") as out:
            self.procs[name] = subprocess.Popen(
                self.commands[name],
                cwd=REPO_ROOT,  # where relative paths resolve, in every process as here
                env=self.env(),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # own process group: killpg reaches its children too
                preexec_fn=_die_with_parent,
            )
        log.info("started %s (pid %d)", name, self.procs[name].pid)

    def init_storage(self) -> None:
        """Create Dagster's schemas once, before any child opens them: processes (or, on PostgreSQL,
        hosts) creating them at the same time fail ("already exists")."""
        from dagster import DagsterInstance

        from orchestration.storage import consolidate_events, postgres_lock

        def create() -> None:
            with DagsterInstance.from_config(str(self.cfg.dagster_home), STAGED_YAML) as instance:
                instance.get_runs(limit=1)
                instance.event_log_storage.get_asset_records()
                instance.all_instigator_state()

        env = self.cfg.storage.postgres_url_env
        if env:
            with postgres_lock(os.environ[env], "dagster-schema"):  # one host at a time
                create()
            return
        consolidate_events(self.cfg.dagster_home / "storage")  # a state dir of an earlier release
        create()

    def start(self) -> None:
        self.cfg.state_dir.mkdir(parents=True, exist_ok=True)
        # dagster.yaml appears only once its storage exists: nothing opens a half-made schema.
        staged = write_dagster_yaml(self.cfg, STAGED_YAML)
        self.init_storage()
        staged.replace(staged.with_name("dagster.yaml"))
        self.plan()
        for name in self.commands:  # workers first: they warm while the webserver boots
            self.spawn(name)

    def supervise(self) -> int:
        limits = self.cfg.supervision
        while not self.stopping:
            for name, proc in list(self.procs.items()):
                if proc.poll() is None or self.stopping:
                    continue
                now = time.monotonic()
                recent = [t for t in self.restarts.get(name, []) if now - t < limits.restart_window_seconds]
                if len(recent) >= limits.restart_limit:
                    log.error("%s keeps exiting (last code %s); shutting down", name, proc.returncode)
                    return 1
                self.restarts[name] = [*recent, now]
                log.warning("%s exited with %s; restarting", name, proc.returncode)
                self.spawn(name)
            time.sleep(0.5)
        return 0

    def shutdown(self, grace: float = 20.0) -> None:
        import psutil

        self.stopping = True
        tree: list[psutil.Process] = []
        for proc in self.procs.values():
            try:
                tree += psutil.Process(proc.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                pass
        # Daemon first (no new launches), then workers (interrupt runs), then the webserver.
        order = sorted(self.procs, key=lambda n: (n != "daemon", n == "webserver"))
        for name in order:
            try:
                os.killpg(self.procs[name].pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        for name in order:
            proc = self.procs[name]
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop in time; killing its group", name)
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
        # Code servers may have left the group (or outlived their parent): reap what remains.
        _, alive = psutil.wait_procs(tree, timeout=max(0.5, deadline - time.monotonic()))
        for p in alive:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(alive, timeout=5)
        log.info("stopped")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Start the API, Dagster webserver, daemon and workers.")
    parser.add_argument("--config", default="configs/server.cpu.yaml", help="server YAML")
    parser.add_argument(
        "--role",
        choices=ROLES,
        default="all",
        help="control: webserver, daemon, API; workers: this host's workers",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("alembic").setLevel(logging.WARNING)  # Dagster's schema checks: a page of noise
    logging.getLogger("httpx").setLevel(logging.WARNING)  # the readiness probes
    cfg = ServerConfig.load(args.config)
    env = cfg.storage.postgres_url_env
    if env:  # this process and every child read Dagster's storage URL from it
        from orchestration.storage import dagster_postgres_url

        if not os.environ.get(env):
            parser.error(f"storage.postgres_url_env: the environment variable {env} is not set")
        os.environ[env] = dagster_postgres_url(os.environ[env])
    stack = Stack(cfg, ServerConfig.located(args.config), args.role)

    def stop(signo: int, _frame: object) -> None:
        log.info("signal %d: shutting down", signo)
        stack.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    code = 1
    started = time.time()
    try:
        stack.start()
        threading.Thread(target=ReadyReport(stack, started).run, name="ready", daemon=True).start()
        if args.role == "workers":
            log.info("workers of this host: %s; state in %s", ", ".join(stack.commands), cfg.state_dir)
        else:
            log.info(
                "API on %s (docs at /docs), Dagster UI on http://%s:%d, state in %s",
                cfg.api.base_url(),
                cfg.webserver.host,
                cfg.webserver.port,
                cfg.state_dir,
            )
        code = stack.supervise()
    finally:
        stack.shutdown()
    return code


if __name__ == "__main__":
    sys.exit(main())
