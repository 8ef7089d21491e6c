"""Artifacts: the index of the files a job produced (paths relative to media_root), which the
HTTP routes answer from."""

from __future__ import annotations

import time
import uuid
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from api.core.records import ArtifactRecord, UnknownVersion
from api.store.engine import StoreEngine
from api.store.tables import Artifact, Job


def _artifact_record(row: Artifact) -> ArtifactRecord:
    return ArtifactRecord(
        artifact_id=row.artifact_id,
        version_id=row.version_id,
        work_id=row.work_id,
        shot_id=row.shot_id,
        kind=row.kind,
        role=row.role,
        path=row.path,
        url_path=row.url_path,
        bytes=row.bytes,
        sha256=row.sha256,
        created_at=row.created_at,
        metadata=dict(row.metadata_ or {}),
    )


def artifacts_of(s: Session, version_id: str) -> list[ArtifactRecord]:
    """A job's artifacts in the order they were recorded (read in the caller's session)."""
    rows = s.scalars(
        select(Artifact)
        .where(Artifact.version_id == version_id)
        .order_by(Artifact.created_at, Artifact.artifact_id)
    ).all()
    return [_artifact_record(a) for a in rows]


class ArtifactStore(StoreEngine):
    def add_artifact(
        self,
        version_id: str,
        *,
        kind: str,
        role: str,
        path: str,
        url_path: str,
        bytes: int | None = None,  # noqa: A002 - the column's name
        sha256: str | None = None,
        metadata: dict[str, Any] | None = None,
        work_id: str | None = None,
        shot_id: str | None = None,
        artifact_id: str | None = None,
    ) -> ArtifactRecord:
        """Index one produced file (``path`` relative to media_root). Idempotent per (version, path):
        recording the same file again returns the existing record. work_id/shot_id default to the job's."""
        try:
            with self._write() as s:
                job = s.get(Job, version_id)
                if job is None:
                    raise UnknownVersion(version_id)
                row = Artifact(
                    artifact_id=artifact_id or uuid.uuid4().hex,
                    version_id=version_id,
                    work_id=work_id if work_id is not None else job.work_id,
                    shot_id=shot_id if shot_id is not None else job.shot_id,
                    kind=kind,
                    role=role,
                    path=path,
                    url_path=url_path,
                    bytes=bytes,
                    sha256=sha256,
                    created_at=time.time(),
                    metadata_=metadata or {},
                )
                s.add(row)
                s.flush()
                return _artifact_record(row)
        except IntegrityError:
            with self._read() as s:
                existing = s.scalars(
                    select(Artifact).where(Artifact.version_id == version_id, Artifact.path == path)
                ).first()
                if existing is None:
                    raise
                return _artifact_record(existing)

    def get_artifact(self, artifact_id: str) -> ArtifactRecord | None:
        with self._read() as s:
            row = s.get(Artifact, artifact_id)
            return _artifact_record(row) if row is not None else None

    def artifacts_for(self, version_id: str) -> list[ArtifactRecord]:
        with self._read() as s:
            return artifacts_of(s, version_id)
