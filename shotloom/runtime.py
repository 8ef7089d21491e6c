"""ModelRuntime: one loaded model family on one device, reused across generations.

This is the whole generation path in four stages (check, condition, denoise,
decode) plus the writer. ``inference.py`` calls ``generate``; the Dagster ops
call the stages one by one. A process keeps one runtime per (config, device) in
``RUNTIMES`` so weights stay loaded between runs.
"""

from __future__ import annotations

import random
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from shotloom.bundle import TensorBundle
from shotloom.cache import ConditioningCache, conditioning_key
from shotloom.config import InferenceConfig, load_inference_config
from shotloom.families.base import DecodedMedia, FamilyAdapter, Progress
from shotloom.request import GenerationRequest, MemorySlot


@dataclass
class StageTimings:
    seconds: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def stage(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = round(self.seconds.get(name, 0.0) + time.perf_counter() - start, 4)


@dataclass
class GenerationResult:
    output: Path
    request: GenerationRequest
    cache_hit: bool
    timings: dict[str, float]
    media: dict


class ModelRuntime:
    def __init__(self, cfg: InferenceConfig, device: str | None = None):
        self.cfg = cfg
        self.device = device or cfg.device
        self.cache = ConditioningCache(cfg.paths.cache_dir)
        self.loads = 0  # how many times weights were loaded from disk
        self._adapter: FamilyAdapter | None = None
        self._lock = threading.Lock()

    # -- weights ------------------------------------------------------------
    @property
    def adapter(self) -> FamilyAdapter:
        with self._lock:
            if self._adapter is None:
                from shotloom.families import adapter_class

                self._adapter = adapter_class(self.cfg.family).load(self.cfg, self.device)
                self.loads += 1
            return self._adapter

    @property
    def loaded(self) -> bool:
        return self._adapter is not None

    def release(self) -> None:
        with self._lock:
            self._adapter = None

    @property
    def checkpoint_id(self) -> str:
        return f"{self.cfg.family}:{self.cfg.paths.checkpoint.name}"

    # -- stages -------------------------------------------------------------
    def resolve(
        self,
        prompt: str,
        *,
        width: int | None = None,
        height: int | None = None,
        num_frames: int | None = None,
        fps: int | None = None,
        seed: int | None = None,
        guidance_scale: float | None = None,
        negative_prompt: str | None = None,
        first_frame: Path | None = None,
        last_frame: Path | None = None,
        memory: list[MemorySlot] | tuple[MemorySlot, ...] = (),
    ) -> GenerationRequest:
        """Fill unset fields from the inference YAML's defaults (never rounds what was asked)."""
        d = self.cfg.defaults
        return GenerationRequest(
            prompt=prompt,
            width=width or d.width,
            height=height or d.height,
            num_frames=num_frames or d.num_frames,
            fps=fps or d.fps,
            seed=seed if seed is not None else random.randrange(2**32),
            guidance_scale=guidance_scale if guidance_scale is not None else self.cfg.sampler.guidance_scale,
            negative_prompt=negative_prompt if negative_prompt is not None else d.negative_prompt,
            first_frame=first_frame,
            last_frame=last_frame,
            memory=tuple(memory),
        )

    def check(self, req: GenerationRequest) -> None:
        for path in [req.first_frame, req.last_frame, *[p for m in req.memory for p in (m.image, m.audio)]]:
            if path is not None and not Path(path).is_file():
                raise FileNotFoundError(f"input file not found: {path}")
        self.adapter.check(req)

    def condition(self, req: GenerationRequest) -> tuple[TensorBundle, bool]:
        """Conditioning bundle from the cache, or from the encoders (then cached)."""
        key = conditioning_key(self.adapter.encoder_identity(), req)
        cached = self.cache.get(key)
        if cached is not None:
            cached.meta["cache_key"] = key
            return cached, True
        bundle = self.adapter.encode(req)
        bundle.meta["cache_key"] = key
        self.cache.put(key, bundle)
        return bundle, False

    def denoise(self, cond: TensorBundle, req: GenerationRequest, progress: Progress | None = None):
        return self.adapter.denoise(cond, req, progress)

    def decode(self, latents: TensorBundle, req: GenerationRequest, progress: Progress | None = None):
        return self.adapter.decode(latents, req, progress)

    def write(self, decoded: DecodedMedia, req: GenerationRequest, output: Path):
        from shotloom import media

        audio = self.cfg.audio
        return media.write_mp4(
            output,
            decoded.frames,
            req.fps,
            decoded.audio,
            decoded.sample_rate,
            silent_track=audio.silent_track,
            silent_sample_rate=audio.sample_rate,
            silent_channels=audio.channels,
        )

    def generate(self, req: GenerationRequest, output: Path, progress: Progress | None = None):
        """The standalone path: every stage in this process, in order."""
        timings = StageTimings()
        with timings.stage("load"):
            self.adapter  # noqa: B018 - load weights before timing the stages
        with timings.stage("check"):
            self.check(req)
        with timings.stage("condition"):
            cond, hit = self.condition(req)
        with timings.stage("denoise"):
            latents = self.denoise(cond, req, progress)
        with timings.stage("decode"):
            decoded = self.decode(latents, req)
        with timings.stage("write"):
            info = self.write(decoded, req, output)
        return GenerationResult(output, req, hit, timings.seconds, media_summary(info))


def media_summary(info) -> dict:
    """JSON-able figures of a written MP4 (shared by the CLI and asset metadata)."""
    return {
        "bytes": info.bytes,
        "sha256": info.sha256,
        "frames": info.frames,
        "fps": float(info.fps),
        "width": info.width,
        "height": info.height,
        "duration_s": round(float(info.duration_s), 4),
        "has_audio": info.has_audio,
    }


def decoded_to_bundle(decoded: DecodedMedia, req: GenerationRequest) -> TensorBundle:
    """Decoded frames/audio as safetensors-ready tensors (frames are never pickled)."""
    import torch

    tensors = {"frames": torch.from_numpy(decoded.frames)}
    if decoded.audio is not None:
        tensors["audio"] = torch.from_numpy(decoded.audio)
    return TensorBundle(
        tensors, {"kind": "decoded", "sample_rate": decoded.sample_rate, "request": req.to_json()}
    )


def bundle_to_decoded(bundle: TensorBundle) -> DecodedMedia:
    audio = bundle.tensors.get("audio")
    return DecodedMedia(
        frames=bundle.tensors["frames"].numpy(),
        audio=audio.numpy() if audio is not None else None,
        sample_rate=bundle.meta.get("sample_rate"),
    )


RUNTIMES: dict[tuple[str, str, str], ModelRuntime] = {}
_REGISTRY_LOCK = threading.Lock()


def get_runtime(config_path: str | Path | None = None, device: str | None = None) -> ModelRuntime:
    """The process-level runtime for this inference YAML and device (weights stay loaded)."""
    cfg = load_inference_config(config_path)
    key = (str(cfg.source), device or cfg.device, str(cfg.paths.checkpoint))
    with _REGISTRY_LOCK:
        if key not in RUNTIMES:
            RUNTIMES[key] = ModelRuntime(cfg, device)
        return RUNTIMES[key]
