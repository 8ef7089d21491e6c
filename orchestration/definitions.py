"""Entry point of the code location (``dagster dev -w workspace.yaml``).

Imports nothing heavy: torch and diffusers load inside runs only.
"""

from __future__ import annotations

import os

from dagster import Definitions

from orchestration.assets import media_assets
from orchestration.jobs import extend, merge, r2v, reference, shot_stills
from orchestration.rerender import checkpoint_id, rerender, schedules_for, sensors_for
from resources import MediaStoreResource, ModelRuntimeResource, TensorIOManager
from settings.server import ServerConfig

# The server YAML (server.py names it) lists the re-render schedules; `dagster dev` alone has none.
_server = os.environ.get("SHOTLOOM_SERVER_CONFIG")
_config = ServerConfig.load(_server) if _server else None


def _loaded_checkpoint() -> str | None:
    """The checkpoint the workers load (the sensor compares shots against it); no torch."""
    if _config is None:
        return None
    from shotloom.config import load_inference_config

    inference = load_inference_config(_config.inference_config())
    return checkpoint_id(inference.family, str(inference.paths.checkpoint))


defs = Definitions(
    jobs=[r2v, shot_stills, extend, merge, reference, rerender],
    schedules=schedules_for(_config),
    sensors=sensors_for(_config, _loaded_checkpoint()),
    assets=media_assets,
    resources={
        "runtime": ModelRuntimeResource(),
        "media": MediaStoreResource(),
        "io_manager": TensorIOManager(),
    },
)
