"""Content-addressed conditioning cache on disk (safetensors).

Key = sha256 over the encoder identity and everything the encoders read: prompt
texts, the bytes of every input file, and the geometry the image conditioning is
encoded at. A hit skips every encoder forward.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from shotloom.bundle import TensorBundle
from shotloom.request import GenerationRequest


def file_sha256(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def conditioning_key(encoder_identity: str, req: GenerationRequest, uses_negative: bool | None = None) -> str:
    """The cache key of ``req``'s conditioning; ``uses_negative``: whether it holds the negative
    prompt's (the family's :meth:`~shotloom.families.base.FamilyAdapter.uses_negative`; default:
    the request's guidance > 1)."""

    def digest(p: Path | None) -> str | None:
        return file_sha256(p) if p is not None else None

    material = {
        "encoder": encoder_identity,
        "prompt": req.prompt,
        "negative_prompt": req.negative_prompt,
        "uses_negative": req.guidance_scale > 1.0 if uses_negative is None else uses_negative,
        "geometry": [req.width, req.height, req.num_frames, req.fps],
        "first_frame": digest(req.first_frame),
        "last_frame": digest(req.last_frame),
        "memory": [[digest(m.image), digest(m.audio)] for m in req.memory],
        "source_video": digest(req.source_video),
    }
    if req.guides:  # only then: keys of requests without guides stay what they were
        # Each guide's bytes, where it sits and what it is (its measured span derives from them).
        material["guides"] = [[digest(g.path), g.frame, g.kind, g.with_audio] for g in req.guides]
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


class ConditioningCache:
    def __init__(self, root: Path):
        self.root = Path(root)

    def path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.safetensors"

    def get(self, key: str) -> TensorBundle | None:
        path = self.path(key)
        return TensorBundle.load(path) if path.is_file() else None

    def put(self, key: str, bundle: TensorBundle) -> Path:
        return bundle.save(self.path(key))

    def encode_lock(self):
        """Host-wide lock held while an encoder stack runs (one at a time across processes)."""
        from filelock import FileLock

        self.root.mkdir(parents=True, exist_ok=True)
        return FileLock(str(self.root / ".encode.lock"))
