"""Where a run's stages and progress are recorded: hidden tags (read by the
launcher, workers and tests through the instance), and a run event per change (shown on the run
page, read incrementally by GraphQL clients). See :mod:`shotloom.stages`."""

from __future__ import annotations

from collections.abc import Mapping

from dagster import DagsterInstance, MetadataValue
from dagster._core.events import EngineEventData

from shotloom import stages


def record(
    instance: DagsterInstance, run_id: str, tags: Mapping[str, str], message: str | None = None
) -> None:
    """Add ``tags`` to the run; a stage change or progress among them is also reported as a run
    event (with ``message``, or one that says what changed)."""
    instance.add_run_tags(run_id, dict(tags))
    metadata: dict[str, MetadataValue] = {}
    stage = tags.get(stages.STAGE_TAG)
    if stage is not None:
        at = tags.get(stages.STAGE_AT_PREFIX + stage)
        metadata[stages.STAGE_EVENT] = MetadataValue.text(stage)
        if at is not None:
            metadata[stages.AT_EVENT] = MetadataValue.float(float(at))
    progress = tags.get(stages.PROGRESS_TAG)
    if progress is not None:
        metadata[stages.PROGRESS_EVENT] = MetadataValue.text(progress)
    if not metadata:
        return
    run = instance.get_run_by_id(run_id)
    if run is None:
        return
    if message is None:
        message = f"stage: {stage}" if stage is not None else f"progress: {progress}"
    instance.report_engine_event(message, run, EngineEventData(metadata=metadata))
