"""The runs a job is made of, in order: its first run (a generation on a device worker, or a merge)
and the follow-ups the follower submits when the run before succeeds: media work (a shot's stills,
an extension's stitching) on a media worker, so a device slot is held only while the model works.

A follow-up is stored with the job's request (``request.then``), its op config completed with
the shot the previous run wrote. Each run carries the job's version tag and its step number."""

from __future__ import annotations

import copy
from typing import Any

from api.core.records import FollowUp, JobRecord
from contracts.runs import MERGE_OP, STILLS_OP, MergeConfig, StillsConfig, run_config

R2V_JOB = "r2v"
STILLS_JOB = "shot_stills"
MERGE_JOB = "merge"
FOLLOW_UP_CONFIGS = {STILLS_OP: StillsConfig, MERGE_OP: MergeConfig}  # the ops a follow-up runs


def stills_step(work_id: str, shot_id: str) -> FollowUp:
    """The thumbnail and spritesheet of the shot just written."""
    return FollowUp(
        job_name=STILLS_JOB,
        op=STILLS_OP,
        config={"work_id": work_id, "shot_id": shot_id},
        from_shot={"video": "path", "spritesheet_frames": "spritesheet_count"},
    )


def stitch_step(config: dict[str, Any]) -> FollowUp:
    """An extension: its source clips, then the shot just written, merged into one film (with its
    own stills). ``config`` is merge_op's (work_id, inputs, shot_ids, versions) before the shot."""
    return FollowUp(
        job_name=MERGE_JOB,
        op=MERGE_OP,
        config=config,
        append_shot={"inputs": "path", "shot_ids": "shot_id", "versions": "version_id"},
    )


def follow_ups(job: JobRecord) -> list[FollowUp]:
    """The job's follow-up runs. A shot accepted by an earlier release (whose device run made the
    stills itself) has none listed: it gets the stills step, which its run no longer makes."""
    if job.request.then is not None:
        return list(job.request.then)
    if job.request.job_name == R2V_JOB and job.shot_id:
        return [stills_step(job.work_id, job.shot_id)]
    return []


def follow_up_run(step: FollowUp, shot: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(job name, run config) of a follow-up, its config completed from ``shot``: the previous run's
    video (``path``, its materialization metadata, ``shot_id`` and ``version_id``)."""
    config = copy.deepcopy(step.config)
    for field, key in step.from_shot.items():
        if shot.get(key) is not None:
            config[field] = shot[key]
    for field, key in step.append_shot.items():
        config[field] = [*config.get(field, []), shot[key]]
    return step.job_name, run_config(**{step.op: FOLLOW_UP_CONFIGS[step.op].model_validate(config)})


def extension_before_frames(job: JobRecord) -> int:
    """Frames of the video an extension continues (0 for any other job)."""
    if job.request.extension is not None:
        return job.request.extension.before_frames
    # accepted by an earlier release: one extend run with a stitch op
    stitch = job.request.stitch
    return stitch.before_frames if stitch is not None else 0


def first_run_id(job: JobRecord) -> str | None:
    """The run the job was submitted as (or the retry of it that succeeded): the one that wrote
    the shot. Its follow-ups' runs come after it."""
    return (job.live.first_run if job.live else None) or job.run_id
