"""The merge op: ordered concatenation of shot MP4s into one film."""

from pathlib import Path

from dagster import AssetMaterialization, In, OpExecutionContext, Out, Output, op

from contracts import events
from contracts.outputs import FilmOutput
from contracts.runs import MergeConfig, StitchConfig
from contracts.tags import VERSION_TAG
from ops.assets import FILM_KEY, register_work_partition
from ops.previews import film_preview
from ops.types import FilmArtifact, ShotArtifact
from resources import run_state
from resources.media_store import MediaStoreResource
from shotloom import stages

# Frames in the film's spritesheet (3x3). A constant: the merge job has no inference YAML, whose
# defaults.spritesheet_frames sets the shots' count.
FILM_SPRITESHEET_FRAMES = 9


@op(out=Out(FilmArtifact), tags={"stage": "merging"})
def merge_op(context: OpExecutionContext, config: MergeConfig, media: MediaStoreResource):
    """Stream-copy video when encoder settings match (else re-encode); audio re-encoded once, in sync."""
    yield from _film(
        context, media, config.work_id, config.inputs, list(config.shot_ids), list(config.versions)
    )


@op(ins={"shot": In(ShotArtifact)}, out=Out(FilmArtifact), tags={"stage": "merging"})
def stitch_op(
    context: OpExecutionContext, config: StitchConfig, shot: ShotArtifact, media: MediaStoreResource
):
    """Append the shot just written to the clips before it: one film, by the merge path."""
    # The new shot's version is the run's own (its tag): a film made by one run lists it by run.
    versions = [*config.versions, context.run.tags.get(VERSION_TAG, context.run_id)]
    yield from _film(
        context,
        media,
        config.work_id,
        [*config.before, shot.path],
        [*config.shot_ids, shot.shot_id],
        versions,
    )


def _film(
    context: OpExecutionContext,
    media: MediaStoreResource,
    work_id: str,
    paths: list[str],
    shot_ids: list[str],
    versions: list[str],
):
    from shotloom.media import merge_mp4

    run_state.record(context.instance, context.run_id, events.stage_tags(stages.MERGING))
    inputs = [Path(p) if Path(p).is_absolute() else media.resolve(p) for p in paths]
    output = media.film_path(work_id, context.run_id)
    result = merge_mp4(inputs, output)
    # The shots shown on the film's page, in order (an input outside the media root has no stills).
    shown = [
        (shot_id, media.relative(path))
        for shot_id, path in zip(shot_ids or [p.stem for p in inputs], inputs, strict=False)
        if path.resolve().is_relative_to(media.root_path)
    ]
    info = result.info
    # The film's frames are not in memory: only the stills' frames are decoded, by seeking.
    stills = media.write_stills(output, output, FILM_SPRITESHEET_FRAMES)
    artifact = FilmArtifact(
        work_id=work_id,
        path=media.relative(output),
        bytes=info.bytes,
        sha256=info.sha256,
        frames=info.frames,
        fps=float(info.fps),
        width=info.width,
        height=info.height,
        duration_s=round(float(info.duration_s), 4),
        video_mode=result.video_mode,
        shots=shot_ids,
    )
    yield AssetMaterialization(
        asset_key=FILM_KEY,
        partition=register_work_partition(context.instance, work_id),
        metadata=FilmOutput(
            **{k: v for k, v in artifact.__dict__.items() if k != "shots"},
            size=f"{artifact.width}x{artifact.height}",
            shots=", ".join(shot_ids) or ", ".join(paths),
            versions=versions,
            **stills,
        ).to_metadata()
        | {"preview": film_preview(media, artifact.path, stills["thumbnail"], stills["spritesheet"], shown)},
    )
    yield Output(artifact)
