"""The stills op: a shot's thumbnail and spritesheet (and the frames and sound later shots take from
it), made on a media worker after the device run wrote the MP4 (the device slot is free by then:
PNG work never holds a GPU)."""

from dagster import AssetMaterialization, Config, OpExecutionContext, Out, Output, op
from pydantic import Field

from contracts import events
from ops.assets import SHOT_STILLS_KEY, register_shot_partition
from ops.types import StillsArtifact
from resources import run_state
from resources.media_store import MediaStoreResource
from shotloom import stages


class StillsConfig(Config):
    work_id: str = Field(description="Work the shot belongs to.")
    shot_id: str = Field(description="The shot (partition of the shot and shot_stills assets).")
    video: str = Field(description="The shot's MP4, relative to the media root; the PNGs go beside it.")
    spritesheet_frames: int = Field(default=9, ge=1, description="Frames in the spritesheet.")


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
            metadata={"video": config.video, **stills},
        )
    )
    yield Output(
        StillsArtifact(
            video=config.video,
            **{k: stills[k] for k in ("thumbnail", "spritesheet", "spritesheet_grid", "spritesheet_frames")},
        )
    )
