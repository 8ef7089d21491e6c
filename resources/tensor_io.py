"""IO manager for step outputs: TensorBundles as safetensors, small records as JSON.

Nothing is pickled, so a retry (or a step in another process) reloads exactly what
the finished step stored, and tensors never go through pickle.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from dagster import ConfigurableIOManager, InputContext, OutputContext
from pydantic import Field

from shotloom import ENV_PREFIX
from shotloom.bundle import TensorBundle
from shotloom.config import REPO_ROOT


def default_storage_dir() -> str:
    return os.environ.get(f"{ENV_PREFIX}_STEP_STORAGE", str(REPO_ROOT / "var" / "steps"))


class TensorIOManager(ConfigurableIOManager):
    base_dir: str = Field(default_factory=default_storage_dir)

    def _path(self, identifier) -> Path:
        return Path(self.base_dir).joinpath(*identifier)

    def handle_output(self, context: OutputContext, obj) -> None:
        path = self._path(context.get_identifier())
        if isinstance(obj, TensorBundle):
            target = obj.save(path.with_suffix(".safetensors"))
            shapes = {k: list(v.shape) for k, v in obj.tensors.items()}
            context.add_output_metadata(
                {"path": str(target), "bytes": target.stat().st_size, "shapes": shapes}
            )
        elif dataclasses.is_dataclass(obj):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.with_suffix(".json").write_text(
                json.dumps({"type": type(obj).__name__, "data": dataclasses.asdict(obj)})
            )
        elif obj is not None:
            raise TypeError(f"TensorIOManager stores TensorBundle or dataclasses, got {type(obj).__name__}")

    def load_input(self, context: InputContext):
        path = self._path(context.get_identifier())
        if path.with_suffix(".safetensors").is_file():
            return TensorBundle.load(path.with_suffix(".safetensors"))
        record = json.loads(path.with_suffix(".json").read_text())
        cls = context.dagster_type.typing_type
        return cls(**record["data"])
