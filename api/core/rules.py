"""The rule book at the API's door: a shot is checked, before anything is queued, by the same rules
the worker runs (the model family's :class:`shotloom.capabilities.Capabilities`, the sampler's and
the server's sampling limits) on the request the worker will run (:func:`shotloom.request.resolve`:
the same defaults), and a refusal names the field the client itself set (``size``,
``video_params.fps``, ``image_reference[2]``...), in either dialect. A dialect maps its protocol to
a :class:`ShotSpec` and checks only this server's own limits (largest size, longest clip); what the
model can honour is checked here, once."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from api.core.errors import InvalidField
from api.core.sampling import SamplerFor, SamplingRule
from api.core.specs import InputRef, MemoryRef, ShotSpec
from settings.api import SamplingLimits
from shotloom.capabilities import Capabilities, CapabilityError
from shotloom.config import Defaults, Performance, Sampler
from shotloom.media_store import path_part
from shotloom.request import GenerationRequest, Guide, MemorySlot, resolve

PLACEHOLDER = Path(".")  # the rules look at whether an input is there, never at its file


class RuleBook:
    def __init__(
        self,
        limits: SamplingLimits,
        defaults: Defaults | None = None,
        sampler_for: SamplerFor | None = None,
        performance: Performance | None = None,
    ):
        self.limits = limits  # the server YAML's api.sampling
        self.defaults = defaults or Defaults()
        default_sampler = Sampler()
        self.sampler_for: SamplerFor = sampler_for or (lambda _adapter: default_sampler)
        self.performance = performance or Performance()

    def sampling(self, adapter: str | None, caps: Capabilities | None) -> SamplingRule:
        """What a request with ``adapter`` (or none) may ask of its sampler: the adapter's own
        sampler or the model's, under the server's ``api.sampling`` limits and (once a worker has
        published them) the family's guidance range; the model's step caches (any adapter's too)."""
        return SamplingRule.of(
            self.sampler_for(adapter),
            self.limits,
            caps.guidance_range if caps else None,
            self.performance,
        )

    @staticmethod
    def check_names(spec: ShotSpec) -> None:
        """The work and shot ids name folders of the media store: one that would lead out of it
        (``..``, a leading ``/``) or name nothing is refused now, not as a run that fails to write."""
        for name in ("work_id", "shot_id"):
            check_path_part(getattr(spec, name), spec.field_names.get(name, name))

    def check_sampling(self, spec: ShotSpec, caps: Capabilities | None) -> None:
        """The steps, guidance and step cache a shot asks for, against the sampler that will run
        it (its adapter's, or the model's), the model's step caches and the server's limits."""
        rule = self.sampling(spec.lora, caps)
        try:
            rule.check(spec.num_inference_steps, spec.guidance_scale, spec.step_cache)
        except CapabilityError as exc:
            message = exc.message
            own = spec.lora is not None and rule.sampler is not self.sampler_for(None)
            if own and exc.field == "num_inference_steps":
                message += f" (the adapter {spec.lora!r} has its own sampler)"
            raise InvalidField(message, client_field(spec, exc.field)) from None

    def check(self, spec: ShotSpec, caps: Capabilities) -> None:
        """What the model cannot do is refused now, not as a failed run later."""
        try:
            caps.check(self.request(spec, spec.memory))
        except CapabilityError as exc:
            field, message = client_field(spec, exc.field), exc.message
            if spec.field_names.get(exc.field, exc.field) != exc.field:
                # The client set another field the value came from (size, seconds): say which.
                message = f"{exc.field} {message}"
            if exc.field == "memory":  # a count: name characters when they, not the images, went over
                characters = [s for s in spec.memory if s.character_id is not None]
                others = tuple(s for s in spec.memory if s.character_id is None)
                if characters and _passes(caps, self.request(spec, others)):
                    field = characters[0].field.split("[", 1)[0]
            raise InvalidField(message, field) from None

    def check_with_inputs(
        self, spec: ShotSpec, caps: Capabilities, memory: list[dict[str, Any]], guides: tuple[Guide, ...]
    ) -> None:
        """The whole shot again once its inputs are read: the memory as the run will have it (a
        character's sound included) and the guides measured (a video's frames, its sound)."""
        gen = replace(
            self.request(spec, spec.memory),
            memory=tuple(MemorySlot(PLACEHOLDER, PLACEHOLDER if m.get("audio") else None) for m in memory),
            guides=guides,
        )
        try:
            caps.check(gen)
        except CapabilityError as exc:
            raise InvalidField(exc.message, client_field(spec, exc.field)) from None

    def request(self, spec: ShotSpec, memory: tuple[MemoryRef, ...]) -> GenerationRequest:
        """The engine's request for ``spec`` with ``memory`` as its slots (paths are placeholders),
        its unset fields resolved as the worker will resolve them."""
        here = PLACEHOLDER
        return resolve(
            self.defaults,
            self.sampler_for(spec.lora),
            self.performance,
            spec.prompt,
            width=spec.width,
            height=spec.height,
            num_frames=spec.num_frames,
            fps=spec.fps,
            seed=0,
            guidance_scale=spec.guidance_scale,
            num_inference_steps=spec.num_inference_steps,
            negative_prompt=spec.negative_prompt,
            step_cache=spec.step_cache,
            first_frame=here if spec.first_frame or spec.extends else None,
            last_frame=here if spec.last_frame else None,
            # An extension has its source in memory too (counted against the family's limit).
            memory=tuple(MemorySlot(here, here if s.audio else None) for s in memory)
            + ((MemorySlot(here),) if spec.extends else ()),
            source_video=here if spec.source else None,
            strength=spec.strength,
            lora=spec.lora,
            lora_scale=spec.lora_scale,
            # Each guide at its frame, one frame long, no sound: measured once its file is read.
            guides=tuple(Guide(here, g.frame, g.kind, frames=1) for g in spec.guides),
        )


def check_path_part(value: str, field: str) -> None:
    """InvalidField naming ``field`` where ``value`` cannot be part of a media path."""
    try:
        path_part(value)
    except ValueError as exc:
        raise InvalidField(f"{value!r} {exc}", field) from None


def client_field(spec: ShotSpec, engine_field: str) -> str:
    """The client's own name for an engine field of ``spec`` (``memory[1].audio`` ->
    ``image_reference[1].audio_url``, ``width`` -> ``size``...)."""
    head, _, rest = engine_field.partition("[")
    if head == "guides" and rest:  # guides[i] or guides[i].frame: the client's name for guide i
        index, _, tail = rest.partition("]")
        return spec.guides[int(index)].field + tail
    if head == "memory" and rest:
        index = int(rest.split("]", 1)[0])
        slot = spec.memory[index]
        return f"{slot.field}.audio_url" if engine_field.endswith(".audio") else slot.field
    if head == "memory":
        return spec.memory_field
    if head == "source_video" and spec.source is not None:
        return spec.source.field
    ref = getattr(spec, head, None) if head in ("first_frame", "last_frame") else None
    if isinstance(ref, InputRef):
        return ref.field
    return spec.field_names.get(head, head)


def _passes(caps: Capabilities, gen: GenerationRequest) -> bool:
    try:
        caps.check(gen)
    except CapabilityError:
        return False
    return True
