"""Both Dagster jobs executed for real, with their materializations and lineage checked."""

from __future__ import annotations

import subprocess
import sys

import pytest
from dagster import AssetKey, instance_for_test

from ops.assets import FILM_KEY, SHOT_KEY
from orchestration.definitions import defs
from shotloom import media
from shotloom.runtime import get_runtime


@pytest.fixture
def instance():
    with instance_for_test() as inst:
        yield inst


def resources_config(tmp_path, inference_config):
    return {
        "runtime": {"config": {"inference_config": str(inference_config)}},
        "media": {"config": {"root": str(tmp_path / "media")}},
        "io_manager": {"config": {"base_dir": str(tmp_path / "steps")}},
    }


def run_shot(instance, tmp_path, inference_config, **shot):
    shot = {"work_id": "w1", "shot_id": "s1", "prompt": "a kite over the sea", "seed": 7, **shot}
    result = defs.get_job_def("r2v").execute_in_process(
        run_config={
            "ops": {"condition_op": {"config": shot}},
            "resources": resources_config(tmp_path, inference_config),
        },
        instance=instance,
        raise_on_error=False,
    )
    return result


def materializations(instance, key: AssetKey):
    records = instance.fetch_materializations(key, limit=100).records
    return [r.asset_materialization for r in records]


def test_r2v_job_writes_mp4_and_materializes_shot(instance, tmp_path, wan_config):
    result = run_shot(instance, tmp_path, wan_config)
    assert result.success
    artifact = result.output_for_node("write_op")
    path = tmp_path / "media" / artifact.path
    info = media.probe(path)
    assert (info.frames, info.width, info.height, round(float(info.fps))) == (17, 64, 64, 16)
    assert info.has_audio  # silent track for a family that makes no audio
    assert info.sha256 == artifact.sha256

    [mat] = materializations(instance, SHOT_KEY)
    assert mat.partition == "s1|w1"  # MultiPartitionKey: dimensions in name order (shot, work)
    meta = {k: v.value for k, v in mat.metadata.items()}
    assert meta["path"] == artifact.path and not meta["path"].startswith("/")
    assert meta["bytes"] == path.stat().st_size
    assert meta["frames"] == 17 and meta["size"] == "64x64" and meta["seed"] == 7
    assert meta["checkpoint"].startswith("wan:")
    assert set(meta["stage_timings"]) == {"condition", "denoise", "decode", "write"}
    assert instance.get_dynamic_partitions("works") == ["w1"]


def test_second_identical_request_hits_conditioning_cache(instance, tmp_path, wan_config):
    assert run_shot(instance, tmp_path, wan_config, shot_id="a").success
    counter = get_runtime(wan_config).adapter.encoder_counter
    before = counter.total
    assert before > 0
    result = run_shot(instance, tmp_path, wan_config, shot_id="b")
    assert result.success
    assert counter.total == before  # no encoder forward on a hit
    metas = [{k: v.value for k, v in m.metadata.items()} for m in materializations(instance, SHOT_KEY)]
    assert sorted(m["cache_hit"] for m in metas) == [False, True]


def test_capability_error_fails_condition_step_naming_the_field(instance, tmp_path, wan_config):
    result = run_shot(instance, tmp_path, wan_config, width=65)
    assert not result.success
    failure = result.failure_data_for_node("condition_op")
    assert failure.user_failure_data.description == "width: must be a positive multiple of 16, got 65"
    assert materializations(instance, SHOT_KEY) == []


def test_merge_job_concatenates_shots_with_lineage(instance, tmp_path, wan_config):
    shots = []
    for shot_id, seed in (("s1", 1), ("s2", 2)):
        result = run_shot(instance, tmp_path, wan_config, shot_id=shot_id, seed=seed)
        shots.append(result.output_for_node("write_op"))
    result = defs.get_job_def("merge").execute_in_process(
        run_config={
            "ops": {
                "merge_op": {
                    "config": {"work_id": "w1", "inputs": [s.path for s in shots], "shot_ids": ["s1", "s2"]}
                }
            },
            "resources": resources_config(tmp_path, wan_config),
        },
        instance=instance,
    )
    film = result.output_for_node("merge_op")
    info = media.probe(tmp_path / "media" / film.path)
    assert info.frames == 34 and film.video_mode == "copy"
    assert abs(info.audio_duration_s - info.duration_s) <= 1 / 16
    [mat] = materializations(instance, FILM_KEY)
    assert mat.partition == "w1"
    assert SHOT_KEY in defs.resolve_asset_graph().get(FILM_KEY).parent_keys


def test_code_location_does_not_import_torch():
    code = "import sys, orchestration.definitions; print('torch' in sys.modules, 'diffusers' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["False", "False"]
