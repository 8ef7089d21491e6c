"""The POST a finished job's callback gets, built from the job as the store has it: by whoever
records the outcome (the tracker when a run ends, the job service when a queued job is cancelled),
in the same transaction (``Store.update_status(callback=...)``)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from api.core.records import JobRecord
from api.store import Store
from settings.api import ApiConfig

# The callback_context keys copied to the callback body's top level, where the Echo Director's
# receiver reads them to route the result back to its session (the context stays whole beside them).
CONTEXT_FIELDS = ("session_key", "channel", "chat_id")
# A job's status as its callback says it: the Director's two words (GET /version keeps the r2v
# spec's succeeded; a cancelled job is failed there too).
CALLBACK_STATUS = {"succeeded": "completed", "cancelled": "failed"}


def _urls(video_url: str | None) -> dict[str, str]:
    """The video's URL under the names the Director's receivers look for first."""
    return {"result_url": video_url, "artifact_url": video_url} if video_url else {}


def callback_payload(job: JobRecord, store: Store, api: ApiConfig) -> dict[str, Any]:
    """The one POST a job's callback gets (r2v spec "Callbacks and errors"), in the Echo Director's
    terms (its receivers answer 400 to any other status, so the outbox would retry a success until
    it gave up): ``status`` ``completed`` or ``failed`` (a cancelled job too), ``completed_at``, the
    video's URL as ``result_url`` and ``artifact_url`` beside ``video_url``; the context's
    :data:`CONTEXT_FIELDS` also at the top level ("callback_context: Object copied into supported
    callback context fields")."""
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
        "status": CALLBACK_STATUS.get(job.status, job.status),
        "status_url": f"{base}/version/{job.version_id}",
    }
    if job.finished_at is not None:
        finished = datetime.fromtimestamp(job.finished_at, UTC)
        payload["completed_at"] = finished.isoformat(timespec="seconds").replace("+00:00", "Z")
    if job.callback_context is not None:
        payload["callback_context"] = job.callback_context
        if isinstance(job.callback_context, dict):
            for key in CONTEXT_FIELDS:
                if key in job.callback_context:
                    payload.setdefault(key, job.callback_context[key])
    if job.status in ("failed", "cancelled"):
        payload["error"] = job.error or job.status
    elif job.kind == "merge":
        payload["result"] = {"video_url": video_url, **_urls(video_url), "artifacts": artifacts}
    else:
        payload.update(shot_id=job.shot_id, video_url=video_url, **_urls(video_url), artifacts=artifacts)
    if job.kind == "r2v" and "shot_id" not in payload:
        payload["shot_id"] = job.shot_id
    return payload
