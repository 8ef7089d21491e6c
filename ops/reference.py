"""The reference op: the frames and sound a video lends to later shots (a character, a memory
slot, an extension's first frame), taken on a media worker so the API never decodes video."""

from pathlib import Path

from dagster import AssetMaterialization, Failure, MetadataValue, OpExecutionContext, Out, Output, op

from contracts.runs import ReferenceConfig
from ops.assets import REFERENCE_KEY
from ops.types import ReferenceArtifact
from resources.media_store import MediaStoreResource


@op(out=Out(ReferenceArtifact), tags={"stage": "referencing"})
def reference_op(context: OpExecutionContext, config: ReferenceConfig, media: MediaStoreResource):
    video = Path(config.video) if Path(config.video).is_absolute() else media.resolve(config.video)
    try:
        taken = media.write_reference(video, media.reference_dir(context.run_id), config.frames, config.audio)
    except (ValueError, FileNotFoundError) as exc:  # the video itself: the request is refused, not retried
        raise Failure(description=str(exc), allow_retries=False) from exc
    context.log_event(
        AssetMaterialization(
            asset_key=REFERENCE_KEY,
            description=f"frames {', '.join(config.frames)} of {video.name}",
            metadata={
                "frames": MetadataValue.json(taken["frames"]),
                "audio": taken["audio"] or "",
                "video_frames": taken["video_frames"],
            },
        )
    )
    yield Output(ReferenceArtifact(**taken))
