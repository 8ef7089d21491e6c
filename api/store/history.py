"""Reads over many jobs: a dialect's pages of jobs, what retention asks (finished jobs, their bytes,
whether a film still needs a shot), timing samples of recent shots, and the newest shot versions."""

from __future__ import annotations

from typing import Any, Literal

from sqlalchemy import func, select, tuple_

from api.store.engine import StoreEngine
from api.store.jobs import FINISHED, JobRecord, UnknownVersion, job_record, started_at
from api.store.tables import Artifact, Job


class HistoryStore(StoreEngine):
    def list_jobs(
        self,
        dialect: str,
        *,
        after: str | None = None,
        limit: int = 20,
        order: Literal["asc", "desc"] = "desc",
        finished_after: float | None = None,
    ) -> tuple[list[JobRecord], bool]:
        """One page of a dialect's jobs by creation time, after the job ``after`` (exclusive);
        and whether more follow. An unknown ``after`` raises :class:`UnknownVersion`."""
        with self._read() as s:
            q = select(Job).where(Job.dialect == dialect)
            if finished_after is not None:  # unfinished, or finished since (not expired)
                q = q.where(Job.finished_at.is_(None) | (Job.finished_at >= finished_after))
            key = tuple_(Job.created_at, Job.version_id)
            if after is not None:
                anchor = s.get(Job, after)
                if anchor is None or anchor.dialect != dialect:
                    raise UnknownVersion(after)
                mark = tuple_(anchor.created_at, anchor.version_id)
                q = q.where(key > mark if order == "asc" else key < mark)
            if order == "asc":
                q = q.order_by(Job.created_at, Job.version_id)
            else:
                q = q.order_by(Job.created_at.desc(), Job.version_id.desc())
            rows = s.scalars(q.limit(limit + 1)).all()
            return [job_record(r) for r in rows[:limit]], len(rows) > limit

    def finished_jobs(self, dialect: str, *, finished_before: float | None = None) -> list[JobRecord]:
        """A dialect's finished jobs, oldest finish first (optionally only those before a time)."""
        with self._read() as s:
            q = select(Job).where(
                Job.dialect == dialect, Job.status.in_(FINISHED), Job.finished_at.is_not(None)
            )
            if finished_before is not None:
                q = q.where(Job.finished_at < finished_before)
            rows = s.scalars(q.order_by(Job.finished_at, Job.version_id)).all()
            return [job_record(r) for r in rows]

    def output_bytes(self, dialect: str, version_id: str | None = None) -> int:
        """Bytes of the artifacts of a dialect's jobs (or of one job)."""
        with self._read() as s:
            q = select(func.coalesce(func.sum(Artifact.bytes), 0)).join(
                Job, Job.version_id == Artifact.version_id
            )
            q = q.where(Job.dialect == dialect)
            if version_id is not None:
                q = q.where(Job.version_id == version_id)
            return int(s.scalar(q) or 0)

    def merges_naming(self, version_id: str) -> bool:
        """Whether a merge job lists this version among its shots (the film needs its MP4)."""
        with self._read() as s:
            rows = s.scalars(select(Job.request).where(Job.kind == "merge")).all()
        for request in rows:
            shots = (request or {}).get("inputs", {}).get("shots", [])
            if any(shot.get("version_id") == version_id for shot in shots):
                return True
        return False

    def _newest_succeeded_shots(self, limit: int, *columns: Any) -> list[Any]:
        """``columns`` of the newest succeeded shots (R2V jobs), newest finish first."""
        with self._read() as s:
            return s.execute(
                select(*columns)
                .where(Job.kind == "r2v", Job.status == "succeeded", Job.finished_at.is_not(None))
                .order_by(Job.finished_at.desc())
                .limit(limit)
            ).all()

    def recent_durations(self, limit: int) -> list[float]:
        """Wall seconds from claim (or submission) to end of the newest succeeded shots."""
        out = []
        for finished, submitted, live in self._newest_succeeded_shots(
            limit, Job.finished_at, Job.submitted_at, Job.live
        ):
            start = started_at(live) or submitted
            if start is not None and finished >= start:
                out.append(finished - start)
        return out

    def recent_stage_times(self, limit: int) -> list[tuple[dict[str, float], float, dict[str, Any]]]:
        """(stage_times, finished_at, result) of the newest succeeded shots that recorded stage
        times (the result: what their runs recorded, e.g. the steps and guidance they sampled)."""
        out = []
        for live, finished, result in self._newest_succeeded_shots(
            limit, Job.live, Job.finished_at, Job.result
        ):
            times = (live or {}).get("stage_times") or {}
            if times:
                out.append(({k: float(v) for k, v in times.items()}, finished, result or {}))
        return out

    def latest_shots(self, work_ids: list[str] | None, shot_ids: list[str] | None) -> list[JobRecord]:
        """The newest successful version of every shot (R2V and /v1 videos; not images or films),
        optionally only of some works and shots, in (work, shot) order."""
        with self._read() as s:
            query = select(Job).where(Job.kind == "r2v", Job.status == "succeeded", Job.dialect != "images")
            if work_ids is not None:
                query = query.where(Job.work_id.in_(work_ids))
            if shot_ids is not None:
                query = query.where(Job.shot_id.in_(shot_ids))
            newest: dict[tuple[str, str], Job] = {}
            for row in s.scalars(query.order_by(Job.finished_at, Job.created_at)).all():
                newest[(row.work_id, row.shot_id or "")] = row  # later rows win
            return [job_record(newest[k]) for k in sorted(newest)]

    def newest_succeeded_shot(self, work_id: str, shot_id: str) -> JobRecord | None:
        """The newest successful R2V job for ``(work_id, shot_id)`` (a memory slot's ``shot_id``)."""
        with self._read() as s:
            row = s.scalars(
                select(Job)
                .where(
                    Job.kind == "r2v",
                    Job.work_id == work_id,
                    Job.shot_id == shot_id,
                    Job.status == "succeeded",
                )
                .order_by(Job.finished_at.desc().nulls_last(), Job.created_at.desc())
                .limit(1)
            ).first()
            return job_record(row) if row is not None else None
