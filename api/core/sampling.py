"""What a request may ask of the sampler, in no dialect: the step count and guidance a shot asks
for, checked against the sampler that will run it (the request's adapter's, or the model's) and
the server YAML's ``api.sampling`` limits; and the steps and guidance a job runs (ran) with, for
the job views of both dialects. No torch."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from api.store import JobRecord
from shotloom.api_config import SamplingLimits
from shotloom.capabilities import CapabilityError, check_steps
from shotloom.config import Sampler

SamplerFor = Callable[[str | None], Sampler]  # adapter name (or None) -> the sampler it runs with


@dataclass(frozen=True)
class SamplingRule:
    """One sampler under the server's limits: its defaults and what a request may choose."""

    sampler: Sampler
    max_steps: int  # the server's limit (a dmd sampler takes its own count, whatever this says)
    guidance_range: tuple[float, float]  # the server's range, within the model family's

    @classmethod
    def of(
        cls, sampler: Sampler, limits: SamplingLimits, family_range: tuple[float, float] | None = None
    ) -> SamplingRule:
        lo, hi = limits.guidance_scale
        if family_range is not None:
            lo, hi = max(lo, family_range[0]), min(hi, family_range[1])
        return cls(sampler, limits.max_steps, (lo, hi))

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
    def step_range(self) -> tuple[int, int]:
        """The step counts a request may ask for, [min, max]."""
        fixed = self.sampler.fixed_steps
        return (fixed, fixed) if fixed is not None else (1, self.max_steps)

    def check(self, steps: int | None, guidance: float | None) -> None:
        """CapabilityError naming ``num_inference_steps`` or ``guidance_scale`` when a request's
        value is outside what this sampler and the server take (None: the default, not checked)."""
        check_steps(self.sampler, steps, self.max_steps)
        lo, hi = self.guidance_range
        if guidance is not None and not lo <= guidance <= hi:
            raise CapabilityError(
                "guidance_scale", f"must be within [{lo:g}, {hi:g}] for this model, got {guidance:g}"
            )

    def describe(self) -> dict[str, Any]:
        """For model listings: the mode, the defaults and the limits."""
        (smin, smax), (glo, ghi) = self.step_range, self.guidance_range
        return {
            "mode": self.mode,
            "num_inference_steps": self.steps,
            "guidance_scale": self.guidance_scale,
            "limits": {
                "num_inference_steps": {"min": smin, "max": smax},
                "guidance_scale": {"min": glo, "max": ghi},
            },
        }


def dit_calls(steps: int, guidance: float) -> int:
    """The DiT forward passes a generation costs: a step each, two with classifier-free guidance."""
    return steps * (2 if guidance > 1.0 else 1)


def job_sampling(job: JobRecord, sampler_for: SamplerFor) -> dict[str, Any] | None:
    """The sampler mode, steps and guidance a shot job runs with (None for a merge): what its run
    recorded once it succeeded (the shot's materialization), else its request as resolved (what it
    asked, else the default of its adapter's sampler, or the model's)."""
    ops = job.request.get("run_config", {}).get("ops", {})
    if "condition_op" not in ops:
        return None
    config = ops["condition_op"].get("config") or {}
    result = job.result or {}
    sampler = sampler_for(config.get("lora"))
    recorded = result.get("sampler") if isinstance(result.get("sampler"), dict) else {}
    steps = result.get("num_inference_steps") or config.get("num_inference_steps") or sampler.steps
    guidance = result.get("guidance_scale", config.get("guidance_scale", sampler.guidance_scale))
    return {
        "mode": recorded.get("mode", sampler.mode),
        "num_inference_steps": int(steps) if steps else None,
        "guidance_scale": float(guidance),
    }
