"""Both Dagster jobs executed for real, with their materializations and lineage checked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from dagster import AssetKey, instance_for_test
from PIL import Image

from contracts import events
from contracts.tags import STAGE_TAG
from ops.assets import FILM_KEY, SHOT_KEY, SHOT_STILLS_KEY
from orchestration.definitions import defs
from shotloom import media
from shotloom.admission import FakeProbe
from shotloom.runtime import get_runtime

from conftest import write_inference_yaml


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
    # no stills here: the device run only writes the MP4 (shot_stills makes them on a media worker)
    assert "thumbnail" not in meta and meta["spritesheet_count"] == 9
    assert not (path.parent / "thumbnail.png").exists()


def run_stills(instance, tmp_path, inference_config, shot_meta: dict):
    """The shot_stills job on a written shot, configured as the API's follower configures it."""
    config = {
        "work_id": "w1",
        "shot_id": "s1",
        "video": shot_meta["path"],
        "spritesheet_frames": shot_meta["spritesheet_count"],
    }
    return defs.get_job_def("shot_stills").execute_in_process(
        run_config={
            "ops": {"stills_op": {"config": config}},
            "resources": resources_config(tmp_path, inference_config),
        },
        instance=instance,
    )


def assert_stills(meta: dict, media_root: Path, video: Path, count: int, grid: str) -> None:
    """Thumbnail and spritesheet recorded on a materialization: beside the MP4, under the media root,
    decodable, with the recorded bytes/sha256; the thumbnail is the video's middle frame."""
    assert meta.get("path", meta.get("video")).endswith(".mp4")  # the video they were made from
    frames = media.read_frames(video)
    for key, name in (("thumbnail", "thumbnail.png"), ("spritesheet", "spritesheet.png")):
        rel = meta[key]
        assert isinstance(rel, str) and not rel.startswith("/") and Path(rel).name == name
        path = media_root / rel
        assert path.parent == video.parent and path.resolve().is_relative_to(media_root.resolve())
        assert meta[f"{key}_bytes"] == path.stat().st_size
        assert meta[f"{key}_sha256"] == media.file_sha256(path)
        with Image.open(path) as im:
            im.load()
            assert im.format == "PNG"
            if key == "thumbnail":
                assert im.size == (frames.shape[2], frames.shape[1])
                middle = frames[len(frames) // 2].astype(int)
                # the shot's frame before encoding vs decoded back: within codec tolerance
                assert np.abs(np.asarray(im.convert("RGB")).astype(int) - middle).mean() < 4
            else:
                columns, rows = (int(x) for x in grid.split("x"))
                cell_w = min(frames.shape[2], 160)
                assert im.size == (columns * cell_w, rows * round(frames.shape[1] * cell_w / frames.shape[2]))
    assert meta["spritesheet_grid"] == grid
    assert meta["spritesheet_frames"] == media.spritesheet_indexes(len(frames), count)


def test_shot_and_film_get_thumbnail_and_spritesheet(instance, tmp_path, wan_checkpoint):
    # the spritesheet count comes from the inference YAML (defaults.spritesheet_frames)
    defaults = {"width": 64, "height": 64, "num_frames": 17, "fps": 16, "spritesheet_frames": 4}
    config = write_inference_yaml(
        tmp_path / "inference.yaml", "wan", wan_checkpoint, tmp_path / "cache", defaults=defaults
    )
    root = tmp_path / "media"
    shot = run_shot(instance, tmp_path, config, prompt="a thumbnail of a kite")
    assert shot.success
    artifact = shot.output_for_node("write_op")
    [mat] = materializations(instance, SHOT_KEY)
    stills = run_stills(instance, tmp_path, config, {k: v.value for k, v in mat.metadata.items()})
    assert stills.success
    [mat] = materializations(instance, SHOT_STILLS_KEY)
    assert mat.partition == "s1|w1"
    meta = {k: v.value for k, v in mat.metadata.items()}
    assert meta["video"] == artifact.path
    assert_stills(meta, root, root / artifact.path, count=4, grid="2x2")
    # ...and what later shots take from it (memory, an extension's first frame), kept beside it.
    video = root / artifact.path
    kept = json.loads((video.parent / "reference" / "reference.json").read_text())
    assert kept["video_frames"] == 17 and kept["audio"]  # the silent AAC track
    for name, index in (("middle", 8), ("last", 16)):
        png = np.asarray(Image.open(root / kept["frames"][name]).convert("RGB"))
        assert np.array_equal(png, np.asarray(media.extract_frame(video, index)))
    assert meta["spritesheet_frames"] == [0, 5, 11, 16]

    result = defs.get_job_def("merge").execute_in_process(
        run_config={
            "ops": {"merge_op": {"config": {"work_id": "w1", "inputs": [artifact.path, artifact.path]}}},
            "resources": resources_config(tmp_path, config),
        },
        instance=instance,
    )
    film = result.output_for_node("merge_op")
    [mat] = materializations(instance, FILM_KEY)
    meta = {k: v.value for k, v in mat.metadata.items()}
    assert meta["path"] == film.path
    assert_stills(meta, root, root / film.path, count=9, grid="3x3")  # 9 of the film's 34 frames


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


# -- stages, weight tiers, out-of-memory -----------------------------------------------------------
def run_tags(instance, result) -> dict[str, str]:
    return dict(instance.get_run_by_id(result.run_id).tags)


def test_stages_and_progress_are_run_tags_with_timestamps(instance, tmp_path, wan_config):
    first = run_shot(instance, tmp_path, wan_config, shot_id="a", prompt="stages, first")
    assert first.success
    tags = run_tags(instance, first)
    times = events.stage_times(tags)
    miss = ["validating", "conditioning_cache_lookup", "keeping_generator_on_gpu", "conditioning"]
    assert list(times) == [*miss, "inferring", "decoding", "writing"]
    assert list(times.values()) == sorted(times.values())  # entered in the spec's order
    assert tags[STAGE_TAG] == "writing"  # a device worker then records succeeded/failed
    assert events.progress(tags) == {"stage": "decoding", "done": 1, "total": 1}

    logs = instance.all_logs(first.run_id)
    steps = [e.user_message for e in logs if "denoise step" in (e.user_message or "")]
    assert steps[-1].endswith("4/4")  # progress of every DMD step reaches the log

    hit = run_shot(instance, tmp_path, wan_config, shot_id="b", prompt="stages, first")
    times = events.stage_times(run_tags(instance, hit))
    assert "conditioning" not in times and "conditioning_cache_lookup" in times  # a hit encodes nothing


def test_short_ram_releases_the_generator_and_reloads_it_for_denoise(
    instance, tmp_path, wan_config, monkeypatch
):
    rt = get_runtime(wan_config)
    normal = run_shot(instance, tmp_path, wan_config, shot_id="n", prompt="tiers", seed=3)
    loads_before = rt.generator_loads
    # A host whose free RAM is inside the headroom: no stack fits beside the DiT -> release it.
    monkeypatch.setattr(rt, "probe", FakeProbe.from_gib(ram_free=0.01, ram_total=16))
    rt.cache.root = tmp_path / "fresh-cache"  # force a conditioning miss for the same request
    tight = run_shot(instance, tmp_path, wan_config, shot_id="t", prompt="tiers", seed=3)
    assert tight.success
    times = events.stage_times(run_tags(instance, tight))
    assert "unloading_for_conditioning" in times and "loading_generator" in times
    assert times["unloading_for_conditioning"] <= times["conditioning"] <= times["loading_generator"]
    assert rt.generator_loads == loads_before + 1  # reloaded from the checkpoint for denoise
    assert rt.weight_location() == "released"  # decode released it again to make room for the VAE
    outputs = [tmp_path / "media" / r.output_for_node("write_op").path for r in (normal, tight)]
    a, b = (media.read_frames(p) for p in outputs)
    # The reloaded DiT is the same model: same seed, the same video. Alone this is bit-identical;
    # after some other test modules in one process it differs slightly (max 17, mean 0.4 of 255,
    # seen 2026-12-03, cause not found yet): bound the difference instead of hiding it.
    diff = np.abs(a.astype(int) - b.astype(int))
    assert a.shape == b.shape and diff.mean() < 1.0, (diff.max(), diff.mean())


def test_out_of_memory_releases_weights_and_retries_once(instance, tmp_path, wan_config, monkeypatch):
    import torch

    from shotloom.families.wan import WanAdapter

    rt = get_runtime(wan_config)
    rt.adapter  # noqa: B018 - loaded
    loads = rt.loads
    real = WanAdapter.denoise
    calls = {"n": 0}

    def flaky(self, *args, **kwargs):  # a CUDA OOM cannot happen on CPU: raise what torch raises
        calls["n"] += 1
        if calls["n"] == 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(WanAdapter, "denoise", flaky)
    result = run_shot(instance, tmp_path, wan_config, shot_id="oom")
    assert result.success and calls["n"] == 2
    assert rt.loads == loads + 1  # every weight was released, then loaded again for the retry

    def always(self, *args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(WanAdapter, "denoise", always)
    result = run_shot(instance, tmp_path, wan_config, shot_id="oom2")
    assert not result.success
    failure = result.failure_data_for_node("denoise_op")
    assert "out of memory again after releasing all weights and retrying once" in (
        failure.user_failure_data.description
    )
