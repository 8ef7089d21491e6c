"""The Worker: one process's state and life. It boots (the device's ``performance`` check, the
device group, the registry with a heartbeat, the warm-up), then runs what it accepted on the
main thread, one at a time, taking back orphans and releasing idle weights between runs, until
SIGTERM; then it withdraws from the registry and stops.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import signal
import socket
import threading
import time
import uuid
from collections import deque
from http.server import ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from typing import Any

from orchestration.worker.execute import execute, tell_api
from orchestration.worker.group import start_group
from orchestration.worker.http import handler, loopback
from orchestration.worker.memory import admit, evict_if_idle, runtime_for
from orchestration.worker.recovery import scan_for_orphans
from orchestration.worker.snapshot import runtimes_snapshot
from shotloom.parallel import GroupSpec, RankGroup
from shotloom.performance import PerformanceError

log = logging.getLogger("shotloom.worker")


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

        from orchestration.storage import retry_run_writes, wait_out_postgres_outages
        from orchestration.worker.fence import Fence, sign_stage_writes
        from settings.server import RuntimeConfig

        self.name, self.device, self.threads, self.pool = name, device, threads, pool
        self.state_dir, self.warm = state_dir, warm
        self.runtime_cfg: RuntimeConfig = runtime_cfg or RuntimeConfig()
        self.fence = Fence(self)  # a worker cut off past its heartbeat timeout writes nothing more
        wait_out_postgres_outages(self.runtime_cfg.storage_outage_seconds)
        self.admission_plan: dict[str, Any] | None = None
        self.residency: dict[str, Any] | None = None
        self.boot_id = uuid.uuid4().hex
        self.instance = DagsterInstance.get()
        retry_run_writes(self.instance, self.runtime_cfg.storage_outage_seconds, gate=self.fence.check)
        sign_stage_writes(self)
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
                return True  # the launcher marked it CANCELING; execute() will not start it
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

    def _warm(self) -> None:
        started = time.perf_counter()
        if self.pool == "media":  # no model: load the code location its runs execute
            import orchestration.definitions  # noqa: F401

            log.info("%s warmed the code location in %.1fs", self.name, time.perf_counter() - started)
            return
        runtime = runtime_for(self)
        if admit(self, None, runtime):
            runtime.adapter  # noqa: B018 - loads the weights
            log.info("%s warmed %s in %.1fs", self.name, runtime.checkpoint_id, time.perf_counter() - started)

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
                published = registry.publish(dataclasses.replace(record, capabilities=caps))
                self.fence.beat(published.heartbeat)
            except Exception:  # storage busy: the next beat tries again (the timeout allows several)
                log.exception("%s: heartbeat failed", self.name)

    def serve(self, host: str, port: int, advertise: str | None = None) -> None:
        from orchestration.launcher import WORKER_TOKEN_ENV
        from orchestration.registry import WorkerRecord, WorkerRegistry

        if not os.environ.get(WORKER_TOKEN_ENV) and not loopback(host):
            raise SystemExit(f"{self.name}: binding {host} needs the token in {WORKER_TOKEN_ENV}")
        signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGTERM, self._on_signal)
        reader, writer = socket.socketpair()
        writer.setblocking(False)
        signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        threading.Thread(target=self._watch_signals, args=(reader,), name="signals", daemon=True).start()
        self._server = ThreadingHTTPServer((host, port), handler(self))
        self._server.daemon_threads = True
        self.url = f"http://{advertise or host}:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, name="status-http", daemon=True).start()
        if self.pool == "device":
            self._check_performance()
            if self.group_spec is not None:
                start_group(self, self.group_spec)
        registry = WorkerRegistry(self.instance.run_storage)
        record = WorkerRecord(self.name, self.url, os.getpid(), self.boot_id, self.device, self.pool)
        self.fence.beat(registry.publish(record).heartbeat)
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
            scan_for_orphans(self)
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
                    evict_if_idle(self)
                    if time.monotonic() - last_scan > self.runtime_cfg.orphan_scan_seconds:
                        last_scan = time.monotonic()
                        scan_for_orphans(self)
                    continue
                execute(self, run_id, resume)
        finally:
            try:
                registry.withdraw(self.name, self.boot_id)
            except Exception:
                log.exception("%s: could not withdraw from the registry", self.name)
            self._server.shutdown()
            if self.group is not None:
                self.group.close()
            log.info("%s stopped", self.name)

    # The nudge to the API after a run lives in execute.py; reachable here as Worker._tell_api.
    _tell_api = tell_api
