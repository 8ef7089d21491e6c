"""Model runtime resource.

Dagster builds resources per run, but weights must outlive runs: this resource is
only a handle onto the process-level registry ``shotloom.runtime.RUNTIMES``, so a
long-lived worker process loads a checkpoint once and reuses it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dagster import ConfigurableResource
from pydantic import Field

if TYPE_CHECKING:
    from shotloom.runtime import ModelRuntime


class ModelRuntimeResource(ConfigurableResource):
    inference_config: str = Field(
        default="",
        description="Inference YAML; empty = $SHOTLOOM_INFERENCE_CONFIG or the embedded tiny default.",
    )
    device: str = Field(default="", description="torch device; empty = the inference YAML's.")

    def get(self) -> ModelRuntime:
        from shotloom.runtime import get_runtime  # imports torch: only inside runs

        return get_runtime(self.inference_config or None, self.device or None)
