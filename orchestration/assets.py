"""External asset specs of produced media, so materializations get lineage edges."""

from __future__ import annotations

from dagster import AssetDep, AssetSpec, MultiToSingleDimensionPartitionMapping

from ops.assets import FILM_KEY, SHOT_KEY, shot_partitions, works_partitions

shot_asset = AssetSpec(
    SHOT_KEY,
    description="One generated shot (MP4 with audio), partitioned by work and shot.",
    partitions_def=shot_partitions,
    group_name="media",
    kinds={"video"},
)

film_asset = AssetSpec(
    FILM_KEY,
    description="Shots of a work merged in order into one film.",
    partitions_def=works_partitions,
    deps=[AssetDep(SHOT_KEY, partition_mapping=MultiToSingleDimensionPartitionMapping("work"))],
    group_name="media",
    kinds={"video"},
)

media_assets = [shot_asset, film_asset]
