"""``python -m api --config <server YAML>``: serve the HTTP API (one Uvicorn process).

server.py starts it beside the Dagster webserver, daemon and device workers. It reaches Dagster's
runs only through the webserver's GraphQL endpoint (it reads the worker registry, our own records
in Dagster's key-value table, from the storage), and never imports torch.
"""

from __future__ import annotations

import argparse
import logging

import uvicorn
from dagster import DagsterInstance

from api.app import create_app
from api.auth import load_keys
from api.background import Background
from api.background.workers import WorkerStatuses
from api.context import ApiContext
from api.core.jobs import JobService
from api.core.references import MediaWorkerReferences
from api.dagster import DagsterGateway, Gateway
from api.store import Store
from orchestration.registry import WorkerRegistry
from settings.server import ServerConfig
from shotloom.config import REPO_ROOT, load_inference_config
from shotloom.media_store import LocalMediaStore


def build_context(
    cfg: ServerConfig, gateway: Gateway | None = None, workers: WorkerStatuses | None = None
) -> ApiContext:
    """The API of ``cfg``; ``gateway`` and ``workers`` default to Dagster's webserver (GraphQL) and
    the workers registered in its storage (tests pass in-process ones)."""
    api = cfg.api
    store = Store(cfg.service_store_url())
    if gateway is None:
        web = cfg.webserver
        gateway = DagsterGateway("127.0.0.1" if web.host in ("0.0.0.0", "::") else web.host, web.port)
    registry = None
    if workers is None:
        # The worker registry lives in Dagster's storage (shared by every host); the API reads it there.
        registry = WorkerRegistry(DagsterInstance.from_config(str(cfg.dagster_home)).run_storage)
    background = Background(
        store, gateway, api, registry, poll_seconds=api.follow_interval_seconds, workers=workers
    )
    inference = load_inference_config(cfg.inference_config())
    jobs = JobService(
        store,
        api,
        cfg.state_dir,
        cfg.media_root,
        on_accept=background.poke,
        capabilities=background.capabilities,
        defaults=inference.defaults,
        sampler_for=inference.sampler_for,
        performance=inference.performance,
        terminate=lambda run_id: gateway.terminate(run_id, wait_starting_s=0),
        assets_dir=cfg.inputs_dir(),
        references=MediaWorkerReferences(
            gateway, LocalMediaStore(cfg.media_root), api.media_task_timeout_seconds
        ),
    )
    config = cfg.inference.config
    ctx = ApiContext(
        api=api,
        store=store,
        gateway=gateway,
        background=background,
        jobs=jobs,
        media_root=cfg.media_root,
        worker_names=cfg.worker_names(),
        media_worker_names=cfg.media_worker_names(),
        inference_config=str(config.relative_to(REPO_ROOT) if config.is_relative_to(REPO_ROOT) else config),
        inference=inference,
        residency_policy=cfg.runtime.dit_residency,
        keys=load_keys(api.auth),
    )
    background.every("job-store", ctx.retention.sweep, api.openai.sweep_interval_s)
    return ctx


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Serve the HTTP API (R2V scheduler and OpenAI-compatible /v1)."
    )
    parser.add_argument("--config", required=True, help="server YAML")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    cfg = ServerConfig.load(args.config)
    app = create_app(build_context(cfg))
    # One process: the background threads own submission and callbacks.
    uvicorn.run(
        app, host=cfg.api.host, port=cfg.api.port, workers=1, log_level="info", access_log=cfg.api.access_log
    )


if __name__ == "__main__":
    main()
