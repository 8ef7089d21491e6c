"""Everything the routers need, built once by ``python -m api`` (or by tests)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from api.auth import KeyRing
from api.background import Background
from api.core.jobs import JobService
from api.core.retention import Retention
from api.dagster import Gateway
from api.store import Store
from settings.api import ApiConfig
from shotloom.config import InferenceConfig


@dataclass
class ApiContext:
    api: ApiConfig
    store: Store
    gateway: Gateway
    background: Background  # submits, follows runs, delivers callbacks, reads workers
    jobs: JobService
    media_root: Path
    worker_names: list[str]
    inference_config: str  # as the operator named it (for /health)
    inference: InferenceConfig
    residency_policy: str
    keys: KeyRing = field(default_factory=lambda: KeyRing([]))
    media_worker_names: list[str] = field(default_factory=list)
    retention: Retention | None = None  # the /v1 job store's bounds (built from api.openai)

    def __post_init__(self) -> None:
        if self.retention is None:
            self.retention = Retention(self.store, self.jobs, self.api.openai)

    health_cache: tuple[float, dict[str, Any]] | None = field(default=None, repr=False)
    health_was_ok: bool = field(default=False, repr=False)  # /health has answered ok once
