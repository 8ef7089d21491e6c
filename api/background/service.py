"""The threads that run the API's background duties (see :mod:`api.background`), each surviving
any error of its duty: a tick that fails is tried again at the next one."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from api.background.callbacks import Callbacks
from api.background.submitter import Submitter
from api.background.tracker import Tracker
from api.background.workers import WorkerStatuses
from api.dagster import DagsterUnavailable, Gateway
from api.store import Store, StoreUnavailable
from orchestration.registry import WorkerRegistry
from settings.api import ApiConfig

log = logging.getLogger("shotloom.api")
JOIN_TIMEOUT_S = 10.0


class Background:
    def __init__(
        self,
        store: Store,
        gateway: Gateway,
        api: ApiConfig,
        registry: WorkerRegistry | None,
        poll_seconds: float = 0.5,
        workers: WorkerStatuses | None = None,
    ):
        """``workers``: what the workers say of themselves (default: read from ``registry``)."""
        self.api = api
        self.poll_seconds = poll_seconds
        self.stopping = threading.Event()
        self.wake = threading.Event()  # an accepted job: submit now
        boot = time.time()
        self.worker_statuses = workers if workers is not None else WorkerStatuses(registry)
        self.callbacks = Callbacks(store, api, self.stopping)
        self.submitter = Submitter(store, gateway, self.callbacks, self.stopping, boot, more=self.wake)
        self.tracker = Tracker(
            store, gateway, api, self.submitter, self.callbacks, self.worker_statuses, boot
        )
        self._periodic: list[tuple[str, Callable[[], object], float]] = []
        self._threads: list[threading.Thread] = []
        self.started = False

    # -- what the routes read ---------------------------------------------------------------------
    @property
    def workers(self) -> dict[str, dict[str, Any]]:
        """The latest ``/status`` of each registered worker, by name."""
        return self.worker_statuses.snapshots

    @workers.setter
    def workers(self, snapshots: dict[str, dict[str, Any]]) -> None:
        self.worker_statuses.snapshots = snapshots

    def capabilities(self) -> dict[str, Any] | None:
        return self.worker_statuses.capabilities()

    @property
    def counters(self) -> dict[str, int]:
        return {
            **self.submitter.counters,
            **self.tracker.counters,
            "callbacks_delivered": self.callbacks.delivered,
        }

    @property
    def follow_wake(self) -> threading.Event:
        return self.tracker.wake

    # -- nudges -----------------------------------------------------------------------------------
    def run_ended(self) -> None:
        """A worker finished a run: the runs are read now rather than at the next tick."""
        self.tracker.wake.set()

    def poke(self) -> None:
        """A job was accepted: submit it now rather than at the next tick."""
        self.wake.set()

    # -- lifecycle --------------------------------------------------------------------------------
    def every(self, name: str, duty: Callable[[], object], seconds: float) -> None:
        """Run ``duty`` on its own thread every ``seconds`` once started (e.g. the job store sweep)."""
        self._periodic.append((name, duty, seconds))

    def start(self) -> None:
        loops = (
            ("submit", lambda: self._loop(self.submitter.submit_pending, self.wake)),
            ("follow", lambda: self._loop(self.tracker.follow_runs, self.tracker.wake)),
            (
                "workers",
                self._every(self.worker_statuses.refresh, self.api.workers_refresh_seconds, now=True),
            ),
            ("callbacks", self.callbacks.loop),
        )
        loops += tuple((name, self._every(duty, seconds)) for name, duty, seconds in self._periodic)
        for name, target in loops:
            t = threading.Thread(target=target, name=f"api-{name}", daemon=True)
            t.start()
            self._threads.append(t)
        self.started = True

    def stop(self) -> None:
        self.stopping.set()
        self.wake.set()
        self.tracker.wake.set()
        for t in self._threads:
            t.join(timeout=JOIN_TIMEOUT_S)

    def _every(self, duty: Callable[[], object], seconds: float, now: bool = False) -> Callable[[], None]:
        """A loop running ``duty`` every ``seconds`` (first at once when ``now``) until stopped."""

        def loop() -> None:
            first = now
            while first or not self.stopping.wait(seconds):
                first = False
                try:
                    duty()
                except Exception as exc:
                    log.warning("%s: %s", getattr(duty, "__name__", duty), exc)

        return loop

    def _loop(self, duty: Callable[[], object], pause: threading.Event) -> None:
        """Run ``duty`` every poll interval (or when ``pause`` is set), surviving any error."""
        down_since: float | None = None
        while not self.stopping.is_set():
            try:
                duty()
            except (DagsterUnavailable, StoreUnavailable) as exc:  # restarting, or away a while:
                if down_since is None:  # accepted jobs wait in the store; ticks go on
                    down_since = time.monotonic()
                    log.warning("%s unavailable, will retry: %s", _part(exc), exc)
            except Exception as exc:  # a locked DB, a bad answer...: next tick
                log.warning("%s: %s", getattr(duty, "__name__", duty), exc)
            else:
                if down_since is not None:
                    log.info("reachable again after %.1fs", time.monotonic() - down_since)
                    down_since = None
            # A rest of a whole interval after each tick (a worker's nudge ends it: a run ended).
            pause.wait(self.poll_seconds)
            pause.clear()


def _part(exc: Exception) -> str:
    return "the service's database" if isinstance(exc, StoreUnavailable) else "Dagster"
