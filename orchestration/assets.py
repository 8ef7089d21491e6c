"""External asset specs of produced media, so materializations get lineage edges."""

from __future__ import annotations

from dagster import AssetDep, AssetSpec, MultiToSingleDimensionPartitionMapping

from ops.assets import FILM_KEY, REFERENCE_KEY, SHOT_KEY, SHOT_STILLS_KEY, shot_partitions, works_partitions

shot_asset = AssetSpec(
    SHOT_KEY,
    description="One generated shot (MP4 with audio), partitioned by work and shot.",
    partitions_def=shot_partitions,
    group_name="media",
    kinds={"video"},
)

shot_stills_asset = AssetSpec(
    SHOT_STILLS_KEY,
    description="A shot's thumbnail and spritesheet PNGs, made from its MP4 on a media worker.",
    partitions_def=shot_partitions,
    deps=[SHOT_KEY],
    group_name="media",
    kinds={"image"},
)

film_asset = AssetSpec(
    FILM_KEY,
    description="Shots of a work merged in order into one film.",
    partitions_def=works_partitions,
    deps=[AssetDep(SHOT_KEY, partition_mapping=MultiToSingleDimensionPartitionMapping("work"))],
    group_name="media",
    kinds={"video"},
)

reference_asset = AssetSpec(
    REFERENCE_KEY,
    description="Frames and sound taken from a video to condition later shots (characters, memory "
    "slots, extensions); the service copies them into its inputs store.",
    group_name="media",
    kinds={"image"},
)

media_assets = [shot_asset, shot_stills_asset, film_asset, reference_asset]
