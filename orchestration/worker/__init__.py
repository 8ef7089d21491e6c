"""Long-lived worker: one process per device, model loaded once, runs executed in-process.

    python -m orchestration.worker --device cpu:0 --threads 1 --state-dir var/server
    python -m orchestration.worker --pool media --name media-0 --state-dir var/server

A device worker runs generations on its device. A media worker (``--pool media``) runs the
light media jobs (merges) on the CPU with no model: warm, so a merge takes milliseconds of
work plus the hand-over, never waiting behind a generation nor holding a device.

The worker pins its device (``CUDA_VISIBLE_DEVICES``, thread counts) before torch
is imported, optionally warms the model, registers itself in the shared registry
(``orchestration.registry``, with a heartbeat) and serves a small HTTP endpoint (only to the
control plane's token when ``SHOTLOOM_WORKER_TOKEN`` is set):

    GET  /status                 device, boot id, current run, weights, resource snapshot, admission plan
    POST /runs {run_id, resume}  accept a run if idle (202) or refuse (409)
    POST /runs/<id>/terminate    interrupt that run; the process and its weights survive

Runs execute on the MAIN thread, one at a time, through Dagster's own run-worker
entry point (``core_execute_run``): ``capture_interrupts`` and the SIGINT handling
inside step execution only work there, which is what makes cancel immediate and
clean. The HTTP endpoint lives on a daemon thread. The model registry
(``shotloom.runtime.RUNTIMES``) is process-level, so every run reuses the weights.

Before it runs a job the worker admits it by live memory (``shotloom.admission``):
a job that does not fit now waits (stage ``waiting_for_memory``), one that never can
fails with the figures. The server YAML's ``runtime`` section sets the DiT residency
(auto/resident/swap), headroom fractions and idle eviction.

One idea a module:

    __main__   the command line: pin the device before torch is imported, build the Worker, serve
    process    the Worker: its state, boot (checks, group, registry, warm-up), main loop, signals, stop
    group      a device group's other ranks: started, joined, watched (one dies: the group restarts)
    memory     the runtime's memory policy: headroom and residency, admission by live memory, idle eviction
    execute    one run on the main thread: execute or resume it, then its bookkeeping and the API's nudge
    recovery   runs nobody will start (orphans), taken back by an idle worker
    fence      a worker cut off past its heartbeat timeout exits before writing, if its run moved on
    http       the endpoint the control plane calls (/status, /runs, terminate) and who may call it
    snapshot   what /status and the heartbeat report: state, weights, capabilities, resources
"""

from orchestration.worker.group import GROUP_LOST_EXIT
from orchestration.worker.process import Worker
from orchestration.worker.snapshot import resource_snapshot, runtimes_snapshot

__all__ = ["GROUP_LOST_EXIT", "Worker", "resource_snapshot", "runtimes_snapshot"]
