"""Schedulers: the checkpoint's own (``native``) and few-step DMD on diffusers' flow-match scheduler.

Native sampling keeps the scheduler class and config the checkpoint ships (``scheduler/``), with
the YAML's ``flow_shift`` where it overrides the checkpoint's; the pipeline's own ``__call__`` runs
it, so steps, CFG and the family's guidance knobs mean what they mean upstream.

DMD = predict x0, then re-noise to the next sigma. ``FlowMatchEulerDiscreteScheduler``
with ``stochastic_sampling=True`` does exactly that. Some pipelines (Wan) call
``set_timesteps(num_steps)`` themselves and take no ``sigmas=``, so the scheduler
here pins the YAML's sigma list and ignores what the pipeline asks.
"""

from __future__ import annotations

import copy
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


def native_scheduler(base, flow_shift: float | None):
    """A fresh copy of the checkpoint's scheduler ``base`` (same class and config); ``flow_shift``
    replaces its shift: UniPC's ``flow_shift``, flow-match Euler's ``shift``."""
    overrides = {}
    if flow_shift is not None:
        key = "flow_shift" if "flow_shift" in base.config else "shift"
        if key not in base.config:
            raise ValueError(f"sampler.flow_shift: {type(base).__name__} has no shift to override")
        overrides[key] = flow_shift
    return type(base).from_config(base.config, **overrides)


def first_sigma(scheduler, steps: int, start: int = 0, **set_timesteps_kwargs) -> float:
    """The sigma step ``start`` of ``steps`` denoises from (a DMD scheduler: of its pinned list)."""
    probe = copy.deepcopy(scheduler)
    probe.set_timesteps(steps, **set_timesteps_kwargs)
    return float(probe.sigmas[start])


def tail_start(scheduler, steps: int, strength: float | None, **set_timesteps_kwargs) -> int:
    """Video-to-video on a native scheduler: the index of the first of its ``steps`` sigmas at or
    below ``strength`` (the last step at least); 0 without a strength."""
    if strength is None:
        return 0
    probe = copy.deepcopy(scheduler)
    probe.set_timesteps(steps, **set_timesteps_kwargs)
    sigmas = [float(s) for s in probe.sigmas[: len(probe.timesteps)]]
    return next((i for i, s in enumerate(sigmas) if s <= strength + 1e-9), len(sigmas) - 1)


@contextmanager
def from_step(scheduler, start: int) -> Iterator[None]:
    """While open, the scheduler's ``set_timesteps`` keeps its schedule from step ``start`` on (its
    timesteps and sigmas cut alike, so a multistep solver starts afresh at that sigma): a
    video-to-video run of the pipeline's own loop, from the re-noised source."""
    if start == 0:
        yield
        return
    original = scheduler.set_timesteps

    def set_timesteps(*args, **kwargs):
        out = original(*args, **kwargs)
        scheduler.timesteps = scheduler.timesteps[start:]
        scheduler.sigmas = scheduler.sigmas[start:]
        scheduler.num_inference_steps = len(scheduler.timesteps)
        return out

    scheduler.set_timesteps = set_timesteps  # on this instance only
    try:
        yield
    finally:
        del scheduler.set_timesteps


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
