"""The API's whole app in process on a real store, with no Dagster, workers or follower threads
(the lifespan is not run, so the follower has not started): for tests of the HTTP layer that need
no run to happen. And the R2V dialect's validation error body, as a refusal answers it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import BaseModel, ValidationError

from api.auth import KeyRing
from api.core.jobs import JobService
from api.r2v.protocol import validation_error_body
from api.store import Store
from settings.api import ApiConfig


def bare_app(
    tmp_path,
    api: ApiConfig | None = None,
    capabilities: Callable[[], dict[str, Any] | None] | None = None,
    worker_names: list[str] | None = None,
    keys: KeyRing | None = None,
):
    """(a TestClient, the ApiContext). ``capabilities``: what the workers would publish (None: no
    worker has loaded the model); ``worker_names``: the device workers /health counts; ``keys``:
    the API keys (None: none, every route open)."""
    from api.app import create_app
    from api.background import Background
    from api.context import ApiContext
    from api.dagster import DagsterGateway
    from shotloom.config import REPO_ROOT, load_inference_config

    api = api or ApiConfig()
    store = Store(f"sqlite:///{tmp_path / 's.sqlite'}")
    gateway = DagsterGateway("127.0.0.1", 9)  # nothing listens: no Dagster is needed here
    inference = load_inference_config(REPO_ROOT / "configs" / "inference.wan-tiny.yaml")
    ctx = ApiContext(
        api=api,
        store=store,
        gateway=gateway,
        background=Background(store, gateway, api, registry=None),
        jobs=JobService(
            store,
            api,
            tmp_path / "state",
            tmp_path / "media",
            sampler_for=inference.sampler_for,
            performance=inference.performance,
            capabilities=capabilities or (lambda: None),
        ),
        media_root=tmp_path / "media",
        worker_names=worker_names or [],
        inference_config="configs/inference.wan-tiny.yaml",
        inference=inference,
        residency_policy="auto",
        keys=keys or KeyRing([]),
    )
    return TestClient(create_app(ctx)), ctx


def r2v_refusal(model: type[BaseModel], body: dict) -> dict:
    """The body the R2V dialect answers ``body`` with when ``model`` refuses it."""
    with pytest.raises(ValidationError) as e:
        model.model_validate(body)
    return validation_error_body(e.value)
