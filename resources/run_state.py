"""Where a run's stages and progress are recorded: hidden tags (read by the
launcher, workers and tests through the instance), and a run event per change (shown on the run
page, read incrementally by GraphQL clients). The wire format is :mod:`contracts.events`."""

from __future__ import annotations

from collections.abc import Mapping

from dagster import DagsterInstance, MetadataValue
from dagster._core.events import EngineEventData

from contracts import events
from contracts.tags import PROGRESS_TAG


def record(
    instance: DagsterInstance, run_id: str, tags: Mapping[str, str], message: str | None = None
) -> None:
    """Add ``tags`` to the run; a stage change or progress among them is also reported as a run
    event (with ``message``, or one that says what changed)."""
    instance.add_run_tags(run_id, dict(tags))
    event = events.event_of(tags)
    if event is None:
        return
    run = instance.get_run_by_id(run_id)
    if run is None:
        return
    metadata = {
        label: MetadataValue.float(value) if isinstance(value, float) else MetadataValue.text(value)
        for label, value in events.event_metadata(event).items()
    }
    if message is None:
        if event.stage is not None:
            message = f"stage: {event.stage}"
        else:
            message = f"progress: {tags[PROGRESS_TAG]}"
    instance.report_engine_event(message, run, EngineEventData(metadata=metadata))
