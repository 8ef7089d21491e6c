"""The r2v op graph; reads like a pipeline: condition -> denoise -> decode -> write.

Each op takes the previous stage's bundle (persisted as safetensors), so a retry
re-executes only unfinished steps. The model runtime is a process-level handle:
on a device worker every run reuses the same loaded weights.
"""

import time
from contextlib import contextmanager
from pathlib import Path

from dagster import (
    AssetMaterialization,
    Failure,
    In,
    OpExecutionContext,
    Out,
    Output,
    RetryRequested,
    op,
)

from contracts import events
from contracts.outputs import ShotOutput
from contracts.runs import ShotConfig
from contracts.tags import VERSION_TAG
from ops.assets import SHOT_KEY, register_shot_partition
from ops.types import ConditioningBundle, DecodedBundle, LatentsBundle, ShotArtifact
from resources import run_state
from resources.media_store import MediaStoreResource
from resources.model_runtime import ModelRuntimeResource
from shotloom import stages
from shotloom.capabilities import CapabilityError
from shotloom.request import GenerationRequest, Guide, MemorySlot

PROGRESS_TAG_INTERVAL_S = 0.5  # progress tags are DB writes: at most two a second (plus the last)


def _request(bundle) -> GenerationRequest:
    return GenerationRequest.from_json(bundle.meta["request"])


def _stage(context: OpExecutionContext):
    """on_stage callback: the run's stage (its tag, and a run event with the time)."""

    def enter(stage: str) -> None:
        run_state.record(context.instance, context.run_id, events.stage_tags(stage))

    return enter


def _progress(context: OpExecutionContext, stage: str, what: str):
    """progress(done, total): logged, and kept as the run's progress (tag and event, throttled)."""
    last = 0.0

    def report(done: int, total: int) -> None:
        nonlocal last
        context.log.debug(f"{what} {done}/{total}")
        now = time.monotonic()
        if done >= total or now - last >= PROGRESS_TAG_INTERVAL_S:
            run_state.record(context.instance, context.run_id, events.progress_tag(stage, done, total))
            last = now

    return report


@contextmanager
def _oom_guard(context: OpExecutionContext, rt):
    """Out of memory: release every weight and retry the step once; then fail clearly."""
    from shotloom.runtime import is_out_of_memory

    try:
        yield
    except Exception as exc:
        if not is_out_of_memory(exc):
            raise
        rt.release()
        if context.retry_number < 1:
            context.log.warning(f"out of memory ({exc}); released all weights, retrying once")
            raise RetryRequested(max_retries=1) from exc
        raise Failure(
            description=f"out of memory again after releasing all weights and retrying once: {exc}",
            allow_retries=False,
        ) from exc


def _timed(meta: dict, stage: str, start: float) -> dict:
    return {**meta.get("timings", {}), stage: round(time.perf_counter() - start, 4)}


@op(out=Out(ConditioningBundle), tags={"stage": "conditioning"})
def condition_op(
    context: OpExecutionContext,
    config: ShotConfig,
    runtime: ModelRuntimeResource,
    media: MediaStoreResource,
):
    """Check the request against the family's capabilities, then cache lookup or encode."""
    start = time.perf_counter()
    on_stage = _stage(context)
    on_stage(stages.VALIDATING)
    rt = runtime.get()

    def path(value: str | None) -> Path | None:
        if value is None:
            return None
        p = Path(value)
        return p if p.is_absolute() else media.resolve(value)

    req = rt.resolve(
        config.prompt,
        width=config.width,
        height=config.height,
        num_frames=config.num_frames,
        fps=config.fps,
        seed=config.seed,
        guidance_scale=config.guidance_scale,
        num_inference_steps=config.num_inference_steps,
        step_cache=config.step_cache,
        negative_prompt=config.negative_prompt,
        first_frame=path(config.first_frame),
        last_frame=path(config.last_frame),
        memory=[MemorySlot(path(m.image), path(m.audio)) for m in config.memory],
        source_video=path(config.source_video),
        strength=config.strength,
        lora=config.lora,
        lora_scale=config.lora_scale,
        guides=[Guide(path(g.path), g.frame, g.kind, g.with_audio) for g in config.guides],
    )
    try:
        req = rt.check(req)  # with its guides measured
    except (CapabilityError, FileNotFoundError) as exc:
        # The request itself is wrong: fail clearly and never retry it.
        raise Failure(
            description=str(exc), metadata={"field": getattr(exc, "field", "input")}, allow_retries=False
        ) from exc
    with _oom_guard(context, rt):
        bundle, hit = rt.condition(req, on_stage)
    bundle.meta.update(
        kind="conditioning",
        request=req.to_json(),
        work_id=config.work_id,
        shot_id=config.shot_id,
        cache_hit=hit,
        lineage=config.lineage,
    )
    bundle.meta["timings"] = _timed({}, "condition", start)
    context.log.info(f"conditioning cache {'hit' if hit else 'miss'} ({bundle.meta['cache_key'][:12]})")
    return bundle


@op(ins={"cond": In(ConditioningBundle)}, out=Out(LatentsBundle), tags={"stage": "inferring"})
def denoise_op(context: OpExecutionContext, cond, runtime: ModelRuntimeResource):
    start = time.perf_counter()
    rt = runtime.get()
    with _oom_guard(context, rt):
        progress = _progress(context, stages.INFERRING, "denoise step")
        latents = rt.denoise(cond, _request(cond), progress, _stage(context))
    latents.meta.update({k: v for k, v in cond.meta.items() if k not in ("kind", "timings")})
    latents.meta.update(kind="latents", timings=_timed(cond.meta, "denoise", start))
    return latents


@op(ins={"latents": In(LatentsBundle)}, out=Out(DecodedBundle), tags={"stage": "decoding"})
def decode_op(context: OpExecutionContext, latents, runtime: ModelRuntimeResource):
    from shotloom.runtime import decoded_to_bundle

    start = time.perf_counter()
    req = _request(latents)
    rt = runtime.get()
    with _oom_guard(context, rt):
        progress = _progress(context, stages.DECODING, "decoded piece")
        decoded = rt.decode(latents, req, progress, _stage(context))
    bundle = decoded_to_bundle(decoded, req)
    bundle.meta.update({k: v for k, v in latents.meta.items() if k not in ("kind", "timings", "request")})
    bundle.meta["timings"] = _timed(latents.meta, "decode", start)
    return bundle


@op(ins={"decoded": In(DecodedBundle)}, out=Out(ShotArtifact), tags={"stage": "writing"})
def write_op(context: OpExecutionContext, decoded, runtime: ModelRuntimeResource, media: MediaStoreResource):
    """Write the MP4 and record it as a materialization of the shot asset (``path``). Its stills
    are made by the shot_stills job on a media worker, after this run gave its device back."""
    from shotloom.runtime import bundle_to_decoded, media_summary

    start = time.perf_counter()
    _stage(context)(stages.WRITING)
    rt = runtime.get()
    req = _request(decoded)
    work_id, shot_id = decoded.meta["work_id"], decoded.meta["shot_id"]
    output = media.shot_path(work_id, shot_id, context.run_id)
    frames = bundle_to_decoded(decoded)
    summary = media_summary(rt.write(frames, req, output))
    timings = _timed(decoded.meta, "write", start)
    peak_mb, peak_kind = rt.peak_memory_mb()
    sampling = decoded.meta.get("sampling", {})
    lineage = decoded.meta.get("lineage", {})
    artifact = ShotArtifact(
        work_id=work_id,
        shot_id=shot_id,
        path=media.relative(output),
        seed=req.seed,
        checkpoint=rt.checkpoint_id,
        timings=timings,
        **{
            k: summary[k]
            for k in ("bytes", "sha256", "frames", "fps", "width", "height", "duration_s", "has_audio")
        },
    )
    partition = register_shot_partition(context.instance, work_id, shot_id)
    yield AssetMaterialization(
        asset_key=SHOT_KEY,
        partition=partition,
        description=req.prompt[:200],
        metadata=ShotOutput(
            **{k: v for k, v in artifact.__dict__.items() if k != "timings"},
            size=f"{artifact.width}x{artifact.height}",
            cache_hit=bool(decoded.meta.get("cache_hit")),
            # How it was sampled: the sampler's mode, the steps and guidance it ran.
            sampler=sampling,
            num_inference_steps=int(sampling.get("steps") or 0),
            guidance_scale=float(sampling.get("guidance_scale", req.guidance_scale)),
            step_cache=(sampling.get("step_cache") or {}).get("name", "none"),
            stage_timings=timings,
            peak_memory_mb=round(peak_mb, 1),
            version_id=context.run.tags.get(VERSION_TAG, ""),
            inputs=lineage.get("inputs", {}),
            derived_from=lineage.get("derived_from", []),
            adapter=lineage.get("adapter") or "",
            peak_memory_kind=peak_kind,
            spritesheet_count=rt.cfg.defaults.spritesheet_frames,
        ).to_metadata(),
    )
    yield Output(artifact)
