"""The run queue: Dagster's QueuedRunCoordinator with a sub-second dequeue interval.

The stock coordinator takes whole seconds, and a run submitted to idle workers waits on
average half an interval plus one daemon iteration before it is launched: with 1 s that
was the largest piece of the per-run orchestration overhead (bench/scheduler.py). The
daemon's interval loop sleeps in 0.5 s slices, so intervals below 0.5 s behave as 0.5 s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dagster import Field, Float
from dagster._config.config_schema import UserConfigSchema
from dagster._core.run_coordinator.queued_run_coordinator import QueuedRunCoordinator


class DeviceRunCoordinator(QueuedRunCoordinator):
    def __init__(self, dequeue_interval_seconds: float | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        if dequeue_interval_seconds is not None:
            if dequeue_interval_seconds <= 0:
                raise ValueError(f"dequeue_interval_seconds must be > 0, got {dequeue_interval_seconds}")
            self._dequeue_interval_seconds = float(dequeue_interval_seconds)  # type: ignore[assignment]

    @property
    def dequeue_interval_seconds(self) -> float:  # type: ignore[override]
        return self._dequeue_interval_seconds

    @classmethod
    def config_type(cls) -> UserConfigSchema:
        schema: Mapping[str, Any] = super().config_type()  # type: ignore[assignment]
        return {
            **schema,
            "dequeue_interval_seconds": Field(
                Float,
                is_required=False,
                description="How often the daemon checks the queue (seconds; may be fractional).",
            ),
        }
