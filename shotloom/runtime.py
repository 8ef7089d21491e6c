"""ModelRuntime: one loaded model family on one device, reused across generations.

This is the whole generation path in four stages (check, condition, denoise,
decode) plus the writer. ``inference.py`` calls ``generate``; the Dagster ops
call the stages one by one. A process keeps one runtime per (config, device) in
``RUNTIMES`` so weights stay loaded between runs.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from shotloom import stages
from shotloom.bundle import TensorBundle
from shotloom.cache import ConditioningCache, conditioning_key
from shotloom.config import InferenceConfig, MemoryEstimates, load_inference_config
from shotloom.families.base import DecodedMedia, FamilyAdapter, Progress
from shotloom.guides import measured
from shotloom.parallel import group_config, group_progress
from shotloom.performance import fp8_skip_patterns
from shotloom.request import GenerationRequest, Guide, MemorySlot, resolve

# on_stage(name): told when a generation enters one of shotloom.stages' stages (the ops record it).
OnStage = Callable[[str], None]

TIER_STAGES = {
    "keep": stages.KEEPING_ON_GPU,
    "stage_on_cpu": stages.STAGING_ON_CPU,
    "release": stages.UNLOADING,
}


def _quiet(_stage: str) -> None:
    pass


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
    sampling: dict = field(default_factory=dict)  # how it was sampled (the latents' meta)


class ModelRuntime:
    def __init__(self, cfg: InferenceConfig, device: str | None = None, probe=None, headroom=None):
        from shotloom.admission import Headroom, LiveProbe

        self.cfg = cfg
        self.device = device or cfg.device
        self.cache = ConditioningCache(cfg.paths.cache_dir)
        self.probe = probe or LiveProbe(self.device)  # live free memory; a FakeProbe in tests
        self.headroom = headroom or Headroom.from_env()
        self.loads = 0  # how many times the whole pipeline was loaded from disk
        self.last_used = time.monotonic()
        self.residency = None  # shotloom.admission.ResidencyPlan once a server chose it
        self._adapter: FamilyAdapter | None = None
        self._lock = threading.Lock()
        self.compile_seconds: float | None = None  # the load's compile run (performance.compile)
        self.group = None  # shotloom.parallel.RankGroup: this runtime is rank 0 of a device group

    # -- weights ------------------------------------------------------------
    @property
    def adapter(self) -> FamilyAdapter:
        with self._lock:
            if self._adapter is None:
                from shotloom.families import adapter_class

                adapter = adapter_class(self.cfg.family).load(self.cfg, self.device)
                adapter.setup_generators()
                if self.cfg.performance.compile.enabled:
                    self._compile_now(adapter)
                self._adapter = adapter
                self.loads += 1
            return self._adapter

    def _compile_now(self, adapter: FamilyAdapter) -> None:
        """Run the compiled blocks once at the default shape (one step, guidance as the default
        sampler has it), so compilation happens at load and no request at that shape pays it;
        a compile that cannot work fails here, naming the key."""
        from shotloom.performance import PerformanceError

        req = self.resolve("warm-up", seed=0, num_inference_steps=self.cfg.sampler.fixed_steps or 1)
        started = time.perf_counter()
        try:
            adapter.denoise(adapter.encode(req), req)
        except Exception as exc:
            raise PerformanceError("compile", f"the compiled DiT failed its first run: {exc}") from exc
        finally:
            adapter.encoder_counter.calls.clear()  # the warm-up is not a request's encoding
        self.compile_seconds = round(time.perf_counter() - started, 3)

    @property
    def loaded(self) -> bool:
        return self._adapter is not None

    def release(self) -> None:
        """Drop every weight (out-of-memory recovery, idle eviction); the next stage reloads."""
        import gc

        with self._lock:
            self._adapter = None
        gc.collect()
        _empty_device_cache()

    # -- admission (device workers; the standalone CLI obeys its YAML's offload flag) ------------
    def footprint(self):
        """Measured tensor storage when loaded, else the checkpoint's files at the configured dtype."""
        from shotloom.admission import checkpoint_footprint, measured_footprint
        from shotloom.families import adapter_class
        from shotloom.families.weights import ensure_checkpoint

        if self._adapter is not None:
            return measured_footprint(self._adapter.modules())
        family = adapter_class(self.cfg.family)
        ensure_checkpoint(self.cfg, family.build_tiny_checkpoint)
        fp8 = fp8_skip_patterns(self.cfg.paths.checkpoint) if self.cfg.performance.fp8 else None
        return checkpoint_footprint(
            self.cfg.paths.checkpoint, self.cfg.dtype, component_dtypes=family.pinned_dtypes, fp8_skip=fp8
        )

    def _peak_id(self) -> str:
        return f"{self.cfg.family}:{self.cfg.paths.checkpoint}:{self.cfg.dtype}"

    def admission_plan(self, policy: str | None = None):
        """Residency, requirement and verdict for the next job, from live free memory."""
        from shotloom.admission import load_measured_peak, plan_admission

        fp = self.footprint()
        measured = load_measured_peak(self.cfg.paths.cache_dir, self._peak_id())
        peak = measured or fp.total_bytes + MemoryEstimates.bytes(self.cfg.memory.denoise_gib)
        if policy is None:  # once placed, a runtime keeps its mode; before, the YAML's flag decides
            chosen = self.residency.mode if self.residency is not None else None
            policy = (
                chosen if chosen in ("resident", "swap") else ("swap" if self.cfg.offload else "resident")
            )
        return plan_admission(
            fp,
            self.probe,
            self.headroom,
            policy=policy,
            peak_bytes=peak,
            reserve_fraction=self.cfg.memory.reserve_fraction,
        )

    def apply_residency(self, policy: str):
        """Choose resident/swap for the DiT before loading (a server's ``dit_residency``)."""
        if self.loaded:
            raise RuntimeError("residency is chosen before the weights are loaded")
        plan = self.admission_plan(policy).residency
        if plan.mode in ("resident", "swap"):
            self.cfg = self.cfg.model_copy(update={"offload": plan.mode == "swap"})
        self.residency = plan
        return plan

    def after_run(self) -> None:
        """Restart the idle clock; on CUDA record the run's peak for future 'auto' decisions."""
        import torch

        from shotloom.admission import save_measured_peak

        self.last_used = time.monotonic()
        if _device_type(self.device) == "cuda" and torch.cuda.is_available():
            mode = self.residency.mode if self.residency is not None else "resident"
            peak = torch.cuda.max_memory_allocated()
            save_measured_peak(self.cfg.paths.cache_dir, self._peak_id(), peak, mode=mode)
            torch.cuda.reset_peak_memory_stats()

    def peak_memory_mb(self) -> tuple[float, str]:
        """(peak MiB, what was measured): on CUDA the allocator's peak since the last run ended
        (``after_run`` resets it), elsewhere the worker process's peak resident set."""
        import resource

        import torch

        if _device_type(self.device) == "cuda" and torch.cuda.is_available():
            return torch.cuda.max_memory_allocated() / 2**20, "cuda_allocated"
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "process_rss"  # KiB on Linux

    @property
    def generator_loads(self) -> int:
        return self._adapter.generator_loads if self._adapter is not None else 0

    def weight_location(self) -> str:
        """Where the DiT is: 'released' before the first load, else the adapter's answer."""
        return self._adapter.generator_location() if self._adapter is not None else "released"

    def make_room(self, working_gib: float) -> str:
        """Weight tiering before a stack that needs ``working_gib`` beside the DiT; returns the stage.

        Keep the DiT where it is when the stack fits beside it, else stage it on the CPU when RAM
        holds it, else release it (ensure_generator brings it back before the next denoise).
        """
        from shotloom.admission import plan_tier

        adapter = self.adapter
        if adapter.generator_location() == "released":
            return stages.UNLOADING
        tier = plan_tier(
            MemoryEstimates.bytes(working_gib), adapter.generator_bytes(), self.probe, self.headroom
        )
        if tier == "stage_on_cpu":
            adapter.stage_generator_on_cpu()
        elif tier == "release":
            adapter.release_generator()
        return TIER_STAGES[tier]

    def prepare_generator(self, on_stage: OnStage = _quiet) -> None:
        """Before denoising: bring a staged or released DiT back (stage ``loading_generator``)."""
        adapter = self.adapter
        location = adapter.generator_location()
        if location == "released" or location not in ("offloaded", _device_type(self.device)):
            on_stage(stages.LOADING_GENERATOR)
            adapter.ensure_generator()

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
        num_inference_steps: int | None = None,
        negative_prompt: str | None = None,
        first_frame: Path | None = None,
        last_frame: Path | None = None,
        memory: list[MemorySlot] | tuple[MemorySlot, ...] = (),
        source_video: Path | None = None,
        strength: float | None = None,
        lora: str | None = None,
        lora_scale: float | None = None,
        guides: list[Guide] | tuple[Guide, ...] = (),
        step_cache: str | None = None,
    ) -> GenerationRequest:
        """Fill unset fields from the inference YAML (:func:`shotloom.request.resolve`)."""
        return resolve(
            self.cfg.defaults,
            self.cfg.sampler_for(lora),
            self.cfg.performance,
            prompt,
            width=width,
            height=height,
            num_frames=num_frames,
            fps=fps,
            seed=seed,
            guidance_scale=guidance_scale,
            num_inference_steps=num_inference_steps,
            negative_prompt=negative_prompt,
            first_frame=first_frame,
            last_frame=last_frame,
            memory=memory,
            source_video=source_video,
            strength=strength,
            lora=lora,
            lora_scale=lora_scale,
            guides=guides,
            step_cache=step_cache,
        )

    def check(self, req: GenerationRequest) -> GenerationRequest:
        """Refuse what the family cannot do (CapabilityError naming the field) or a missing input
        file; answers the request with its guides measured (``shotloom.guides.measured``)."""
        memory = [p for m in req.memory for p in (m.image, m.audio)]
        guides = [g.path for g in req.guides]
        for path in [req.first_frame, req.last_frame, req.source_video, *memory, *guides]:
            if path is not None and not Path(path).is_file():
                raise FileNotFoundError(f"input file not found: {path}")
        req = measured(req)
        self.adapter.check(req)
        if (parallel := group_config()) is not None:
            self.adapter.check_split(req, parallel)
        return req

    def condition(self, req: GenerationRequest, on_stage: OnStage = _quiet) -> tuple[TensorBundle, bool]:
        """Conditioning bundle from the cache, or from the encoders (then cached).

        A miss runs under a host-wide lock on the cache directory: one encoder stack works at a
        time across the device workers, and a worker that waited finds its twin's result cached.
        """
        on_stage(stages.CACHE_LOOKUP)
        key = conditioning_key(self.adapter.encoder_identity(), req, self.adapter.uses_negative(req))
        cached = self._cached(key)
        if cached is not None:
            return cached, True
        with self.cache.encode_lock():
            cached = self._cached(key)
            if cached is not None:
                return cached, True
            on_stage(self.make_room(self.cfg.memory.conditioning_gib))
            on_stage(stages.CONDITIONING)
            bundle = self.adapter.encode(req)
            bundle.meta["cache_key"] = key
            self.cache.put(key, bundle)
        return bundle, False

    def _cached(self, key: str) -> TensorBundle | None:
        cached = self.cache.get(key)
        if cached is not None:
            cached.meta["cache_key"] = key
        return cached

    def denoise(
        self,
        cond: TensorBundle,
        req: GenerationRequest,
        progress: Progress | None = None,
        on_stage: OnStage = _quiet,
    ):
        self.prepare_generator(on_stage)
        on_stage(stages.INFERRING)
        if self.group is not None:  # rank 0 of a device group: the other ranks run the same call
            self.group.send_denoise(cond, req)
            with self.group.denoising(progress) as step, self.adapter.using_adapter(req.lora, req.lora_scale):
                return self.adapter.denoise(cond, req, step)
        if group_config() is not None:  # another rank: steps as rank 0 says
            progress = group_progress(None)
        with self.adapter.using_adapter(req.lora, req.lora_scale):
            return self.adapter.denoise(cond, req, progress)

    def decode(
        self,
        latents: TensorBundle,
        req: GenerationRequest,
        progress: Progress | None = None,
        on_stage: OnStage = _quiet,
    ):
        self.make_room(self.cfg.memory.decode_gib)  # same tiering as conditioning, for the VAE
        on_stage(stages.DECODING)
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

    def generate(
        self,
        req: GenerationRequest,
        output: Path,
        progress: Progress | None = None,
        save_latents: Path | None = None,
    ):
        """The standalone path: every stage in this process, in order. ``save_latents``: also
        write the denoised latents there (safetensors: ``latents``, and ``audio_latents`` for a
        family that makes sound), for comparing runs or decoding elsewhere."""
        timings = StageTimings()
        with timings.stage("load"):
            self.adapter  # noqa: B018 - load weights before timing the stages
        with timings.stage("check"):
            req = self.check(req)
        with timings.stage("condition"):
            cond, hit = self.condition(req)
        with timings.stage("denoise"):
            latents = self.denoise(cond, req, progress)
        if save_latents is not None:
            save_latent_tensors(latents, save_latents)
        with timings.stage("decode"):
            decoded = self.decode(latents, req)
        with timings.stage("write"):
            info = self.write(decoded, req, output)
        return GenerationResult(
            output, req, hit, timings.seconds, media_summary(info), latents.meta.get("sampling", {})
        )


def save_latent_tensors(latents: TensorBundle, path: Path) -> None:
    """The denoised latents as the pipeline's ``output_type="latent"`` gives them (Wan VACE: without
    the reference images' leading frames, which the pipeline drops only when it decodes)."""
    from safetensors.torch import save_file

    tensors = {"latents": latents.tensors["video"].contiguous()}
    if "audio" in latents.tensors:
        tensors["audio_latents"] = latents.tensors["audio"].contiguous()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # One metadata key holding sorted JSON: safetensors writes several keys in hash order, so the
    # same latents would give different file bytes from run to run.
    meta = {k: latents.meta[k] for k in ("family", "pipeline", "seed") if k in latents.meta}
    save_file(tensors, str(path), metadata={"shotloom": json.dumps(meta, sort_keys=True, default=str)})


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


def _device_type(device: str) -> str:
    return device.partition(":")[0]


def _empty_device_cache() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def is_out_of_memory(exc: BaseException) -> bool:
    import torch

    return isinstance(exc, torch.OutOfMemoryError)


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
