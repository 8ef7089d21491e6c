"""The stills op: a shot's thumbnail and spritesheet (and the frames and sound later shots take from
it), made on a media worker after the device run wrote the MP4 (the device slot is free by then:
PNG work never holds a GPU)."""

from dagster import AssetMaterialization, OpExecutionContext, Out, Output, op

from contracts import events
from contracts.outputs import StillsOutput
from contracts.runs import StillsConfig
from ops.assets import SHOT_STILLS_KEY, register_shot_partition
from ops.previews import shot_preview
from ops.types import StillsArtifact
from resources import run_state
from resources.media_store import MediaStoreResource
from shotloom import stages


@op(out=Out(StillsArtifact), tags={"stage": "writing"})
def stills_op(context: OpExecutionContext, config: StillsConfig, media: MediaStoreResource):
    """Decode only the frames the stills need (by seeking) and write the PNGs beside the MP4."""
    run_state.record(context.instance, context.run_id, events.stage_tags(stages.WRITING))
    video = media.resolve(config.video)
    stills = media.write_stills(video, video, config.spritesheet_frames)
    # What later shots take from this one (memory, an extension's first frame), kept beside it.
    media.keep_reference(video)
    context.log_event(
        AssetMaterialization(
            asset_key=SHOT_STILLS_KEY,
            partition=register_shot_partition(context.instance, config.work_id, config.shot_id),
            description=f"stills of {config.video}",
            metadata={
                "video": config.video,
                **StillsOutput.model_validate(stills).to_metadata(),
                "preview": shot_preview(media, config.video, stills["thumbnail"], stills["spritesheet"]),
            },
        )
    )
    yield Output(
        StillsArtifact(
            video=config.video,
            **{k: stills[k] for k in ("thumbnail", "spritesheet", "spritesheet_grid", "spritesheet_frames")},
        )
    )
