"""Jobs. ``r2v`` runs in one process (in_process_executor) so the model loads once."""

from __future__ import annotations

from dagster import in_process_executor, job

from ops.merge import merge_op, stitch_op
from ops.reference import reference_op
from ops.shot import condition_op, decode_op, denoise_op, write_op
from ops.stills import stills_op
from orchestration.launcher import GPU_TAG, MEDIA_TAG
from shotloom.stages import QUEUED, STAGE_TAG


# The gpu tag sends r2v to a device worker and counts it against the queue's device limit.
@job(
    executor_def=in_process_executor,
    description="Generate one shot: condition, denoise, decode, write.",
    tags={GPU_TAG: "1", STAGE_TAG: QUEUED},
)
def r2v():
    write_op(decode_op(denoise_op(condition_op())))


# Extensions accepted by earlier releases (queued in Dagster as one run); new ones run r2v, then
# merge on a media worker, so the stitching never holds a device slot.
@job(
    executor_def=in_process_executor,
    description="Continue a video (as accepted by earlier releases): generate one shot, then "
    "append it to the video by the merge path.",
    tags={GPU_TAG: "1", STAGE_TAG: QUEUED},
)
def extend():
    stitch_op(write_op(decode_op(denoise_op(condition_op()))))


# The media tag sends the media work (stills, merges) to a warm media worker, with its own queue
# limit: it never waits behind a generation and never takes a device slot.
@job(
    executor_def=in_process_executor,
    description="A shot's thumbnail and spritesheet from its MP4 (after r2v wrote it).",
    tags={MEDIA_TAG: "1", STAGE_TAG: QUEUED},
)
def shot_stills():
    stills_op()


@job(
    executor_def=in_process_executor,
    description="Concatenate shots into one film, in order.",
    tags={MEDIA_TAG: "1", STAGE_TAG: QUEUED},
)
def merge():
    merge_op()


@job(
    executor_def=in_process_executor,
    description="Take frames and the sound of a video for later shots (a character, a memory slot, "
    "an extension's first frame); the API waits for it.",
    tags={MEDIA_TAG: "1", STAGE_TAG: QUEUED},
)
def reference():
    reference_op()
