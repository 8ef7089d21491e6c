"""How long jobs take, from the stage times their runs stamp (``live["stage_times"]``, unix time
each stage was entered): each stage's duration, the median of each stage over earlier jobs, a
job's time spent working (not waiting), and from the medians a job's ETA. Pure: no store, no clock
unless given."""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any

from shotloom import stages

# Stages that are waits, not work: the queue, and a claimed run waiting for device memory.
WAITING = frozenset({stages.QUEUED, stages.WAITING_FOR_MEMORY})


def stage_durations(stage_times: Mapping[str, float], end: float | None) -> dict[str, float]:
    """{stage: seconds} of the stages a run went through, in the order it entered them: each
    lasts until the next began, the last until ``end`` (when the job finished; a stage still
    running, with no ``end``, is left out). Terminal stages take no time."""
    ordered = sorted(stage_times.items(), key=lambda item: item[1])  # stable: ties keep ORDER
    out: dict[str, float] = {}
    for (stage, at), nxt in zip(ordered, [*ordered[1:], (None, end)], strict=False):
        until = nxt[1]
        if until is not None and stage not in stages.TERMINAL:
            out[stage] = round(max(0.0, until - at), 3)
    return out


def working_seconds(durations: Mapping[str, float]) -> float:
    """The time a job was worked on (what ``X-Inference-Time-S`` reports): every stage's
    duration but the waits (:data:`WAITING`)."""
    return sum(seconds for stage, seconds in durations.items() if stage not in WAITING)


def stage_medians(samples: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The median duration of each stage over earlier jobs' ``stage_durations``, a job that
    skipped a stage counting 0 for it (the alternatives of the weight tier, a cache hit that skips
    conditioning, a wait for memory that most jobs never have): summing the medians of the stages
    still ahead does not count alternatives twice. {} with no samples."""
    if not samples:
        return {}
    seen = {stage for sample in samples for stage in sample}
    return {
        stage: statistics.median(sample.get(stage, 0.0) for sample in samples)
        for stage in (*stages.ORDER, *sorted(seen - set(stages.ORDER)))
        if stage in seen
    }


def eta_s(
    status: str,
    stage: str,
    live: Mapping[str, Any] | None,
    medians: Mapping[str, float],
    *,
    position: int | None = None,
    devices: int = 1,
    whole_s: float | None = None,
    now: float | None = None,
) -> float | None:
    """Seconds a job still expects to take, from the per-stage medians of earlier jobs:

    - queued: the stages of a whole job, times the rounds of the queue ahead of it
      (``position`` among ``devices`` workers);
    - running: the medians of the stages after the current one, plus what is left of the current
      one: its median times the fraction its progress report (step i of N, piece j of M) has
      not done, or without a report, its median less the time since the job entered it;
    - succeeded: 0; failed, cancelled: None.

    Before any earlier job recorded its stage times, ``whole_s`` (the median whole-job time)
    less the time since the job was claimed stands in; None without either."""
    if status == "succeeded":
        return 0.0
    if status not in ("queued", "running"):
        return None
    now = time.time() if now is None else now
    live = live or {}
    times: Mapping[str, float] = live.get("stage_times") or {}
    rounds = 1 + ((position or 1) - 1) // max(1, devices)
    work = {s: v for s, v in medians.items() if s != stages.QUEUED}
    if not work:
        if whole_s is None:
            return None
        if status == "queued":
            return round(whole_s * rounds, 1)
        started = min((t for s, t in times.items() if s != stages.QUEUED), default=None)
        return round(max(0.0, whole_s - (now - started if started else 0.0)), 1)
    if status == "queued":
        return round(sum(work.values()) * rounds, 1)
    if stage in stages.TERMINAL:
        return 0.0
    rank = {s: i for i, s in enumerate(stages.ORDER)}
    here = rank.get(stage, rank[stages.QUEUED])  # an unknown stage: count every stage as ahead
    ahead = sum(v for s, v in work.items() if rank.get(s, -1) > here)
    median_here = work.get(stage, 0.0)
    report = live.get("progress") or {}
    total = report.get("total") or 0
    if report.get("stage") == stage and total > 0:
        done = min(max(0, report.get("done", 0)), total)
        left_here = median_here * (1 - done / total)
    else:
        entered = times.get(stage)
        left_here = max(0.0, median_here - (now - entered)) if entered is not None else median_here
    return round(ahead + left_here, 1)
