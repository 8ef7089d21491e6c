"""The POST a finished job's callback gets, built from the job as the store has it: by whoever
records the outcome (the tracker when a run ends, the job service when a queued job is cancelled),
in the same transaction (``Store.update_status(callback=...)``)."""

from __future__ import annotations

from typing import Any

from api.core.records import JobRecord
from api.store import Store
from settings.api import ApiConfig

# The callback_context keys copied to the callback body's top level, where the Echo Director's
# receiver reads them to route the result back to its session (the context stays whole beside them).
CONTEXT_FIELDS = ("session_key", "channel", "chat_id")


def callback_payload(job: JobRecord, store: Store, api: ApiConfig) -> dict[str, Any]:
    """The one POST a job's callback gets (r2v spec "Callbacks and errors"): the context's
    :data:`CONTEXT_FIELDS` are also copied to the top level ("callback_context: Object copied into
    supported callback context fields")."""
    base = api.base_url()
    video_url = job.result.video_url(base) if job.result else None
    artifacts = [
        {"artifact_id": a.artifact_id, "url": base + a.url_path, "role": a.role, "sha256": a.sha256}
        for a in store.artifacts_for(job.version_id)
    ]
    payload: dict[str, Any] = {
        "kind": job.kind,
        "work_id": job.work_id,
        "job_id": job.job_id,
        "remote_task_id": job.version_id,
        "task_id": job.version_id,
        "version_id": job.version_id,
        "status": "failed" if job.status == "cancelled" else job.status,  # the r2v spec's four
        "status_url": f"{base}/version/{job.version_id}",
    }
    if job.callback_context is not None:
        payload["callback_context"] = job.callback_context
        if isinstance(job.callback_context, dict):
            for key in CONTEXT_FIELDS:
                if key in job.callback_context:
                    payload.setdefault(key, job.callback_context[key])
    if job.status in ("failed", "cancelled"):
        payload["error"] = job.error or job.status
    elif job.kind == "merge":
        payload["result"] = {"video_url": video_url, "artifacts": artifacts}
    else:
        payload.update(shot_id=job.shot_id, video_url=video_url, artifacts=artifacts)
    if job.kind == "r2v" and "shot_id" not in payload:
        payload["shot_id"] = job.shot_id
    return payload
