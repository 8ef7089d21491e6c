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
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import queue
import signal
import socket
import sys
import threading
import time
import uuid
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from typing import Any

from shotloom.parallel import GroupSpec, ParallelConfig, RankGroup
from shotloom.performance import PerformanceError

log = logging.getLogger("shotloom.worker")
GROUP_LOST_EXIT = 75  # a rank of this worker's device group died: the whole group restarts


def pin_device(device: str, threads: int) -> str:
    """Set what torch reads at import time; returns the canonical device string."""
    kind, _, index = device.partition(":")
    if kind.isdigit():  # a bare CUDA logical id
        kind, index = "cuda", kind
    if kind == "cuda":
        os.environ["CUDA_VISIBLE_DEVICES"] = index or "0"
    elif kind == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # a CPU worker must never grab a GPU
    else:
        raise ValueError(f"unknown device {device!r} (cpu[:n], cuda:<id> or <id>)")
    if threads > 0:
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            os.environ[var] = str(threads)
    return f"{kind}:{index or 0}"


def resource_snapshot() -> dict[str, Any]:
    import psutil

    proc = psutil.Process()
    vm = psutil.virtual_memory()
    snap: dict[str, Any] = {
        "rss_bytes": proc.memory_info().rss,
        "cpu_percent": proc.cpu_percent(None),
        "ram_total_bytes": vm.total,
        "ram_available_bytes": vm.available,
    }
    torch = sys.modules.get("torch")  # never import torch from the status thread
    if torch is not None and torch.cuda.is_available():
        free, total = torch.cuda.mem_get_info()
        snap.update(gpu_free_bytes=free, gpu_total_bytes=total)
    return snap


_CAPABILITIES: dict[tuple, dict[str, Any]] = {}  # per runtime, kept when idle eviction releases it


def _capabilities(key: tuple, rt) -> dict[str, Any] | None:
    """What the model can do (the API refuses what it cannot before queueing); read once loaded."""
    if key not in _CAPABILITIES and rt.loaded:
        _CAPABILITIES[key] = dataclasses.asdict(rt.adapter.capabilities)
    return _CAPABILITIES.get(key)


def runtimes_snapshot() -> list[dict[str, Any]]:
    rt_module = sys.modules.get("shotloom.runtime")
    if rt_module is None:
        return []
    return [
        {
            "config": key[0],
            "device": key[1],
            "checkpoint": key[2],
            "loaded": rt.loaded,
            "loads": rt.loads,
            "generator_loads": rt.generator_loads,
            "location": rt.weight_location(),
            "capabilities": _capabilities(key, rt),
        }
        # While the warm-up thread still imports the module, RUNTIMES may not exist yet.
        for key, rt in list(getattr(rt_module, "RUNTIMES", {}).items())
    ]


class Worker:
    def __init__(
        self,
        name: str,
        device: str,
        threads: int,
        state_dir: Path,
        warm: bool,
        runtime_cfg=None,
        pool: str = "device",
        api_url: str | None = None,
        group: GroupSpec | None = None,
    ):
        from dagster import DagsterInstance

        from settings.server import RuntimeConfig

        self.name, self.device, self.threads, self.pool = name, device, threads, pool
        self.state_dir, self.warm = state_dir, warm
        self.runtime_cfg: RuntimeConfig = runtime_cfg or RuntimeConfig()
        self.admission_plan: dict[str, Any] | None = None
        self.residency: dict[str, Any] | None = None
        self.boot_id = uuid.uuid4().hex
        self.instance = DagsterInstance.get()
        self.lock = threading.Lock()
        self.state = "starting"  # starting -> warming -> idle <-> busy -> stopping
        self.run_id: str | None = None
        self.pending_run_id: str | None = None
        self.finished: deque[str] = deque(maxlen=256)
        self.runs_done = 0
        self.stopping = False
        self.inbox: queue.Queue[tuple[str, bool]] = queue.Queue()
        self.url = ""
        self.api_url = api_url  # told when a run ended (its follower reads runs now, not at its tick)
        self._server: ThreadingHTTPServer | None = None
        self.group_spec = group  # a device group: this worker is its rank 0 (shotloom.parallel)
        self.group: RankGroup | None = None

    # -- called from HTTP threads ---------------------------------------------
    def status(self) -> dict[str, Any]:
        with self.lock:
            base = {
                "name": self.name,
                "pool": self.pool,
                "device": self.device,
                "threads": self.threads,
                "nice": os.getpriority(os.PRIO_PROCESS, 0),
                "pid": os.getpid(),
                "boot_id": self.boot_id,
                "state": self.state,
                "run_id": self.run_id,
                "pending_run_id": self.pending_run_id,
                "finished_run_ids": list(self.finished),
                "runs_done": self.runs_done,
                "admission_plan": self.admission_plan,
                "dit_residency": self.residency,
                "residency_policy": self.runtime_cfg.dit_residency,
                "group": None
                if self.group is None
                else {
                    "ranks": self.group.ranks,
                    "parallel": self.group.spec.parallel.model_dump(),
                    "follower_pids": self.group.pids(),
                    "dead_ranks": self.group.dead(),
                },
            }
        runtimes = runtimes_snapshot()
        return {
            **base,
            "weights": runtimes,
            "weights_loaded": any(r["loaded"] for r in runtimes),
            "weight_location": next((r["location"] for r in runtimes), "released"),
            "capabilities": next((r["capabilities"] for r in runtimes if r["capabilities"]), None),
            "loads": sum(r["loads"] for r in runtimes),
            "resources": resource_snapshot(),
        }

    def accept(self, run_id: str, resume: bool) -> bool:
        with self.lock:
            if self.state != "idle":
                return False
            self.state, self.pending_run_id = "busy", run_id
        self.inbox.put((run_id, resume))
        return True

    def terminate(self, run_id: str) -> bool:
        with self.lock:
            if self.pending_run_id == run_id:
                return True  # the launcher marked it CANCELING; _execute will not start it
            if self.run_id != run_id:
                return False
        # Delivered to the main thread: Dagster's handler raises DagsterExecutionInterruptedError
        # inside op code (or at the next step boundary), so the run ends CANCELED.
        import _thread

        _thread.interrupt_main(signal.SIGINT)
        return True

    # -- main thread ----------------------------------------------------------
    def _check_performance(self) -> None:
        """Refuse to start (exit 2, the key in the log) on a ``performance`` choice this device
        cannot do, before taking any run; what needs the model is proven at warm-up."""
        from shotloom.config import load_inference_config
        from shotloom.performance import check_device

        cfg = load_inference_config()
        try:
            check_device(cfg.performance, self.device, cfg.dtype)
        except PerformanceError as exc:
            log.error("%s: %s", self.name, exc)
            raise SystemExit(2) from exc

    def _start_group(self, spec: GroupSpec) -> None:
        """Start the group's other ranks and join them (before this worker offers itself), and
        watch them: a rank that dies takes the whole group down (this process exits), so
        server.py restarts it whole and the run it was on resumes as after any worker's death."""

        def lost(dead: list[int]) -> None:
            log.error(
                "%s: rank(s) %s of its group died or fell out of step; restarting the group", self.name, dead
            )
            os._exit(GROUP_LOST_EXIT)

        self.group = RankGroup(spec, on_lost=lost)
        started = time.perf_counter()
        self.group.start()
        log.info(
            "%s: joined a group of %d ranks in %.1fs",
            self.name,
            self.group.ranks,
            time.perf_counter() - started,
        )

        def watch() -> None:
            while not self.stopping:
                dead = self.group.dead() if self.group is not None else []
                if dead:
                    lost(dead)
                time.sleep(0.5)

        threading.Thread(target=watch, name="group-watch", daemon=True).start()

    def loads(self) -> int:
        return sum(r["loads"] for r in runtimes_snapshot())

    def _runtime(self):
        """The process's runtime, reached through the resource the ops use (same registry key)."""
        from resources.model_runtime import ModelRuntimeResource
        from shotloom.admission import Headroom

        rt = ModelRuntimeResource().get()
        rc = self.runtime_cfg
        rt.headroom = Headroom.from_env(
            Headroom(gpu_fraction=rc.gpu_headroom_fraction, ram_fraction=rc.ram_headroom_fraction)
        )
        if self.group is not None and rt.group is None:  # rank 0: its denoises run on the group
            from shotloom.admission import GroupProbe

            rt.group = self.group
            rt.probe = GroupProbe.of(rt.device, self.group.ranks)  # a job must fit on every device
        if not rt.loaded:  # residency is chosen before a load, from live free memory
            self.residency = rt.apply_residency(rc.dit_residency).to_json()
        return rt

    def _warm(self) -> None:
        started = time.perf_counter()
        if self.pool == "media":  # no model: load the code location its runs execute
            import orchestration.definitions  # noqa: F401

            log.info("%s warmed the code location in %.1fs", self.name, time.perf_counter() - started)
            return
        runtime = self._runtime()
        if self._admit(None, runtime):
            runtime.adapter  # noqa: B018 - loads the weights
            log.info("%s warmed %s in %.1fs", self.name, runtime.checkpoint_id, time.perf_counter() - started)

    def _admit(self, run_id: str | None, rt) -> bool:
        """Wait until the job fits in live memory; False if it never can or was canceled meanwhile."""
        from dagster import DagsterRunStatus

        from resources import run_state
        from shotloom import stages

        waiting = False
        while True:
            plan = rt.admission_plan()
            self.admission_plan = plan.to_json()
            tags = {stages.ADMISSION_TAG: json.dumps(self.admission_plan)}
            if plan.verdict == "admit":
                if run_id is not None:
                    self.instance.add_run_tags(run_id, tags)
                return True
            if run_id is None:  # warm-up: leave it to the first run
                log.warning("%s: not warming: %s", self.name, plan.message)
                return False
            run = self.instance.get_run_by_id(run_id)
            if plan.verdict == "never":
                self.instance.add_run_tags(run_id, tags)
                self.instance.report_run_failed(run, f"Can never fit on {self.device}: {plan.message}")
                return False
            if run is None or run.status == DagsterRunStatus.CANCELING:
                self.instance.report_run_canceled(run, "Canceled while waiting for memory.")
                return False
            if not waiting:
                run_state.record(
                    self.instance,
                    run_id,
                    {**tags, **stages.stage_tags(stages.WAITING_FOR_MEMORY)},
                    f"Waiting for memory: {plan.message}",
                )
                waiting = True
            if self.stopping:
                return False  # leave it STARTING: run monitoring hands it to the next worker
            time.sleep(self.runtime_cfg.admission_poll_seconds)

    def _recover_orphans(self) -> None:
        """Take back runs that nobody will start: run monitoring only times STARTING runs out
        (after start_timeout_seconds), so an idle worker does it, oldest first, with stage
        ``recovered``. Four ways a run ends up so: this worker's earlier boot died between
        claiming and starting it; the daemon died between binding it to this worker (tags first)
        and handing it over; the daemon died after marking it STARTING but before binding it to
        any worker; or the worker (or its whole host) it was bound to is dead in the registry.
        The last two may be taken by any idle worker of the pool, on any host: an exclusive claim
        in the shared storage decides. A STARTED run is left to run monitoring, which resumes it.
        """
        from dagster import DagsterRunStatus, RunsFilter

        from orchestration.launcher import BOOT_TAG, PID_TAG, POOL_TAGS, WORKER_TAG
        from orchestration.registry import WorkerRegistry
        from resources import run_state
        from shotloom import stages

        records = self.instance.get_run_records(
            RunsFilter(statuses=[DagsterRunStatus.STARTING], tags={POOL_TAGS[self.pool]: "1"})
        )
        now = time.time()
        registry = WorkerRegistry(self.instance.run_storage)

        def owner_dead(run) -> bool:
            owner = registry.get(run.tags[WORKER_TAG])
            return (
                owner is None
                or owner.boot_id != run.tags.get(BOOT_TAG)
                or not owner.alive(self.runtime_cfg.heartbeat_timeout_seconds)
            )

        def orphaned(record) -> bool:
            run = record.dagster_run
            stale = now - record.update_timestamp.timestamp() > self.runtime_cfg.handover_grace_seconds
            owner = run.tags.get(WORKER_TAG)
            if owner is None:
                return stale
            if owner != self.name:
                return stale and owner_dead(run)
            return run.tags.get(BOOT_TAG) != self.boot_id or (stale and run.run_id not in self.finished)

        for record in sorted(filter(orphaned, records), key=lambda r: r.create_timestamp):
            run_id = record.dagster_run.run_id
            with self.lock:
                if self.stopping or self.state not in ("idle", "warming"):
                    return
                before, self.state = self.state, "busy"  # the launcher now gets 409
            mine = record.dagster_run.tags.get(WORKER_TAG) == self.name
            if not mine and not registry.claim(run_id, self.name):
                with self.lock:
                    self.state = before  # another worker took it
                continue
            log.info("%s: recovering run %s that was never started", self.name, run_id)
            run_state.record(
                self.instance,
                run_id,
                {
                    WORKER_TAG: self.name,
                    BOOT_TAG: self.boot_id,
                    PID_TAG: str(os.getpid()),
                    **stages.stage_tags(stages.RECOVERED),
                },
            )
            self._execute(run_id, resume=False)
            with self.lock:
                if not self.stopping:
                    self.state = "idle"

    def _scan_for_orphans(self) -> None:
        try:
            self._recover_orphans()
        except Exception:  # storage busy, a run deleted meanwhile...: the next scan tries again
            log.exception("%s: scanning for orphaned runs failed", self.name)

    def _evict_if_idle(self) -> None:
        idle = self.runtime_cfg.idle_seconds
        if idle <= 0:
            return
        for rt in self._loaded_runtimes():
            if time.monotonic() - rt.last_used >= idle:
                log.info("%s: idle %.0fs, releasing %s", self.name, idle, rt.checkpoint_id)
                rt.release()

    @staticmethod
    def _loaded_runtimes() -> list:
        rt_module = sys.modules.get("shotloom.runtime")
        return [rt for rt in rt_module.RUNTIMES.values() if rt.loaded] if rt_module else []

    def _execute(self, run_id: str, resume: bool) -> None:
        from dagster import DagsterRunStatus
        from dagster._core.errors import DagsterExecutionInterruptedError
        from dagster._grpc.impl import core_execute_run
        from dagster._utils.hosted_user_process import recon_job_from_origin
        from dagster._utils.interrupts import capture_interrupts

        with self.lock:
            self.run_id, self.pending_run_id = run_id, None
        started = time.perf_counter()
        try:
            run = self.instance.get_run_by_id(run_id)
            if run is None or run.is_finished:
                return
            if run.status == DagsterRunStatus.CANCELING:
                self.instance.report_run_canceled(run, "Canceled before the device worker started it.")
                return
            if run.job_code_origin is None:
                self.instance.report_run_failed(run, "Run has no job code origin.")
                return
            if self.pool == "device" and not self._admit(run_id, self._runtime()):
                return
            recon_job = recon_job_from_origin(run.job_code_origin)
            with capture_interrupts():
                try:
                    if resume:
                        events = self._resume_from_last_finished_step(recon_job, run)
                    else:
                        events = core_execute_run(recon_job, run, self.instance, inject_env_vars=False)
                    for _event in events:
                        pass
                except (KeyboardInterrupt, DagsterExecutionInterruptedError):
                    log.info("%s: run %s interrupted", self.name, run_id)
        except Exception as exc:
            # core_execute_run reports its own failures; what raised before it (admission, recon)
            # must not leave the run STARTING forever (the health check would call it finished).
            log.exception("%s: run %s raised", self.name, run_id)
            self._fail_unfinished(run_id, f"Device worker {self.name} could not run it: {exc!r}")
        finally:
            self._after_run(run_id)
            log.info("%s: run %s done in %.2fs", self.name, run_id, time.perf_counter() - started)

    def _resume_from_last_finished_step(self, recon_job, run):
        """Execute a run whose worker died, from the steps that had not finished. The finished ones
        stored their outputs through the IO manager (safetensors under the run id), from which the
        remaining steps load them: conditioning and denoise are not redone when a worker dies while
        decoding. (Dagster's ``core_execute_run`` with ``resume_from_failure`` re-runs every step of
        an in-process executor, and reloads the run, so the subset is applied here.)"""
        from dagster import DagsterEventType
        from dagster._core.execution.api import execute_run_iterator

        snapshot = self.instance.get_execution_plan_snapshot(run.execution_plan_snapshot_id)
        if run.has_repository_load_data:
            recon_job = recon_job.with_repository_load_data(snapshot.repository_load_data)
        records = self.instance.get_records_for_run(run.run_id, of_type=DagsterEventType.STEP_SUCCESS).records
        succeeded = {r.event_log_entry.step_key for r in records}
        planned = run.step_keys_to_execute or [step.key for step in snapshot.steps]
        # Kept: the leading steps (plan order) that finished and whose outputs this host can read
        # (a run resumed on another host without shared step storage starts over).
        finished: list[str] = []
        for key in planned:
            if key not in succeeded or not _outputs_here(run.run_id, key):
                break
            finished.append(key)
        remaining = planned[len(finished) :]
        if finished and remaining:
            self.instance.report_engine_event(
                f"Resuming from the last finished step: {', '.join(sorted(finished))} kept; "
                f"running {', '.join(remaining)}",
                run,
            )
            run = run._replace(step_keys_to_execute=remaining)
        return execute_run_iterator(recon_job, run, self.instance, resume_from_failure=True)

    def _fail_unfinished(self, run_id: str, message: str) -> None:
        try:
            run = self.instance.get_run_by_id(run_id)
            if run is not None and not run.is_finished:
                self.instance.report_run_failed(run, message)
        except Exception:
            log.exception("%s: could not report %s as failed", self.name, run_id)

    def _after_run(self, run_id: str) -> None:
        from dagster import DagsterRunStatus

        from orchestration.launcher import LOADS_TAG
        from resources import run_state
        from shotloom import stages

        final = {
            DagsterRunStatus.SUCCESS: stages.SUCCEEDED,
            DagsterRunStatus.FAILURE: stages.FAILED,
            DagsterRunStatus.CANCELED: stages.CANCELED,
        }
        try:
            run = self.instance.get_run_by_id(run_id)
            if run is not None and run.status == DagsterRunStatus.CANCELING:
                # Interrupted before Dagster could record it (e.g. the run never reached a step).
                self.instance.report_run_canceled(run, "Canceled on the device worker.")
                run = self.instance.get_run_by_id(run_id)
            tags = {LOADS_TAG: str(self.loads())} if self.pool == "device" else {}
            if run is not None and run.status in final:
                tags.update(stages.stage_tags(final[run.status]))
            run_state.record(self.instance, run_id, tags)
            for rt in self._loaded_runtimes():
                rt.after_run()  # idle clock, measured CUDA peak
        except Exception:
            log.exception("%s: could not finish bookkeeping for %s", self.name, run_id)
        with self.lock:
            self.run_id = None
            self.finished.append(run_id)
            self.runs_done += 1
            self.state = "stopping" if self.stopping else "idle"
        if self.api_url:
            threading.Thread(target=self._tell_api, args=(run_id,), daemon=True).start()

    def _tell_api(self, run_id: str) -> None:
        """A nudge, nothing more: a missed one costs the API one follow tick."""
        import urllib.request

        from orchestration.launcher import worker_auth_headers

        request = urllib.request.Request(
            f"{self.api_url}/internal/run-ended", data=b"", method="POST", headers=worker_auth_headers()
        )
        try:
            urllib.request.urlopen(request, timeout=1.0).close()
        except OSError as exc:
            log.debug("%s: could not tell the API that %s ended: %s", self.name, run_id, exc)

    def _on_signal(self, signo: int, _frame: FrameType | None) -> None:
        # Installed between runs. SIGINT there is a terminate that raced the run's end: never die.
        # SIGTERM is handled by _watch_signals (Dagster re-maps SIGTERM's handler during runs).
        log.info("%s: signal %d outside a run", self.name, signo)

    def _watch_signals(self, wakeup: socket.socket) -> None:
        """See every SIGTERM, whoever's Python handler is installed (Dagster's own during a run).

        The C-level handler writes each caught signal's number to the wakeup fd; during a run
        Dagster's handler has already interrupted it (the run is left for run monitoring to
        resume), so this only has to stop the loop.
        """
        while True:
            data = wakeup.recv(64)
            if not data:
                return
            if signal.SIGTERM in data:
                with self.lock:
                    self.stopping = True
                    if self.state in ("idle", "starting", "warming"):
                        self.state = "stopping"

    def _heartbeat(self, registry, record) -> None:
        """Refresh the record in the shared registry: the launcher judges liveness by it."""
        while True:
            time.sleep(self.runtime_cfg.heartbeat_seconds)
            caps = next((r["capabilities"] for r in runtimes_snapshot() if r["capabilities"]), None)
            try:
                registry.publish(dataclasses.replace(record, capabilities=caps))
            except Exception:  # storage busy: the next beat tries again (the timeout allows several)
                log.exception("%s: heartbeat failed", self.name)

    def serve(self, host: str, port: int, advertise: str | None = None) -> None:
        from orchestration.launcher import WORKER_TOKEN_ENV
        from orchestration.registry import WorkerRecord, WorkerRegistry

        if not os.environ.get(WORKER_TOKEN_ENV) and not _loopback(host):
            raise SystemExit(f"{self.name}: binding {host} needs the token in {WORKER_TOKEN_ENV}")
        signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGTERM, self._on_signal)
        reader, writer = socket.socketpair()
        writer.setblocking(False)
        signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        threading.Thread(target=self._watch_signals, args=(reader,), name="signals", daemon=True).start()
        self._server = ThreadingHTTPServer((host, port), _handler(self))
        self._server.daemon_threads = True
        self.url = f"http://{advertise or host}:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, name="status-http", daemon=True).start()
        if self.pool == "device":
            self._check_performance()
            if self.group_spec is not None:
                self._start_group(self.group_spec)
        registry = WorkerRegistry(self.instance.run_storage)
        record = WorkerRecord(self.name, self.url, os.getpid(), self.boot_id, self.device, self.pool)
        registry.publish(record)
        threading.Thread(target=self._heartbeat, args=(registry, record), daemon=True).start()
        log.info("%s (%s, pid %d) at %s boot %s", self.name, self.device, os.getpid(), self.url, self.boot_id)
        try:
            if self.warm and not self.stopping:
                with self.lock:
                    self.state = "warming"
                try:
                    self._warm()
                except PerformanceError as exc:  # the operator's choice cannot work here: say so, stop
                    log.error("%s: %s", self.name, exc)
                    raise SystemExit(2) from exc
                except Exception:
                    log.exception("%s: warm-up failed; runs will load the model themselves", self.name)
            self._scan_for_orphans()
            last_scan = time.monotonic()
            with self.lock:
                if not self.stopping:
                    self.state = "idle"
            signal.signal(signal.SIGTERM, self._on_signal)
            # A run accepted just before SIGTERM is still executed: it is STARTING and nothing
            # else would pick it up until the start timeout.
            while not (self.stopping and self.inbox.empty()):
                try:
                    run_id, resume = self.inbox.get(timeout=0.5)
                except queue.Empty:
                    self._evict_if_idle()
                    if time.monotonic() - last_scan > self.runtime_cfg.orphan_scan_seconds:
                        last_scan = time.monotonic()
                        self._scan_for_orphans()
                    continue
                self._execute(run_id, resume)
        finally:
            try:
                registry.withdraw(self.name, self.boot_id)
            except Exception:
                log.exception("%s: could not withdraw from the registry", self.name)
            self._server.shutdown()
            if self.group is not None:
                self.group.close()
            log.info("%s stopped", self.name)


def _outputs_here(run_id: str, step_key: str) -> bool:
    """The step's outputs are in this host's step storage (the IO manager's files)."""
    from resources.tensor_io import default_storage_dir

    folder = Path(default_storage_dir()) / run_id / step_key
    return folder.is_dir() and any(folder.iterdir())


def _loopback(host: str) -> bool:
    import ipaddress

    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _handler(worker: Worker) -> type[BaseHTTPRequestHandler]:
    import hmac

    from orchestration.launcher import WORKER_TOKEN_ENV

    token = os.environ.get(WORKER_TOKEN_ENV, "")

    class Handler(BaseHTTPRequestHandler):
        def _authorized(self) -> bool:
            """Only the control plane (holding the shared token, when one is set) may call."""
            if not token:
                return True
            given = self.headers.get("Authorization", "")
            if hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
                return True
            self._send(401, {"error": "a worker answers the control plane only"})
            return False

        def _send(self, code: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> dict[str, Any]:
            length = int(self.headers.get("Content-Length") or 0)
            return json.loads(self.rfile.read(length) or b"{}") if length else {}

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            if not self._authorized():
                return
            if self.path == "/status":
                self._send(200, worker.status())
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self) -> None:  # noqa: N802
            if not self._authorized():
                return
            parts = self.path.strip("/").split("/")
            if parts == ["runs"]:
                body = self._body()
                ok = worker.accept(str(body["run_id"]), bool(body.get("resume")))
                info = {"accepted": ok, "pid": os.getpid(), "boot_id": worker.boot_id}
                self._send(202 if ok else 409, info)
            elif len(parts) == 3 and parts[0] == "runs" and parts[2] == "terminate":
                ok = worker.terminate(parts[1])
                self._send(202 if ok else 409, {"terminated": ok})
            else:
                self._send(404, {"error": "not found"})

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet access log
            log.debug(format, *args)

    return Handler


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pool", choices=("device", "media"), default="device", help="which runs it takes")
    parser.add_argument("--device", default="cpu:0", help="cpu[:n], cuda:<logical id> or <id>")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    parser.add_argument("--nice", type=int, default=0, help="add this to the process's niceness")
    parser.add_argument("--name", default="", help="registry name (default: from the device)")
    parser.add_argument("--state-dir", default=os.environ.get("SHOTLOOM_STATE_DIR", "var/server"))
    parser.add_argument("--host", default="127.0.0.1", help="bind address (loopback unless a token is set)")
    parser.add_argument("--advertise", default="", help="host others reach it by (default: --host)")
    parser.add_argument("--port", type=int, default=0, help="status port (0 = any free port)")
    parser.add_argument("--no-warm", dest="warm", action="store_false", help="load weights on first run")
    parser.add_argument("--server-config", default="", help="server YAML (its runtime section)")
    parser.add_argument(
        "--group-ids", default="", help="a device group: its devices, e.g. 0,1 (rank 0 first)"
    )
    parser.add_argument("--parallel", default="", help='a group\'s split, JSON: {"ulysses": 2}')
    args = parser.parse_args(argv)

    device = pin_device(args.device, args.threads)  # before anything imports torch
    group = None
    if args.group_ids:
        kind = device.partition(":")[0]
        if kind == "cuda":  # every rank sees the group's devices; rank r uses logical id r
            os.environ["CUDA_VISIBLE_DEVICES"] = args.group_ids
        device = f"{kind}:0"
        group = GroupSpec(
            parallel=ParallelConfig.model_validate_json(args.parallel or "{}"),
            device_type=kind,
            threads=args.threads,
        )
    if args.nice > 0:
        os.nice(args.nice)  # torch's threads, started later, inherit it
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.threads > 0 and args.pool == "device":  # media workers never load torch
        import torch

        torch.set_num_threads(args.threads)
    name = args.name or device.replace(":", "-")
    from settings.server import RuntimeConfig, ServerConfig

    server = ServerConfig.load(args.server_config) if args.server_config else None
    runtime_cfg = server.runtime if server else RuntimeConfig()
    api_url = server.api.local_url() if server else None
    worker = Worker(
        name, device, args.threads, Path(args.state_dir), args.warm, runtime_cfg, args.pool, api_url, group
    )
    worker.serve(args.host, args.port, args.advertise or None)


if __name__ == "__main__":
    main()
