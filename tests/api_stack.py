"""Start and stop the whole service (server.py) for HTTP tests and benches: temporary state, free ports."""

from __future__ import annotations

import json
import logging
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

import conftest
from conftest import free_port, kill_tree, spawn_server, stop_server, write_inference_yaml

FINISHED = ("succeeded", "failed")


def wait_for(
    predicate: Callable[[], Any],
    timeout: float,
    what: str,
    interval: float = 0.3,
    explain: Callable[[], str] | None = None,
) -> Any:
    """``predicate``'s first truthy value; on a timeout, an AssertionError saying what it waited
    for and, where given, ``explain()``: the facts that say why (on a slower CI machine, the only
    way to learn it)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            facts = ""
            if explain is not None:
                try:
                    facts = "\n" + explain()
                except Exception as exc:  # the facts are a courtesy: never hide the timeout
                    facts = f"\n(could not gather the facts: {exc!r})"
            raise AssertionError(f"timed out waiting for {what}{facts}")
        time.sleep(interval)


@contextmanager
def served(app: Any) -> Iterator[str]:
    """``app`` served by Uvicorn on a thread of this process, over real HTTP (what an in-process
    transport does not do alike: decode the path once); yields its base URL."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, 20, "the app to serve", interval=0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


@dataclass
class ApiStack:
    proc: subprocess.Popen
    config: Path
    state: Path
    base: str
    client: httpx.Client

    def get(self, path: str) -> httpx.Response:
        return self.client.get(self.base + path)

    def post(self, path: str, body: dict, headers: dict | None = None) -> httpx.Response:
        return self.client.post(self.base + path, json=body, headers=headers or {})

    def wait_version(self, version_id: str, timeout: float = 120) -> dict:
        def finished():
            body = self.get(f"/version/{version_id}").json()
            return body if body["status"] in FINISHED else None

        return wait_for(finished, timeout, f"version {version_id}", interval=0.5)

    def gateway(self):
        """Dagster's GraphQL, as an operator's tool reads it."""
        import yaml

        from api.dagster import DagsterGateway

        web = yaml.safe_load(self.config.read_text())["webserver"]
        return DagsterGateway(web["host"], web["port"])

    def runs_of(self, version_id: str) -> list:
        """The Dagster runs a job was made of, oldest first."""
        from contracts.tags import VERSION_TAG

        runs = self.gateway().find_runs_by_tag(VERSION_TAG, version_id)
        return sorted(runs, key=lambda r: r.create_time or 0)

    def find_version(self, shot_id: str) -> str:
        """The newest succeeded version of a shot (from the service store, as the API sees it)."""
        from api.store import Store

        store = Store(f"sqlite:///{self.state / 'api' / 'service.sqlite'}", create=False)
        try:
            job = store.newest_succeeded_shot("film", shot_id)
            assert job is not None, shot_id
            return job.version_id
        finally:
            store.close()

    def events(self, path: str, last_event_id: str | None = None, timeout: float = 180) -> list[dict]:
        """Read a Server-Sent Events stream to its end: [{"id", "event", "data"}], data parsed."""
        headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
        out: list[dict] = []
        with self.client.stream("GET", self.base + path, headers=headers, timeout=timeout) as resp:
            assert resp.status_code == 200, resp.read()
            assert resp.headers["content-type"].startswith("text/event-stream")
            event: dict = {}
            for line in resp.iter_lines():
                if not line:
                    if "data" in event:
                        out.append(event)
                    event = {}
                elif not line.startswith(":") and ": " in line:
                    field, value = line.split(": ", 1)
                    event[field] = json.loads(value) if field == "data" else value
        return out

    def log(self, name: str | None = None) -> str:
        path = self.state / "logs" / f"{name}.log" if name else self.state / "server.out"
        return path.read_text()[-6000:] if path.exists() else f"(no {path.name})"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        self.client.close()
        stop_server(self.proc)


@dataclass
class InProcessStack(ApiStack):
    """The API served in the test process (uvicorn on a thread, its background threads started by
    the app's lifespan) on a real SQLite store, reaching Dagster through :class:`InProcessDagster`
    (its runs executed in this process): no server.py, webserver, daemon or worker process."""

    dagster: Any = None  # InProcessDagster
    server: Any = None  # uvicorn.Server
    thread: threading.Thread | None = None
    log_handler: logging.Handler | None = None
    log_level: int = logging.WARNING  # the root logger's, before the stack logged at INFO

    def gateway(self):
        """The API's own gateway (Dagster as the API and an operator's tool read it)."""
        return self.dagster

    def alive(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def stop(self) -> None:
        """Stop serving (the lifespan stops the background threads), then the lanes (a running
        run is interrupted); the API's log closed."""
        self.client.close()
        self.server.should_exit = True
        self.thread.join(timeout=60)
        self.dagster.close()
        logging.getLogger().removeHandler(self.log_handler)
        logging.getLogger().setLevel(self.log_level)
        self.log_handler.close()


def write_server_yaml(
    root: Path,
    checkpoint: Path,
    api: dict | None = None,
    sampler: dict | None = None,
    performance: dict | None = None,
    **extra,
) -> tuple[Path, Path]:
    """Server YAML for the tiny Wan checkpoint, 2 CPU workers, the API on a free port; ``sampler``:
    the inference YAML's (default: dmd on four sigmas); ``performance``: the inference YAML's
    (default: none of diffusers' speed options, no step cache presets)."""
    overrides = {"sampler": sampler} if sampler is not None else {}
    if performance is not None:
        overrides["performance"] = performance
    inference = write_inference_yaml(root / "inference.yaml", "wan", checkpoint, root / "cache", **overrides)
    state = root / "state"
    state.mkdir(exist_ok=True)
    api = {"host": "127.0.0.1", "port": free_port(), **(api or {})}
    config = conftest.write_server_yaml(root / "server.yaml", state, free_port(), inference, api=api, **extra)
    return config, state


def launch(config: Path, state: Path, authorization: str | None = None) -> ApiStack:
    """Start server.py; ``authorization``: the API key the stack's client sends (keys set)."""
    data = yaml.safe_load(config.read_text())
    base = f"http://127.0.0.1:{data['api']['port']}"
    headers = {"Authorization": f"Bearer {authorization}"} if authorization else {}
    return ApiStack(
        spawn_server(config, state), config, state, base, httpx.Client(timeout=30, headers=headers)
    )


def wait_ready(stack: ApiStack, timeout: float = 150, interval: float = 1) -> ApiStack:
    def ready():
        assert stack.alive(), stack.log() + stack.log("api")
        try:
            return stack.get("/health").status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(ready, timeout, "the service to be ready", interval=interval)
    except AssertionError:
        logs = stack.log() + stack.log("api")
        stop_server(stack.proc, grace=10)  # a stack that never came up must not load the tests after
        raise AssertionError(logs) from None
    return stack


def start_api_stack(
    root: Path,
    checkpoint: Path,
    api: dict | None = None,
    authorization: str | None = None,
    sampler: dict | None = None,
    performance: dict | None = None,
    in_process: bool = False,
    **extra,
) -> ApiStack:
    """server.py on a new server YAML; ``in_process``: the API alone, in this process, on the
    in-process Dagster (:func:`serve_in_process`; one device worker unless ``workers`` says)."""
    if in_process:
        extra = {"workers": 1, **extra}
    config, state = write_server_yaml(root, checkpoint, api, sampler, performance, **extra)
    if in_process:
        return wait_ready(serve_in_process(config, state, authorization), interval=0.2)
    return wait_ready(launch(config, state, authorization))


def stop_api_stack(stack: ApiStack) -> None:
    stack.stop()


def serve_in_process(config: Path, state: Path, authorization: str | None = None) -> InProcessStack:
    """The app ``python -m api`` builds from ``config`` (:func:`api.__main__.build_context`), with
    :class:`InProcessDagster` for Dagster and its lanes for the workers, served by uvicorn on a
    thread over real HTTP (the app's lifespan starts the background threads); the API's log, at
    INFO as ``python -m api`` logs, in ``<state>/logs/api.log``."""
    import uvicorn
    from inprocess_dagster import InProcessDagster

    from api.__main__ import build_context
    from api.app import create_app
    from settings.server import ServerConfig

    cfg = ServerConfig.load(config)
    (state / "logs").mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(state / "logs" / "api.log")
    handler.setLevel(logging.INFO)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    root_level = logging.getLogger().level
    logging.getLogger().addHandler(handler)
    logging.getLogger().setLevel(logging.INFO)
    dagster = InProcessDagster(cfg)
    ctx = build_context(cfg, gateway=dagster, workers=dagster.workers)
    dagster.on_run_ended = ctx.background.run_ended  # as a worker's POST /internal/run-ended does
    dagster.start()
    app = create_app(ctx)
    server = uvicorn.Server(
        uvicorn.Config(
            app, host=cfg.api.host, port=cfg.api.port, log_config=None, access_log=cfg.api.access_log
        )
    )
    thread = threading.Thread(target=server.run, name="api-uvicorn", daemon=True)
    thread.start()
    headers = {"Authorization": f"Bearer {authorization}"} if authorization else {}
    return InProcessStack(
        None,  # no process
        config,
        state,
        cfg.api.base_url(),
        httpx.Client(timeout=30, headers=headers),
        dagster=dagster,
        server=server,
        thread=thread,
        log_handler=handler,
        log_level=root_level,
    )


def kill_everything(stack: ApiStack) -> None:
    """kill -9 server.py and every process it started."""
    kill_tree(stack.proc.pid)
    stack.client.close()
