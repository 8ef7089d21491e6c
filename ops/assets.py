"""Asset keys and partitions of produced media (the specs live in orchestration/assets.py).

Ops record materializations against these keys; lineage comes from the external
AssetSpecs, because a runtime-only key would get no edges.
"""

from __future__ import annotations

from dagster import (
    AssetKey,
    DagsterInstance,
    DynamicPartitionsDefinition,
    MultiPartitionKey,
    MultiPartitionsDefinition,
)

SHOT_KEY = AssetKey("shot")
SHOT_STILLS_KEY = AssetKey("shot_stills")
FILM_KEY = AssetKey("film")
REFERENCE_KEY = AssetKey("reference")

works_partitions = DynamicPartitionsDefinition(name="works")
shots_partitions = DynamicPartitionsDefinition(name="shots")
shot_partitions = MultiPartitionsDefinition({"work": works_partitions, "shot": shots_partitions})


def _ensure_partition(instance: DagsterInstance, name: str, key: str) -> None:
    if instance.has_dynamic_partition(name, key):
        return
    try:
        instance.add_dynamic_partitions(name, [key])
    except Exception:
        # Two device workers registering the same work at once: the loser hits the unique index.
        if not instance.has_dynamic_partition(name, key):
            raise


def register_shot_partition(instance: DagsterInstance, work_id: str, shot_id: str) -> MultiPartitionKey:
    """Register the dynamic keys first: a materialization of an unknown key is silently orphaned."""
    for definition, key in ((works_partitions, work_id), (shots_partitions, shot_id)):
        _ensure_partition(instance, definition.name, key)
    return MultiPartitionKey({"work": work_id, "shot": shot_id})


def register_work_partition(instance: DagsterInstance, work_id: str) -> str:
    _ensure_partition(instance, works_partitions.name, work_id)
    return work_id
