"""The runtime's memory, as the server YAML's ``runtime`` section sets it: headroom fractions,
the DiT residency (auto/resident/swap), admission by live memory (``shotloom.admission``: a job
that does not fit now waits, stage ``waiting_for_memory``; one that never can fails with the
figures) and idle eviction.
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING

from orchestration.worker.snapshot import loaded_runtimes

if TYPE_CHECKING:
    from orchestration.worker.process import Worker

log = logging.getLogger("shotloom.worker")


def runtime_for(worker: Worker):
    """The process's runtime, reached through the resource the ops use (same registry key)."""
    from resources.model_runtime import ModelRuntimeResource
    from shotloom.admission import Headroom

    rt = ModelRuntimeResource().get()
    rc = worker.runtime_cfg
    rt.headroom = Headroom.from_env(
        Headroom(gpu_fraction=rc.gpu_headroom_fraction, ram_fraction=rc.ram_headroom_fraction)
    )
    if worker.group is not None and rt.group is None:  # rank 0: its denoises run on the group
        from shotloom.admission import GroupProbe

        rt.group = worker.group
        rt.probe = GroupProbe.of(rt.device, worker.group.ranks)  # a job must fit on every device
    if not rt.loaded:  # residency is chosen before a load, from live free memory
        worker.residency = rt.apply_residency(rc.dit_residency).to_json()
    return rt


def admit(worker: Worker, run_id: str | None, rt) -> bool:
    """Wait until the job fits in live memory; False if it never can or was canceled meanwhile."""
    from dagster import DagsterRunStatus

    from contracts import events
    from contracts.tags import ADMISSION_TAG
    from resources import run_state
    from shotloom import stages

    waiting = False
    while True:
        plan = rt.admission_plan()
        worker.admission_plan = plan.to_json()
        tags = {ADMISSION_TAG: json.dumps(worker.admission_plan)}
        if plan.verdict == "admit":
            if run_id is not None:
                worker.instance.add_run_tags(run_id, tags)
            return True
        if run_id is None:  # warm-up: leave it to the first run
            log.warning("%s: not warming: %s", worker.name, plan.message)
            return False
        run = worker.instance.get_run_by_id(run_id)
        if plan.verdict == "never":
            worker.instance.add_run_tags(run_id, tags)
            worker.instance.report_run_failed(run, f"Can never fit on {worker.device}: {plan.message}")
            return False
        if run is None or run.status == DagsterRunStatus.CANCELING:
            worker.instance.report_run_canceled(run, "Canceled while waiting for memory.")
            return False
        if not waiting:
            run_state.record(
                worker.instance,
                run_id,
                {**tags, **events.stage_tags(stages.WAITING_FOR_MEMORY)},
                f"Waiting for memory: {plan.message}",
            )
            waiting = True
        if worker.stopping:
            return False  # leave it STARTING: run monitoring hands it to the next worker
        time.sleep(worker.runtime_cfg.admission_poll_seconds)


def evict_if_idle(worker: Worker) -> None:
    idle = worker.runtime_cfg.idle_seconds
    if idle <= 0:
        return
    for rt in loaded_runtimes():
        if time.monotonic() - rt.last_used >= idle:
            log.info("%s: idle %.0fs, releasing %s", worker.name, idle, rt.checkpoint_id)
            rt.release()
