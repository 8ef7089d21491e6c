"""The reference op: the frames and sound a video lends to later shots (a character, a memory
slot, an extension's first frame), taken on a media worker so the API never decodes video."""

from pathlib import Path

from dagster import AssetMaterialization, Config, Failure, MetadataValue, OpExecutionContext, Out, Output, op
from pydantic import Field

from ops.assets import REFERENCE_KEY
from ops.types import ReferenceArtifact
from resources.media_store import MediaStoreResource


class ReferenceConfig(Config):
    video: str = Field(description="The video (absolute, or relative to the media root).")
    frames: list[str] = Field(default_factory=lambda: ["middle"], description="middle and/or last.")
    audio: bool = Field(default=True, description="Take its sound too (a WAV), where it has one.")


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
