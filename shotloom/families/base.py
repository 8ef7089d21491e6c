"""The adapter interface every model family implements.

A generation is four stages, each a Dagster op in the service and a plain call in
``inference.py``: ``encode`` (text/image/audio -> TensorBundle), ``denoise``
(bundle -> latents TensorBundle), ``decode`` (latents -> frames + audio) and the
writer (``shotloom.media``). Stages exchange only TensorBundles and DecodedMedia,
so each can run in a different process from files on disk.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from shotloom.bundle import TensorBundle
from shotloom.capabilities import Capabilities
from shotloom.config import InferenceConfig
from shotloom.request import GenerationRequest

# progress(done, total) -> None; raising from it (e.g. on cancel) aborts the stage.
Progress = Callable[[int, int], None]


@dataclass
class DecodedMedia:
    frames: np.ndarray  # (F, H, W, 3) uint8
    audio: np.ndarray | None = None  # (channels, samples) float32 in [-1, 1]
    sample_rate: int | None = None


@dataclass
class EncoderCounter:
    """Counts encoder forward passes (text, image, VAE-encode, audio) — a cache hit must add none."""

    calls: dict[str, int] = field(default_factory=dict)

    def hit(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    @property
    def total(self) -> int:
        return sum(self.calls.values())


class FamilyAdapter(ABC):
    """One model family. Instances hold loaded weights; construct with ``load``."""

    family: str

    def __init__(self, cfg: InferenceConfig, pipe, device: str):
        self.cfg = cfg
        self.pipe = pipe
        self.device = device
        self.encoder_counter = EncoderCounter()

    # -- checkpoint ---------------------------------------------------------
    @classmethod
    @abstractmethod
    def build_tiny_checkpoint(cls, out_dir: Path, seed: int = 0) -> Path:
        """Write a tiny, randomly initialised checkpoint in the real diffusers folder format."""

    @classmethod
    @abstractmethod
    def load(cls, cfg: InferenceConfig, device: str = "cpu") -> FamilyAdapter:
        """``from_pretrained(cfg.paths.checkpoint, local_files_only=True)`` and wrap it."""

    # -- capabilities -------------------------------------------------------
    @property
    @abstractmethod
    def capabilities(self) -> Capabilities: ...

    def check(self, req: GenerationRequest) -> None:
        """Raise CapabilityError before any work. Families may add rules."""
        self.capabilities.check(req)

    def encoder_identity(self) -> str:
        """Identity of the encoder stack, part of every conditioning cache key."""
        return f"{self.family}:{self.cfg.paths.checkpoint.name}:{self.cfg.dtype}"

    # -- stages -------------------------------------------------------------
    @abstractmethod
    def encode(self, req: GenerationRequest) -> TensorBundle:
        """Run every encoder (text, images, audio). Count each forward in encoder_counter."""

    @abstractmethod
    def denoise(
        self, cond: TensorBundle, req: GenerationRequest, progress: Progress | None = None
    ) -> TensorBundle:
        """Few-step DMD from cond alone (no encoder forwards). Returns latents (video, maybe audio)."""

    @abstractmethod
    def decode(
        self, latents: TensorBundle, req: GenerationRequest, progress: Progress | None = None
    ) -> DecodedMedia:
        """VAE decode (tiled per cfg.tiling) and, if the family makes audio, the vocoder."""

    # -- weights ------------------------------------------------------------
    def modules(self) -> dict:
        """Named torch modules of the pipeline (for residency and memory accounting)."""
        import torch

        return {k: v for k, v in self.pipe.components.items() if isinstance(v, torch.nn.Module)}

    def tensor_bytes(self) -> int:
        return sum(
            p.numel() * p.element_size()
            for m in self.modules().values()
            for p in list(m.parameters()) + list(m.buffers())
        )
