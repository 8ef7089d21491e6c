"""Bounds every dialect checks a request against at intake, so a value the worker cannot take is
refused naming the client's field before anything is queued. No HTTP types."""

from __future__ import annotations

from shotloom.request import MAX_SEED  # a larger seed overflows torch.manual_seed after queueing

__all__ = ["MAX_SEED"]
