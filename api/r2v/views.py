"""Response bodies built from store records, and the GET /version body cache.

GET /version is polled hard (bench/api.py runs 50 pollers in a loop) while the follower writes
status, stage, progress and worker figures of running jobs several times a second. A body
depends on its own job row and artifacts (the store's per-version stamp says when those
changed) and, while the job is queued, on its queue position (the store's queue generation
says when any job entered or left a queue). Positions come from one query per queue change
for all queues at once, so a job leaving the queue does not send every queued poller to the
database. :class:`VersionViews` runs on the event loop only: no locks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from api.r2v.protocol import ArtifactResponse, VersionResponse, iso_time
from api.store import ArtifactRecord, JobRecord, Store

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
    job: JobRecord, position: int | None, artifacts: list[ArtifactRecord], base: str
) -> VersionResponse:
    live = job.live or {}
    result = job.result or {}
    return VersionResponse(
        **task_fields(job, position, artifacts, base),
        error=job.error,
        video_url=result.get("video_url"),
        created_at=iso_time(job.created_at),
        updated_at=iso_time(job.updated_at),
        finished_at=iso_time(job.finished_at),
        run_id=job.run_id,
        stage_times=live.get("stage_times", {}),
        progress=live.get("progress"),
        worker=live.get("worker"),
        result=result or None,
        request={**job.request.get("client", {}), "inputs": job.request.get("inputs", {})},
    )


@dataclass(frozen=True)
class _View:
    stamp: int
    model: VersionResponse
    queued: bool


@dataclass(frozen=True)
class _Body:
    stamp: int
    queue_generation: int | None  # None: the body shows no queue position
    data: bytes


class VersionViews:
    def __init__(self, store: Store, base: str, max_entries: int = 10_000):
        self.store, self.base, self.max_entries = store, base, max_entries
        self._views: dict[str, _View] = {}
        self._bodies: dict[str, _Body] = {}
        self._positions: tuple[int, dict[str, int]] = (-1, {})

    def body(self, version_id: str) -> bytes | None:
        """The JSON body of GET /version/{version_id}; None for an unknown version."""
        # Stamps are read before the data: a write in between leaves a stale stamp on a fresh
        # body, which only costs one more rebuild.
        stamp = self.store.version_stamp(version_id)
        queue_generation = self.store.queue_generation
        cached = self._bodies.get(version_id)
        if (
            cached is not None
            and cached.stamp == stamp
            and cached.queue_generation in (None, queue_generation)
        ):
            return cached.data
        view = self._views.get(version_id)
        if view is None or view.stamp != stamp:
            got = self.store.job_view(version_id)
            if got is None:
                return None
            job, artifacts = got
            view = _View(stamp, version_response(job, None, artifacts, self.base), job.status == "queued")
            self._remember(self._views, version_id, view)
        model = view.model
        if view.queued:
            position = self._position(version_id, queue_generation)
            if position is None:  # it left the queue between the two reads: one consistent read
                fresh = self.store.version_view(version_id)
                if fresh is None:
                    return None
                return version_response(*fresh, self.base).model_dump_json().encode()
            model = model.model_copy(update={"queue_position": position})
        body = _Body(stamp, queue_generation if view.queued else None, model.model_dump_json().encode())
        self._remember(self._bodies, version_id, body)
        return body.data

    def _position(self, version_id: str, queue_generation: int) -> int | None:
        if self._positions[0] != queue_generation:
            self._positions = (queue_generation, self.store.queue_positions())
        return self._positions[1].get(version_id)

    def _remember(self, table: dict, key: str, value) -> None:
        if len(table) >= self.max_entries and key not in table:
            table.clear()
        table[key] = value
