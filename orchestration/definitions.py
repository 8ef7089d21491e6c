"""Entry point of the code location (``dagster dev -w workspace.yaml``).

Imports nothing heavy: torch and diffusers load inside runs only.
"""

from __future__ import annotations

from dagster import Definitions

from orchestration.assets import media_assets
from orchestration.jobs import extend, merge, r2v
from resources import MediaStoreResource, ModelRuntimeResource, TensorIOManager

defs = Definitions(
    jobs=[r2v, extend, merge],
    assets=media_assets,
    resources={
        "runtime": ModelRuntimeResource(),
        "media": MediaStoreResource(),
        "io_manager": TensorIOManager(),
    },
)
