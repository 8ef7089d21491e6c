"""Entry point of the code location (``dagster dev -w workspace.yaml``).

Imports nothing heavy: torch and diffusers load inside runs only.
"""

from __future__ import annotations

import os

from dagster import Definitions

from orchestration.assets import media_assets
from orchestration.jobs import extend, merge, r2v
from orchestration.rerender import rerender, schedules_for
from orchestration.server_config import ServerConfig
from resources import MediaStoreResource, ModelRuntimeResource, TensorIOManager

# The server YAML (server.py names it) lists the re-render schedules; `dagster dev` alone has none.
_server = os.environ.get("SHOTLOOM_SERVER_CONFIG")

defs = Definitions(
    jobs=[r2v, extend, merge, rerender],
    schedules=schedules_for(ServerConfig.load(_server) if _server else None),
    assets=media_assets,
    resources={
        "runtime": ModelRuntimeResource(),
        "media": MediaStoreResource(),
        "io_manager": TensorIOManager(),
    },
)
