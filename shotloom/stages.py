"""Job stages and where a run keeps them (the r2v spec's "Task state").

An operator filters runs by a few visible tags; everything else a run records about its progress
is for reading, not filtering, and stays out of the UI's tag lists (tags under Dagster's hidden
prefix ``.dagster/`` are kept with the run but never listed, in the UI or over GraphQL):

    .dagster/shotloom.stage                 the current stage
    .dagster/shotloom.stage_at.<stage>      unix time the run last entered <stage>
    .dagster/shotloom.progress              JSON {"stage", "done", "total"}
    .dagster/shotloom.admission_plan        JSON of the worker's admission plan for this run

Every stage change and progress report is also a run event (an engine event whose metadata
carries ``shotloom/stage`` + ``shotloom/at``, or ``shotloom/progress``): the run page shows them in
order, and GraphQL clients (the API) read them incrementally from the run's event log.

Pure constants and helpers: the API, the daemon and the ops all import this.
"""

from __future__ import annotations

import json
import time

VERSION_TAG = "shotloom/version_id"  # the service version a run makes (set by the API on every run)
# Dagster's prefix for tags it keeps but never lists (one '/' per key: Dagster's tag key rule).
HIDDEN = ".dagster/shotloom."
STAGE_TAG = HIDDEN + "stage"  # hidden: a run's stage changes; the Dagster UI filters by status
STAGE_AT_PREFIX = HIDDEN + "stage_at."
PROGRESS_TAG = HIDDEN + "progress"
ADMISSION_TAG = HIDDEN + "admission_plan"
# Metadata labels of the run events that carry stages and progress.
STAGE_EVENT = "shotloom/stage"
AT_EVENT = "shotloom/at"
PROGRESS_EVENT = "shotloom/progress"

QUEUED = "queued"
CLAIMED = "claimed"
WAITING_FOR_MEMORY = "waiting_for_memory"
RECOVERED = "recovered"
VALIDATING = "validating"
CACHE_LOOKUP = "conditioning_cache_lookup"
KEEPING_ON_GPU = "keeping_generator_on_gpu"
STAGING_ON_CPU = "staging_generator_on_cpu"
UNLOADING = "unloading_for_conditioning"
CONDITIONING = "conditioning"
LOADING_GENERATOR = "loading_generator"
INFERRING = "inferring"
DECODING = "decoding"
WRITING = "writing"
MERGING = "merging"
SUCCEEDED = "succeeded"
FAILED = "failed"
CANCELED = "canceled"

# Order of the spec's diagram (the weight-tier stages are alternatives of one another).
ORDER = (
    QUEUED,
    CLAIMED,
    WAITING_FOR_MEMORY,
    RECOVERED,
    VALIDATING,
    CACHE_LOOKUP,
    KEEPING_ON_GPU,
    STAGING_ON_CPU,
    UNLOADING,
    CONDITIONING,
    LOADING_GENERATOR,
    INFERRING,
    DECODING,
    WRITING,
    MERGING,
    SUCCEEDED,
    FAILED,
    CANCELED,
)
TERMINAL = (SUCCEEDED, FAILED, CANCELED)


def stage_tags(stage: str, at: float | None = None) -> dict[str, str]:
    """Tags that move a run to ``stage`` (and stamp when)."""
    if stage not in ORDER:
        raise ValueError(f"unknown stage {stage!r}")
    return {STAGE_TAG: stage, STAGE_AT_PREFIX + stage: f"{time.time() if at is None else at:.3f}"}


def progress_tag(stage: str, done: int, total: int) -> dict[str, str]:
    return {PROGRESS_TAG: json.dumps({"stage": stage, "done": done, "total": total})}


def stage_times(tags: dict[str, str]) -> dict[str, float]:
    """{stage: unix time} from a run's tags, in the spec's order."""
    stamps = {k[len(STAGE_AT_PREFIX) :]: float(v) for k, v in tags.items() if k.startswith(STAGE_AT_PREFIX)}
    return {s: stamps[s] for s in ORDER if s in stamps}


def progress(tags: dict[str, str]) -> dict | None:
    raw = tags.get(PROGRESS_TAG)
    return json.loads(raw) if raw else None
