"""A run's stages and progress, as the workers and ops write them and the API reads them back.

Two records of the same facts (see :mod:`contracts.tags` for the keys):

- hidden run tags, the latest values (the launcher, workers and tests read them through the
  instance): the current stage, when it last entered each stage, the latest progress;
- one run event per change (an engine event whose metadata carries the stage and the time, or the
  progress): the run page shows them in order, and GraphQL clients (the API) read them
  incrementally from the run's event log.

Stage names are the engine's (:mod:`shotloom.stages`); this module only says how they travel.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from contracts.tags import PROGRESS_TAG, STAGE_AT_PREFIX, STAGE_TAG
from shotloom.stages import ORDER

# Metadata labels of the run events that carry stages and progress.
STAGE_EVENT = "shotloom/stage"
AT_EVENT = "shotloom/at"
PROGRESS_EVENT = "shotloom/progress"


@dataclass(frozen=True)
class Progress:
    """How far a stage has come: ``done`` of ``total`` pieces (denoise steps, decoded tiles)."""

    stage: str
    done: int
    total: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.as_dict())

    @classmethod
    def from_json(cls, raw: str) -> Progress:
        data = json.loads(raw)
        return cls(stage=str(data["stage"]), done=int(data["done"]), total=int(data["total"]))


@dataclass(frozen=True)
class StageEvent:
    """What one run event told: a stage entered (at a unix time) and/or progress."""

    stage: str | None = None
    at: float | None = None
    progress: Progress | None = None


def stage_tags(stage: str, at: float | None = None) -> dict[str, str]:
    """Tags that move a run to ``stage`` (and stamp when)."""
    if stage not in ORDER:
        raise ValueError(f"unknown stage {stage!r}")
    return {STAGE_TAG: stage, STAGE_AT_PREFIX + stage: f"{time.time() if at is None else at:.3f}"}


def progress_tag(stage: str, done: int, total: int) -> dict[str, str]:
    return {PROGRESS_TAG: Progress(stage, done, total).to_json()}


def stage_times(tags: Mapping[str, str]) -> dict[str, float]:
    """{stage: unix time} from a run's tags, in the spec's order."""
    stamps = {k[len(STAGE_AT_PREFIX) :]: float(v) for k, v in tags.items() if k.startswith(STAGE_AT_PREFIX)}
    return {s: stamps[s] for s in ORDER if s in stamps}


def progress(tags: Mapping[str, str]) -> dict[str, Any] | None:
    """The latest progress a run's tags hold, as the job views show it."""
    raw = tags.get(PROGRESS_TAG)
    return Progress.from_json(raw).as_dict() if raw else None


def event_of(tags: Mapping[str, str]) -> StageEvent | None:
    """The run event that reports what ``tags`` change (None: no stage or progress among them)."""
    stage = tags.get(STAGE_TAG)
    at = tags.get(STAGE_AT_PREFIX + stage) if stage is not None else None
    raw = tags.get(PROGRESS_TAG)
    if stage is None and raw is None:
        return None
    return StageEvent(
        stage=stage,
        at=float(at) if at is not None else None,
        progress=Progress.from_json(raw) if raw is not None else None,
    )


def event_metadata(event: StageEvent) -> dict[str, str | float]:
    """The run event's metadata entries (label -> text or float) for ``event``."""
    metadata: dict[str, str | float] = {}
    if event.stage is not None:
        metadata[STAGE_EVENT] = event.stage
        if event.at is not None:
            metadata[AT_EVENT] = event.at
    if event.progress is not None:
        metadata[PROGRESS_EVENT] = event.progress.to_json()
    return metadata


def read_event(metadata: Mapping[str, Any]) -> StageEvent:
    """The stage and progress a run event's metadata (as GraphQL answers it) carries."""
    stage, at, raw = metadata.get(STAGE_EVENT), metadata.get(AT_EVENT), metadata.get(PROGRESS_EVENT)
    return StageEvent(
        stage=stage if isinstance(stage, str) else None,
        at=float(at) if isinstance(at, int | float) else None,
        progress=Progress.from_json(raw) if isinstance(raw, str) else None,
    )
