"""The job service: accept shots and merges from any dialect, read, list, cancel and delete jobs.

One facade over its two halves, :class:`~api.core.intake.Intake` (accepting) and
:class:`~api.core.lifecycle.Lifecycle` (everything after), which share
:class:`~api.core.shared.SharedSteps`. The job row is committed before the answer is sent, and the
Dagster run is submitted afterwards by :class:`api.background.Background`, which also reconciles
accepted-but-unsubmitted jobs at start. No torch, no HTTP types.
"""

from __future__ import annotations

from api.core.intake import Intake
from api.core.lifecycle import Lifecycle
from api.core.shared import VIDEO_KIND, Accepted, run_kind

__all__ = ["VIDEO_KIND", "Accepted", "JobService", "run_kind"]


class JobService(Intake, Lifecycle):
    """The write and lifecycle side of every dialect.

    ``capabilities`` returns what the loaded model can do, as the device workers publish it (None
    until one has loaded it). ``defaults`` are the inference YAML's, which fill what a request
    leaves out; ``sampler_for`` gives the sampler a request with an adapter (or none) runs with
    (the inference YAML's ``sampler_for``; default: a dmd sampler with the default sigmas);
    ``performance`` is the model's (the inference YAML's), whose step cache presets a request may
    choose from (default: none declared).
    ``terminate`` cancels a Dagster run (the follower's gateway).
    """
