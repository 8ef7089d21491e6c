"""Callbacks: the one POST a finished job's ``callback_url`` gets, through the store's durable outbox
(queued in the same process that records the outcome, delivered with exponential backoff)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import httpx

from api.core.records import JobRecord
from api.store import Store, backoff_delay
from settings.api import ApiConfig

log = logging.getLogger("shotloom.api")
DELIVERY_HEADER = "X-Shotloom-Delivery-Id"
IDLE_S = 0.5  # between looks at the outbox


class Callbacks:
    def __init__(self, store: Store, api: ApiConfig, stopping: threading.Event):
        self.store = store
        self.api = api
        self.stopping = stopping
        self.delivered = 0

    def enqueue(self, job: JobRecord) -> None:
        """Queue ``job``'s callback (if it asked for one) for its outcome as recorded now."""
        if job.callback_url:
            self.store.enqueue_callback(
                job.version_id, job.callback_url, callback_payload(job, self.store, self.api)
            )

    def loop(self) -> None:
        with httpx.Client(timeout=self.api.callback_timeout_seconds) as client:
            while not self.stopping.is_set():
                try:
                    self.deliver(client)
                except Exception as exc:
                    log.warning("callbacks: %s", exc)
                self.stopping.wait(IDLE_S)

    def deliver(self, client: httpx.Client) -> None:
        for d in self.store.due_callbacks():
            if self.stopping.is_set():
                return
            try:
                resp = client.post(d.url, json=d.payload, headers={DELIVERY_HEADER: d.delivery_id})
                ok, error = resp.is_success, f"HTTP {resp.status_code}"
            except httpx.HTTPError as exc:
                ok, error = False, f"{type(exc).__name__}: {exc}"
            attempts = d.attempts + 1
            limit = self.api.callback_max_attempts
            if ok:
                self.store.record_attempt(d.delivery_id, True)
                self.delivered += 1
            elif limit and attempts >= limit:
                self.store.record_attempt(d.delivery_id, False, error)
                log.warning(
                    "callback %s for %s gave up after %d attempts: %s",
                    d.delivery_id,
                    d.version_id,
                    attempts,
                    error,
                )
            else:
                delay = backoff_delay(attempts, self.api.callback_backoff_seconds)
                self.store.record_attempt(d.delivery_id, False, error, time.time() + delay)


def callback_payload(job: JobRecord, store: Store, api: ApiConfig) -> dict[str, Any]:
    """The one POST a job's callback gets (r2v spec "Callbacks and errors")."""
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
    if job.status in ("failed", "cancelled"):
        payload["error"] = job.error or job.status
    elif job.kind == "merge":
        payload["result"] = {"video_url": video_url, "artifacts": artifacts}
    else:
        payload.update(shot_id=job.shot_id, video_url=video_url, artifacts=artifacts)
    if job.kind == "r2v" and "shot_id" not in payload:
        payload["shot_id"] = job.shot_id
    return payload
