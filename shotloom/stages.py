"""Job stages and the run tags that carry them (the r2v spec's "Task state").

Stages are written as Dagster run tags so a GraphQL client reads them with the
run itself (one cheap query), never by scanning the event log:

    shotloom/stage                 the current stage
    shotloom/stage_at/<stage>      unix time (seconds, 3 decimals) the run last entered <stage>
    shotloom/progress              JSON {"stage", "done", "total"}: denoise step i of N, decoded piece j of M
    shotloom/admission_plan        JSON of the worker's admission plan for this run

Pure constants and helpers: the API, the daemon and the ops all import this.
"""

from __future__ import annotations

import json
import time

STAGE_TAG = "shotloom/stage"
VERSION_TAG = "shotloom/version_id"  # the service version a run makes (set by the API on every run)
STAGE_AT_PREFIX = "shotloom/stage_at/"
PROGRESS_TAG = "shotloom/progress"
ADMISSION_TAG = "shotloom/admission_plan"

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
