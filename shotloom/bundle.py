"""TensorBundle: named tensors plus JSON metadata, stored as one safetensors file.

Used for conditioning (cached and passed between ops) and for latents. Never pickled.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_META_KEY = "shotloom.meta"


@dataclass
class TensorBundle:
    tensors: dict[str, Any]  # name -> torch.Tensor
    meta: dict[str, Any] = field(default_factory=dict)

    def save(self, path: Path) -> Path:
        from safetensors.torch import save_file

        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tensors = {k: v.detach().to("cpu").contiguous() for k, v in self.tensors.items()}
        save_file(tensors, str(tmp), metadata={_META_KEY: json.dumps(self.meta)})
        tmp.replace(path)  # atomic: a reader never sees a half-written file
        return path

    @classmethod
    def load(cls, path: Path, device: str = "cpu") -> TensorBundle:
        from safetensors import safe_open

        tensors = {}
        with safe_open(str(path), framework="pt", device=device) as f:
            meta = json.loads((f.metadata() or {}).get(_META_KEY, "{}"))
            for key in f.keys():
                # clone: the file's tensors sit at unaligned offsets, and unaligned inputs take other
                # SIMD paths (last-bit differences), which would break bit-identical reruns from disk.
                tensors[key] = f.get_tensor(key).clone()
        return cls(tensors=tensors, meta=meta)

    def to(self, device: str, dtype=None) -> TensorBundle:
        out = {}
        for k, v in self.tensors.items():
            v = v.to(device)
            if dtype is not None and v.is_floating_point():
                v = v.to(dtype)
            out[k] = v
        return TensorBundle(out, dict(self.meta))
