"""What crosses a process reads back as it was written: run tags, stage and progress events, a
run's materialization metadata, a worker's HTTP protocol (contracts/)."""

from __future__ import annotations

import pytest
from dagster import MetadataValue
from pydantic import ValidationError

from contracts import events, tags
from contracts.outputs import RESULT_KEYS, FilmOutput, ShotOutput, VideoOutput, read_stills
from contracts.worker import RunOffer, WorkerStatus
from shotloom import stages


def plain(metadata: dict) -> dict:
    """Metadata as a reader gets it (GraphQL hands JSON entries over as their value)."""
    return {k: v.value if isinstance(v, MetadataValue) else v for k, v in metadata.items()}


def test_a_stage_change_and_progress_travel_as_one_event_and_come_back():
    written = {**events.stage_tags(stages.INFERRING, at=12.5), **events.progress_tag(stages.INFERRING, 3, 8)}
    event = events.event_of(written)
    back = events.read_event(events.event_metadata(event))
    assert back == event
    assert (back.stage, back.at, back.progress.as_dict()) == (
        "inferring",
        12.5,
        {"stage": "inferring", "done": 3, "total": 8},
    )
    assert events.stage_times(written) == {"inferring": 12.5}
    assert events.event_of({tags.WORKER_TAG: "cpu-0"}) is None  # no stage, no progress: no event
    with pytest.raises(ValueError, match="unknown stage"):
        events.stage_tags("dreaming")


def test_a_jobs_runs_carry_its_tags_and_only_the_ones_that_apply():
    first = tags.run_tags(version_id="v", work_id="w", kind="r2v", submitter=None)
    assert first == {tags.VERSION_TAG: "v", tags.WORK_TAG: "w", tags.KIND_TAG: "r2v", tags.USER_TAG: "api"}
    assert tags.run_step(first) == 0
    later = tags.run_tags(
        version_id="v", work_id="w", kind="r2v", submitter="ops", shot_id="s", priority=-5,
        rerender_reason="", step=2,
    )  # fmt: skip
    assert later[tags.PRIORITY_TAG] == "-5" and later[tags.RERENDER_TAG] == "rerender"
    assert later[tags.SHOT_TAG] == "s" and tags.run_step(later) == 2
    assert all(k.count("/") <= 1 for k in later)  # Dagster's tag key rule


def test_a_shots_materialization_reads_back_as_its_video_and_result_facts():
    shot = ShotOutput(
        work_id="w", shot_id="s", path="w/s/v.mp4", bytes=10, sha256="ab", frames=17, fps=16.0,
        width=64, height=64, duration_s=1.0625, seed=7, checkpoint="wan:tiny", has_audio=True,
        size="64x64", sampler={"mode": "native", "steps": 4}, num_inference_steps=4, guidance_scale=3.5,
        step_cache="none", inputs={"prompt": {}}, derived_from=["v0"],
    )  # fmt: skip
    metadata = shot.to_metadata()
    assert isinstance(metadata["sampler"], MetadataValue) and isinstance(
        metadata["derived_from"], MetadataValue
    )
    video = VideoOutput.read(plain(metadata))
    assert (video.path, video.bytes, video.sha256) == ("w/s/v.mp4", 10, "ab")
    facts = video.facts()
    assert "path" not in facts and "sha256" not in facts
    assert {k: facts[k] for k in RESULT_KEYS if k in facts} == {
        "width": 64, "height": 64, "frames": 17, "fps": 16.0, "duration_s": 1.0625, "has_audio": True,
        "seed": 7, "peak_memory_mb": 0.0, "num_inference_steps": 4, "guidance_scale": 3.5,
        "sampler": {"mode": "native", "steps": 4}, "step_cache": "none",
    }  # fmt: skip
    assert VideoOutput.read({"video": "w/s/v.mp4", "thumbnail": "t.png"}) is None  # a stills run's


def test_a_films_stills_are_indexed_with_the_spritesheets_grid():
    film = FilmOutput(
        work_id="w", path="w/film.mp4", bytes=5, sha256="cd", video_mode="copy", size="64x64",
        shots="a, b", versions=["v1", "v2"], thumbnail="w/t.png", thumbnail_sha256="t",
        thumbnail_bytes=3, spritesheet="w/s.png", spritesheet_sha256="s", spritesheet_bytes=4,
        spritesheet_frames=[0, 8, 16], spritesheet_grid="3x1",
    )  # fmt: skip
    metadata = plain(film.to_metadata())
    stills = read_stills(metadata)
    assert [(s.role, s.path, s.bytes, s.grid) for s in stills] == [
        ("thumbnail", "w/t.png", 3, None),
        ("spritesheet", "w/s.png", 4, "3x1"),
    ]
    assert not any(k.startswith(("thumbnail", "spritesheet")) for k in VideoOutput.read(metadata).facts())


def test_a_workers_protocol_refuses_what_it_cannot_read():
    assert RunOffer.model_validate({"run_id": "r"}) == RunOffer(run_id="r", resume=False)
    for bad in ({"resume": True}, {"run_id": ""}, {"run_id": "r", "priority": 1}):
        with pytest.raises(ValidationError):
            RunOffer.model_validate(bad)
    status = WorkerStatus.model_validate(
        {"name": "cpu-0", "pool": "device", "device": "cpu:0", "pid": 1, "boot_id": "b", "state": "idle",
         "a_later_field": 1}  # a later release's worker says more: the rest still reads
    )  # fmt: skip
    assert status.state == "idle" and status.weight_location == "released"
    with pytest.raises(ValidationError):
        WorkerStatus.model_validate({"name": "cpu-0", "pool": "device", "device": "cpu", "pid": 1,
                                     "boot_id": "b", "state": "dreaming"})  # fmt: skip
