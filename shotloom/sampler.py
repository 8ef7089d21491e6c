"""Few-step DMD sampling on diffusers' flow-match scheduler.

DMD = predict x0, then re-noise to the next sigma. ``FlowMatchEulerDiscreteScheduler``
with ``stochastic_sampling=True`` does exactly that. Some pipelines (Wan) call
``set_timesteps(num_steps)`` themselves and take no ``sigmas=``, so the scheduler
here pins the YAML's sigma list and ignores what the pipeline asks.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch
from diffusers import FlowMatchEulerDiscreteScheduler


class DMDScheduler(FlowMatchEulerDiscreteScheduler):
    pinned_sigmas: list[float] | None = None

    def set_timesteps(self, num_inference_steps=None, device=None, sigmas=None, mu=None, timesteps=None):
        if self.pinned_sigmas is not None:
            sigmas, num_inference_steps, timesteps = list(self.pinned_sigmas), None, None
        return super().set_timesteps(
            num_inference_steps=num_inference_steps, device=device, sigmas=sigmas, mu=mu, timesteps=timesteps
        )


def make_dmd_scheduler(base_config, sigmas: list[float], shift: float) -> DMDScheduler:
    """A DMD scheduler from a pipeline's scheduler config and the YAML's sampler section."""
    # Everything else that reshapes a sigma list is switched off: e.g. LTX-2's config stretches the
    # schedule to end at shift_terminal=0.1, which would replace the YAML's last sigma.
    sched = DMDScheduler.from_config(
        base_config,
        stochastic_sampling=True,
        shift=shift,
        use_dynamic_shifting=False,
        shift_terminal=None,
        invert_sigmas=False,
        use_karras_sigmas=False,
        use_exponential_sigmas=False,
        use_beta_sigmas=False,
    )
    sched.pinned_sigmas = list(sigmas)
    return sched


@contextmanager
def pinned(scheduler: DMDScheduler, sigmas: list[float]) -> Iterator[None]:
    """Pin ``sigmas`` (e.g. a video-to-video tail of the YAML's) on a DMD scheduler for a while."""
    saved, scheduler.pinned_sigmas = scheduler.pinned_sigmas, list(sigmas)
    try:
        yield
    finally:
        scheduler.pinned_sigmas = saved


def strength_schedule(sigmas: list[float], strength: float | None) -> list[float]:
    """The sigmas a video-to-video generation samples: from the first one at or below
    ``strength`` on (at least the last one). ``None`` (no source video): all of them."""
    if strength is None:
        return list(sigmas)
    tail = [s for s in sigmas if s <= strength + 1e-9]
    return tail or [sigmas[-1]]


def seed_everything(seed: int) -> torch.Generator:
    """Seed the global RNGs (Wan's re-noise uses them) and return a seeded generator."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    return torch.Generator("cpu").manual_seed(seed)
