"""What a request may ask of the sampler, in no dialect: the step count, guidance and step cache a
shot asks for, checked against the sampler that will run it (the request's adapter's, or the
model's), the model's step cache presets (its inference YAML's ``performance``) and the server
YAML's ``api.sampling`` limits; and what a job runs (ran) with, for the job views of both
dialects. No torch."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from api.core.records import JobRecord, JobResult
from contracts.runs import ShotConfig
from settings.api import SamplingLimits
from shotloom.capabilities import CapabilityError, check_step_cache, check_steps
from shotloom.config import NO_STEP_CACHE, Performance, Sampler
from shotloom.request import resolve_sampling, resolve_step_cache

SamplerFor = Callable[[str | None], Sampler]  # adapter name (or None) -> the sampler it runs with


@dataclass(frozen=True)
class SamplingRule:
    """One sampler under the server's limits: its defaults and what a request may choose. The
    step caches are the model's (the same for every adapter), narrowed by the server."""

    sampler: Sampler
    max_steps: int  # the server's limit (a dmd sampler takes its own count, whatever this says)
    guidance_range: tuple[float, float]  # the server's range, within the model family's
    performance: Performance = field(default_factory=Performance)  # the model's step cache presets
    allowed_caches: tuple[str, ...] | None = None  # the server's api.sampling.step_caches (None: all)

    @classmethod
    def of(
        cls,
        sampler: Sampler,
        limits: SamplingLimits,
        family_range: tuple[float, float] | None = None,
        performance: Performance | None = None,
    ) -> SamplingRule:
        lo, hi = limits.guidance_scale
        if family_range is not None:
            lo, hi = max(lo, family_range[0]), min(hi, family_range[1])
        allowed = None if limits.step_caches is None else tuple(limits.step_caches)
        return cls(sampler, limits.max_steps, (lo, hi), performance or Performance(), allowed)

    @property
    def mode(self) -> str:
        return self.sampler.mode

    @property
    def steps(self) -> int:
        """The default step count (dmd: the only one)."""
        return int(self.sampler.steps or 0)

    @property
    def guidance_scale(self) -> float:
        return self.sampler.guidance_scale

    @property
    def step_cache(self) -> str:
        """The step cache a request that names none runs with (the model's default, or none)."""
        return resolve_step_cache(self.performance, None)

    @property
    def step_caches(self) -> tuple[str, ...]:
        """The step caches a request may ask for: none, then the model's presets (in its YAML's
        order) that the server lets through, its default always among them."""
        allowed = self.allowed_caches
        names = [
            n
            for n in self.performance.step_caches
            if allowed is None or n in allowed or n == self.performance.step_cache
        ]
        return (NO_STEP_CACHE, *names)

    @property
    def step_range(self) -> tuple[int, int]:
        """The step counts a request may ask for, [min, max]."""
        fixed = self.sampler.fixed_steps
        return (fixed, fixed) if fixed is not None else (1, self.max_steps)

    def check(self, steps: int | None, guidance: float | None, step_cache: str | None = None) -> None:
        """CapabilityError naming ``num_inference_steps``, ``guidance_scale`` or ``step_cache``
        when a request's value is outside what this sampler, the model and the server take (None:
        the default, not checked)."""
        check_steps(self.sampler, steps, self.max_steps)
        lo, hi = self.guidance_range
        if guidance is not None and not lo <= guidance <= hi:
            raise CapabilityError(
                "guidance_scale", f"must be within [{lo:g}, {hi:g}] for this model, got {guidance:g}"
            )
        check_step_cache(self.performance, step_cache)  # a preset the model declares, or none
        if step_cache is not None and step_cache not in self.step_caches:
            offered = list(self.step_caches)
            raise CapabilityError(
                "step_cache", f"{step_cache!r} is not offered on this server; it offers {offered}"
            )

    def describe(self) -> dict[str, Any]:
        """For model listings: the mode, the defaults and the limits."""
        (smin, smax), (glo, ghi) = self.step_range, self.guidance_range
        return {
            "mode": self.mode,
            "num_inference_steps": self.steps,
            "guidance_scale": self.guidance_scale,
            "step_cache": self.step_cache,
            # The model's presets and their settings (what a name stands for).
            "step_caches": {n: c.model_dump() for n, c in self.performance.step_caches.items()},
            "limits": {
                "num_inference_steps": {"min": smin, "max": smax},
                "guidance_scale": {"min": glo, "max": ghi},
                "step_cache": list(self.step_caches),
            },
        }


def dit_calls(steps: int, guidance: float, sampler: Sampler | None = None) -> int:
    """The DiT evaluations a generation costs: each step's, on ``sampler`` (its
    :meth:`~shotloom.config.Sampler.step_calls`: LTX-2's audio guidance and further terms count), else
    one a step and two with classifier-free guidance."""
    per_step = sampler.step_calls(guidance).evaluations if sampler is not None else 2 if guidance > 1.0 else 1
    return steps * per_step


RuleFor = Callable[[str | None], SamplingRule]  # adapter name (or None) -> its rule (JobService.sampling)


def job_sampling(job: JobRecord, rule_for: RuleFor, shot: ShotConfig | None = None) -> dict[str, Any] | None:
    """The sampler mode, steps, guidance and step cache a shot job runs with (None for a merge):
    what its run recorded once it succeeded (the shot's materialization), else its request as
    resolved (what it asked, else the default of its adapter's sampler, or the model's; the step
    cache: the model's default, else none). ``shot``: the job's shot where the caller read it
    already (reading it validates the stored config: a view renders often)."""
    shot = shot or job.request.shot
    if shot is None:
        return None
    result = job.result or JobResult()
    rule = rule_for(shot.lora)
    recorded = result.sampler or {}
    ran_cache = result.step_cache or (recorded.get("step_cache") or {}).get("name")
    sampling = resolve_sampling(
        rule.sampler,
        rule.performance,
        num_inference_steps=result.num_inference_steps or shot.num_inference_steps,
        guidance_scale=result.guidance_scale if result.guidance_scale is not None else shot.guidance_scale,
        step_cache=ran_cache or shot.step_cache or None,
    )
    steps = sampling.num_inference_steps
    return {
        "mode": recorded.get("mode", rule.sampler.mode),
        "num_inference_steps": int(steps) if steps else None,
        "guidance_scale": float(sampling.guidance_scale),
        "step_cache": str(sampling.step_cache),
    }
