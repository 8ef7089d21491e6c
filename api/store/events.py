"""What the store tells its observers after a write commits: a job accepted, a job finished, a
callback delivery attempted.

Each is told once, fleet-wide, by the process whose write made it so (the insert that created
the job; the update that moved it from unfinished to finished, under its row lock; the attempt
recorded): counters fed from here can be summed over several API processes without counting a
job twice. An observer's error is logged, never raised into the write that already committed.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from api.core.records import JobRecord
    from api.store.outbox import CallbackDelivery

log = logging.getLogger("shotloom.api")


class StoreObserver(Protocol):
    def job_accepted(self, job: JobRecord) -> None: ...

    def job_finished(self, job: JobRecord) -> None: ...

    def delivery_attempted(self, delivery: CallbackDelivery) -> None: ...


class StoreEvents:
    """The observers of one store, told in the order they were added."""

    def __init__(self) -> None:
        self._observers: list[StoreObserver] = []

    def add(self, observer: StoreObserver) -> None:
        self._observers.append(observer)

    def remove(self, observer: StoreObserver) -> None:
        self._observers = [o for o in self._observers if o is not observer]

    def job_accepted(self, job: JobRecord) -> None:
        self._tell("job_accepted", job)

    def job_finished(self, job: JobRecord) -> None:
        self._tell("job_finished", job)

    def delivery_attempted(self, delivery: CallbackDelivery) -> None:
        self._tell("delivery_attempted", delivery)

    def _tell(self, event: str, record: object) -> None:
        for observer in self._observers:
            try:
                getattr(observer, event)(record)
            except Exception:
                log.exception("a store observer failed on %s", event)
