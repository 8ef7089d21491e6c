"""Jobs, each for one pool of workers. Every job runs in one process (in_process_executor): on a
device worker the model loads once; on a media worker nothing is started per run."""

from __future__ import annotations

from dagster import in_process_executor, job

from contracts.tags import GPU_TAG, MEDIA_TAG, STAGE_TAG
from ops.merge import merge_op, stitch_op
from ops.reference import reference_op
from ops.shot import condition_op, decode_op, denoise_op, write_op
from ops.stills import stills_op
from shotloom.stages import QUEUED


def _pool_job(pool_tag: str, description: str):
    """A job whose runs go to one pool's workers and count against that pool's queue limit: the
    gpu tag for a device worker; the media tag for a warm media worker, so media work never waits
    behind a generation and never takes a device slot."""
    return job(
        executor_def=in_process_executor,
        description=description,
        tags={pool_tag: "1", STAGE_TAG: QUEUED},
    )


@_pool_job(GPU_TAG, "Generate one shot: condition, denoise, decode, write.")
def r2v():
    write_op(decode_op(denoise_op(condition_op())))


# Extensions accepted by earlier releases (queued in Dagster as one run); new ones run r2v, then
# merge on a media worker, so the stitching never holds a device slot.
@_pool_job(
    GPU_TAG,
    "Continue a video (as accepted by earlier releases): generate one shot, then append it to the "
    "video by the merge path.",
)
def extend():
    stitch_op(write_op(decode_op(denoise_op(condition_op()))))


@_pool_job(MEDIA_TAG, "A shot's thumbnail and spritesheet from its MP4 (after r2v wrote it).")
def shot_stills():
    stills_op()


@_pool_job(MEDIA_TAG, "Concatenate shots into one film, in order.")
def merge():
    merge_op()


@_pool_job(
    MEDIA_TAG,
    "Take frames and the sound of a video for later shots (a character, a memory slot, an "
    "extension's first frame); the API waits for it.",
)
def reference():
    reference_op()
