"""Dagster resources: thin handles onto engine objects (no torch at import time)."""

from resources.media_store import MediaStoreResource
from resources.model_runtime import ModelRuntimeResource
from resources.tensor_io import TensorIOManager

__all__ = ["MediaStoreResource", "ModelRuntimeResource", "TensorIOManager"]
