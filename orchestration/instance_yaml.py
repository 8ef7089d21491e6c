"""Dagster's ``dagster.yaml`` made from the server YAML: storage (SQLite under the state dir, or the
shared PostgreSQL), the run coordinator and launcher of the device pools, run monitoring and
retries. No torch: server.py writes it before anything starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from contracts.tags import GPU_TAG, MEDIA_TAG
from orchestration.storage import sqlite_storage_config
from settings.server import ServerConfig


def storage_yaml(cfg: ServerConfig) -> dict[str, Any]:
    env = cfg.storage.postgres_url_env
    if env:  # an env reference: the URL (and its password) never lands in dagster.yaml
        return {"storage": {"postgres": {"postgres_url": {"env": env}}}}
    return sqlite_storage_config(cfg.dagster_home / "storage")


def dagster_yaml(cfg: ServerConfig) -> dict[str, Any]:
    m = cfg.monitoring
    return {
        **storage_yaml(cfg),
        "run_coordinator": {
            "module": "orchestration.coordinator",
            "class": "DeviceRunCoordinator",
            "config": {
                "dequeue_interval_seconds": cfg.dequeue_interval_seconds,
                "state_dir": str(cfg.state_dir),  # queue control (pause, priorities) lives there
                # The pools' limits follow the workers alive in the registry, on every host.
                "heartbeat_timeout_seconds": cfg.runtime.heartbeat_timeout_seconds,
                "storage_outage_seconds": cfg.runtime.storage_outage_seconds,
                # One limit per pool, on the key (not per value): any free worker of the pool
                # takes its oldest run. A device group is one worker: one slot.
                "tag_concurrency_limits": [
                    {"key": GPU_TAG, "limit": len(cfg.workers.devices)},
                    {"key": MEDIA_TAG, "limit": cfg.workers.media},
                ],
            },
        },
        "run_launcher": {
            "module": "orchestration.launcher",
            "class": "DeviceRunLauncher",
            "config": {
                "state_dir": str(cfg.state_dir),
                "heartbeat_timeout_seconds": cfg.runtime.heartbeat_timeout_seconds,
                "storage_outage_seconds": cfg.runtime.storage_outage_seconds,
            },
        },
        "run_monitoring": {
            "enabled": True,
            "poll_interval_seconds": m.poll_interval_seconds,
            "max_resume_run_attempts": m.max_resume_run_attempts,
            "start_timeout_seconds": m.start_timeout_seconds,
            "cancel_timeout_seconds": m.cancel_timeout_seconds,
        },
        "run_retries": {
            "enabled": cfg.retries.max_retries > 0,
            "max_retries": cfg.retries.max_retries,
            "retry_on_asset_or_op_failure": False,
        },
        # Nothing in the UI asks an operator to sign up for anything, and nothing phones home.
        "telemetry": {"enabled": False},
        "nux": {"enabled": False},
    }


def write_dagster_yaml(cfg: ServerConfig, name: str = "dagster.yaml") -> Path:
    cfg.dagster_home.mkdir(parents=True, exist_ok=True)
    path = cfg.dagster_home / name
    path.write_text(yaml.safe_dump(dagster_yaml(cfg), sort_keys=False))
    return path
