"""R2V response bodies built from store records, and the cached GET /version bodies."""

from __future__ import annotations

from typing import Any

from api.core.records import ArtifactRecord, JobLive, JobRecord
from api.core.sampling import RuleFor, job_sampling
from api.core.steps import first_run_id
from api.core.views import JobViews, ViewStore
from api.r2v.protocol import ArtifactResponse, VersionResponse, iso_time

# The r2v spec knows four statuses: a cancelled job (OpenAI dialect DELETE) reads as failed there.
R2V_STATUS = {"cancelled": "failed"}


def artifact_response(art: ArtifactRecord, base: str) -> ArtifactResponse:
    return ArtifactResponse(
        artifact_id=art.artifact_id,
        version_id=art.version_id,
        work_id=art.work_id,
        shot_id=art.shot_id,
        kind=art.kind,
        role=art.role,
        url=base + art.url_path,
        bytes=art.bytes,
        sha256=art.sha256,
        created_at=iso_time(art.created_at),
        metadata=art.metadata,
    )


def task_fields(
    job: JobRecord, position: int | None, artifacts: list[ArtifactRecord], base: str
) -> dict[str, Any]:
    return {
        "kind": job.kind,
        "task_id": job.version_id,
        "version_id": job.version_id,
        "remote_task_id": job.version_id,
        "work_id": job.work_id,
        "job_id": job.job_id,
        "shot_id": job.shot_id,
        "status": R2V_STATUS.get(job.status, job.status),
        "stage": job.stage,
        "queue_position": position,
        "status_url": f"{base}/version/{job.version_id}",
        "artifacts": [artifact_response(a, base) for a in artifacts],
    }


def version_response(
    job: JobRecord,
    position: int | None,
    artifacts: list[ArtifactRecord],
    base: str,
    sampling_for: RuleFor | None = None,
) -> VersionResponse:
    live = job.live or JobLive()
    result = job.result
    sampling = (job_sampling(job, sampling_for) if sampling_for is not None else None) or {}
    return VersionResponse(
        **task_fields(job, position, artifacts, base),
        error=job.error,
        video_url=result.video_url(base) if result else None,
        created_at=iso_time(job.created_at),
        updated_at=iso_time(job.updated_at),
        finished_at=iso_time(job.finished_at),
        run_id=first_run_id(job),
        stage_times=live.stage_times,
        progress=live.progress,
        worker=live.worker,
        result=result.rendered(base) if result else None,
        request={**job.request.client, "inputs": job.request.inputs},
        num_inference_steps=sampling.get("num_inference_steps"),
        guidance_scale=sampling.get("guidance_scale"),
        sampler_mode=sampling.get("mode"),
        step_cache=sampling.get("step_cache"),
        **version_lineage(job),
    )


def version_lineage(job: JobRecord) -> dict[str, Any]:
    """``inputs`` and ``derived_from`` of a version, as it asked (what the run records on its
    materializations too)."""
    shot, merge = job.request.shot, job.request.merge
    if shot is not None and shot.lineage:
        lineage = shot.lineage
        return {"inputs": lineage.get("inputs", {}), "derived_from": lineage.get("derived_from", [])}
    versions = merge.versions if merge is not None else []
    inputs = {
        f"shots[{i}]": {"sha256": v.split(":", 1)[1]} if v.startswith("sha256:") else {"version_id": v}
        for i, v in enumerate(versions)
    }
    return {"inputs": inputs, "derived_from": [v for v in versions if not v.startswith("sha256:")]}


def version_views(
    store: ViewStore, base: str, max_entries: int, sampling_for: RuleFor | None = None
) -> JobViews[bytes]:
    """The cached GET /version bodies (see :mod:`api.core.views`); ``sampling_for``: the sampling
    rule of a shot's adapter (or none), for the steps, guidance and step cache of a shot not yet
    finished."""

    def render(job: JobRecord, artifacts: list[ArtifactRecord], position: int | None) -> bytes:
        return version_response(job, position, artifacts, base, sampling_for).model_dump_json().encode()

    return JobViews(store, render, max_entries)
