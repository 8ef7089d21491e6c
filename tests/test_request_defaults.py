"""Every default a shot gets is resolved once (shotloom.request.resolve): what the API tells a client
that set nothing, and what its rule book checked, is what the worker runs. Guidance included: the
sampler's own default (not a clamp of the family's range), the inference YAML's size, length and
frame rate, the model's default step cache."""

from __future__ import annotations

import pytest
from dagster import instance_for_test

from api.core.jobs import JobService
from api.r2v.protocol import R2VRequest
from api.r2v.serving import R2VServing
from api.r2v.views import version_response
from api.store import Store
from ops.assets import SHOT_KEY
from orchestration.definitions import defs
from settings.api import ApiConfig
from shotloom.config import load_inference_config
from shotloom.request import resolve

from conftest import write_inference_yaml

DEFAULTS = {"width": 48, "height": 32, "num_frames": 9, "fps": 16, "negative_prompt": "blur"}
SAMPLER = {"mode": "native", "steps": 2, "guidance_scale": 3.5}  # CFG on: two DiT calls a step
PERFORMANCE = {"step_caches": {"fbc": {"kind": "first_block", "threshold": 0.05}}, "step_cache": "fbc"}
CAPS = {  # what the tiny Wan worker publishes (the family's range is wider than the default)
    "max_reference_images": 3,
    "first_frame": True,
    "last_frame": True,
    "audio_in": False,
    "audio_out": False,
    "frame_multiple": 4,
    "size_multiple": 16,
    "fps": [16],
    "guidance_range": [1.0, 20.0],
    "max_frames": 1025,
    "video_to_video": True,
}


@pytest.fixture
def inference_yaml(tmp_path, wan_checkpoint):
    return write_inference_yaml(
        tmp_path / "inference.yaml",
        "wan",
        wan_checkpoint,
        tmp_path / "cache",
        defaults=DEFAULTS,
        sampler=SAMPLER,
        performance=PERFORMANCE,
    )


def test_the_api_answers_with_the_defaults_the_worker_runs(tmp_path, inference_yaml, one_torch_thread):
    cfg = load_inference_config(inference_yaml)
    store = Store(f"sqlite:///{tmp_path / 'service.sqlite'}")
    jobs = JobService(
        store,
        ApiConfig(),
        tmp_path / "state",
        tmp_path / "media",
        capabilities=lambda: CAPS,
        defaults=cfg.defaults,
        sampler_for=cfg.sampler_for,
        performance=cfg.performance,
    )
    request = R2VRequest.model_validate({"work_id": "w", "shot_id": "s", "prompt": "p", "memory_slots": []})
    job = R2VServing(jobs).accept_r2v(request, None).job
    said = version_response(job, None, [], "http://x", jobs.sampling)
    # What the rule book checked the shot as: the same function the worker calls.
    checked = resolve(cfg.defaults, cfg.sampler_for(None), cfg.performance, "p", seed=0)

    config = job.request["run_config"]["ops"]["condition_op"]["config"]
    with instance_for_test() as instance:
        ran = defs.get_job_def("r2v").execute_in_process(
            run_config={
                "ops": {"condition_op": {"config": config}},
                "resources": {
                    "runtime": {"config": {"inference_config": str(inference_yaml)}},
                    "media": {"config": {"root": str(tmp_path / "media")}},
                    "io_manager": {"config": {"base_dir": str(tmp_path / "steps")}},
                },
            },
            instance=instance,
        )
        assert ran.success
        [record] = instance.fetch_materializations(SHOT_KEY, limit=1).records
        meta = {k: v.value for k, v in record.asset_materialization.metadata.items()}
        conditioned = ran.output_for_node("condition_op").meta["request"]

    assert (
        (said.num_inference_steps, said.guidance_scale, said.step_cache, said.sampler_mode)
        == (
            meta["num_inference_steps"],
            meta["guidance_scale"],
            meta["step_cache"],
            meta["sampler"]["mode"],
        )
        == (2, 3.5, "fbc", "native")
    )
    assert (meta["width"], meta["height"], meta["frames"], meta["fps"]) == (48, 32, 9, 16)
    assert {k: v for k, v in conditioned.items() if k != "seed"} == {
        k: v for k, v in checked.to_json().items() if k != "seed"
    }
    store.close()
