"""Inference YAML: which checkpoint, how to sample, decode and place weights.

Environment overrides (deployment knobs, not needed for the normal YAML path):
``SHOTLOOM_INFERENCE_CONFIG`` selects the YAML, ``SHOTLOOM_CHECKPOINT`` replaces
``paths.checkpoint``. ``ECHO_INFERENCE_CONFIG`` / ``ECHO_CHECKPOINT`` are accepted
as aliases (the r2v scheduler spec names them).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal, NamedTuple

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from shotloom import ENV_PREFIX

_PACKAGES_PARENT = Path(__file__).resolve().parent.parent
# What relative paths in the YAMLs are relative to: the checkout the packages are in, or, for an
# installed package (`pip install .`: the packages sit in site-packages), the working directory.
REPO_ROOT = _PACKAGES_PARENT if (_PACKAGES_PARENT / "pyproject.toml").is_file() else Path.cwd()
SHIPPED_CONFIGS = "configs"  # a folder the wheel installs beside the packages (pyproject's package-data)


def rooted(path: str | Path, base: Path | None = None) -> Path:
    """A relative path made absolute against ``base`` (a YAML's paths: :data:`REPO_ROOT`; the
    command line's: the working directory). A shipped YAML (``configs/...``) that is not there is
    the one installed beside the packages, so an installed ``shotloom serve`` starts anywhere on its
    defaults."""
    p = Path(path).expanduser()
    if p.is_absolute():
        return p
    here = ((REPO_ROOT if base is None else base) / p).resolve()
    shipped = (_PACKAGES_PARENT / p).resolve()
    if here.exists() or not p.parts or p.parts[0] != SHIPPED_CONFIGS or not shipped.is_file():
        return here
    return shipped


DEFAULT_INFERENCE_CONFIG = Path(SHIPPED_CONFIGS) / "inference.wan-tiny.yaml"


def env(name: str) -> str | None:
    """Read ``SHOTLOOM_<name>``, falling back to the ``ECHO_<name>`` alias."""
    return os.environ.get(f"{ENV_PREFIX}_{name}") or os.environ.get(f"ECHO_{name}")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Paths(_Strict):
    checkpoint: Path = Field(description="Diffusers folder (model_index.json + subfolders).")
    cache_dir: Path = Field(
        default=Path("var/cache/conditioning"),
        description="Content-addressed conditioning cache (safetensors).",
    )


SamplerMode = Literal["native", "dmd"]
NATIVE_DEFAULT_STEPS = 40  # between Wan's 50 and LTX-2's 30-40: a YAML for a real checkpoint says its own


# Sampler fields only LTX-2 runs (its audio stream's CFG, its pipeline's guidance terms besides CFG).
LTX2_GUIDANCE_TERMS = (
    "audio_guidance_scale",
    "stg_scale",
    "audio_stg_scale",
    "spatio_temporal_guidance_blocks",
    "modality_scale",
    "audio_modality_scale",
    "guidance_rescale",
    "audio_guidance_rescale",
)


class StepCalls(NamedTuple):
    """What one sampling step evaluates, as ``LTX2ConditionPipeline.__call__`` decides it: the
    [negative, positive] CFG batch (either stream's guidance > 1), an STG call and a modality-isolated
    call (each on the positive half). A family without those terms: CFG alone."""

    cfg: bool
    stg: bool
    modality: bool

    @property
    def evaluations(self) -> int:
        """DiT evaluations a step (a CFG batch counts two)."""
        return (2 if self.cfg else 1) + self.stg + self.modality


class Sampler(_Strict):
    """How the DiT is sampled.

    ``native``: the checkpoint's own scheduler (its ``scheduler/`` folder: UniPC with ``flow_shift``
    for Wan, flow-match Euler for LTX-2), ``steps`` steps and classifier-free guidance, as the
    checkpoint's authors sample it; requests may choose their own steps and guidance.
    ``dmd``: few-step distilled sampling (predict x0, re-noise to the next of ``sigmas``); the step
    count is the length of ``sigmas`` and a request cannot change it.
    """

    mode: SamplerMode = Field(default="dmd", description="native (the checkpoint's scheduler) | dmd.")
    # dmd
    sigmas: list[float] = Field(default=[1.0, 0.75, 0.5, 0.25], description="dmd: the sigma schedule.")
    shift: float = Field(default=1.0, gt=0, description="dmd: the flow-match shift applied to sigmas.")
    # native
    steps: int | None = Field(
        default=None, ge=1, description="native: default step count (40); dmd: len(sigmas)."
    )
    flow_shift: float | None = Field(
        default=None,
        gt=0,
        description="native: replaces the checkpoint scheduler's shift (UniPC's flow_shift, "
        "flow-match Euler's shift); None keeps the checkpoint's.",
    )
    guidance_scale: float = Field(
        default=1.0, description=">1: classifier-free guidance (two DiT calls a step)."
    )
    guidance_scale_2: float | None = Field(
        default=None,
        description="Wan 2.2 two experts: the low-noise expert's guidance (None: guidance_scale).",
    )
    audio_guidance_scale: float | None = Field(
        default=None, description="LTX-2: the audio stream's guidance (None: guidance_scale, as __call__)."
    )
    # LTX-2's guidance terms besides CFG, as LTX2ConditionPipeline.__call__ runs them (other families
    # refuse them). Each audio_* value None: the video's, as __call__.
    stg_scale: float = Field(
        default=0.0,
        ge=0,
        description="LTX-2: spatio-temporal guidance, away from the DiT with the blocks of "
        "spatio_temporal_guidance_blocks perturbed (one more DiT call a step); 0: off.",
    )
    audio_stg_scale: float | None = Field(default=None, ge=0, description="LTX-2: the audio stream's STG.")
    spatio_temporal_guidance_blocks: list[int] = Field(
        default_factory=list,
        description="LTX-2: the DiT blocks STG perturbs (diffusers: [29] for LTX-2.0, [28] for LTX-2.3).",
    )
    modality_scale: float = Field(
        default=1.0,
        ge=1,
        description="LTX-2: modality-isolation guidance, away from the DiT with its audio-video "
        "cross-attention off (one more DiT call a step); 1: off.",
    )
    audio_modality_scale: float | None = Field(
        default=None, ge=1, description="LTX-2: the audio stream's modality-isolation guidance."
    )
    guidance_rescale: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="LTX-2: the guided x0 rescaled toward the conditional one's std by this share "
        "(against over-exposure); 0: off.",
    )
    audio_guidance_rescale: float | None = Field(
        default=None, ge=0, le=1, description="LTX-2: the audio stream's guidance rescale."
    )

    @field_validator("sigmas")
    @classmethod
    def _descending(cls, v: list[float]) -> list[float]:
        if not v or any(not 0 < s <= 1 for s in v) or any(a <= b for a, b in zip(v, v[1:], strict=False)):
            raise ValueError("sigmas must be a non-empty, strictly descending list in (0, 1]")
        return v

    @model_validator(mode="after")
    def _stg_blocks(self) -> Sampler:
        if (
            self.stg_scale > 0 or (self.audio_stg_scale or 0) > 0
        ) and not self.spatio_temporal_guidance_blocks:
            raise ValueError(
                "spatio_temporal_guidance_blocks: STG (stg_scale > 0) needs the blocks it perturbs"
            )
        return self

    def audio_guidance(self, guidance: float) -> float:
        """The audio stream's CFG scale for a request with ``guidance`` (LTX-2)."""
        return guidance if self.audio_guidance_scale is None else self.audio_guidance_scale

    def step_calls(self, guidance: float) -> StepCalls:
        """What each step of a request with ``guidance`` evaluates on this sampler."""
        return StepCalls(
            cfg=guidance > 1.0 or self.audio_guidance(guidance) > 1.0,
            stg=self.stg_scale > 0 or (self.audio_stg_scale or 0) > 0,
            modality=self.modality_scale > 1 or (self.audio_modality_scale or 0) > 1,
        )

    def guidance_terms_set(self) -> list[str]:
        """The LTX-2-only guidance keys this sampler sets away from off."""
        off = Sampler.model_fields
        return [
            k
            for k in LTX2_GUIDANCE_TERMS
            if getattr(self, k) != off[k].get_default(call_default_factory=True)
        ]

    @model_validator(mode="after")
    def _steps(self) -> Sampler:
        if self.mode == "dmd":
            if self.steps is not None and self.steps != len(self.sigmas):
                raise ValueError(
                    f"steps: a dmd sampler takes len(sigmas)={len(self.sigmas)} steps, got {self.steps}"
                )
            self.steps = len(self.sigmas)
        elif self.steps is None:
            self.steps = NATIVE_DEFAULT_STEPS
        return self

    @property
    def fixed_steps(self) -> int | None:
        """The only step count this sampler takes (dmd), or None (native: any, within limits)."""
        return self.steps if self.mode == "dmd" else None

    def describe(self) -> dict:
        """What a client may read about it (model listings, job records)."""
        return {"mode": self.mode, "steps": self.steps, "guidance_scale": self.guidance_scale}


# -- performance: diffusers' own speed machinery, per model (see shotloom.performance) ---------------
class Compile(_Strict):
    """Regional compilation: ``transformer.compile_repeated_blocks`` (each repeated DiT block
    compiled once, reused by all), done at load and run once at the default shape, so no request
    pays it. Another shape recompiles, up to ``recompile_limit`` shapes; past it torch runs eagerly."""

    enabled: bool = False
    fullgraph: bool = Field(default=True, description="One graph per block (a graph break is an error).")
    dynamic: bool | None = Field(
        default=None, description="torch.compile's dynamic shapes (None: torch decides after a recompile)."
    )
    mode: str | None = Field(default=None, description="torch.compile mode, e.g. max-autotune-no-cudagraphs.")
    recompile_limit: int = Field(default=8, ge=1, description="Shapes compiled per block before eager.")


class FirstBlockCache(_Strict):
    """diffusers' ``FirstBlockCacheConfig``: when the first block's output moved less than
    ``threshold`` (relative) since the last full step, the other blocks are skipped."""

    kind: Literal["first_block"] = "first_block"
    threshold: float = Field(default=0.05, gt=0, description="Higher: more steps skipped, lower quality.")


class MagCache(_Strict):
    """diffusers' ``MagCacheConfig``: skips blocks while the accumulated magnitude error of the
    checkpoint's calibrated ``mag_ratios`` stays under ``threshold``."""

    kind: Literal["mag"] = "mag"
    threshold: float = Field(default=0.06, gt=0)
    max_skip_steps: int = Field(default=3, ge=1, description="Most consecutive steps skipped.")
    retention_ratio: float = Field(
        default=0.2, ge=0, le=1, description="Leading share of steps never skipped."
    )
    mag_ratios: list[float] = Field(
        min_length=2,
        description="Per-step magnitude ratios of this checkpoint and scheduler (calibrate with "
        "diffusers' MagCacheConfig(calibrate=True)); interpolated to the request's step count.",
    )


class TaylorSeerCache(_Strict):
    """diffusers' ``TaylorSeerCacheConfig``: every ``cache_interval`` steps the DiT runs; in between
    its outputs are predicted by a Taylor expansion of order ``max_order``."""

    kind: Literal["taylorseer"] = "taylorseer"
    cache_interval: int = Field(default=5, ge=1)
    disable_cache_before_step: int = Field(default=3, ge=0, description="Leading steps always computed.")
    max_order: int = Field(default=1, ge=0)
    cache_identifiers: list[str] | None = Field(
        default=None,
        description="Regexes (full match) of the DiT module names whose outputs are predicted, e.g. "
        "'^blocks\\.\\d+$' for Wan's blocks; None: diffusers' default, which matches no Wan module "
        "(its attention modules are attn1/attn2), so loading refuses it there.",
    )


StepCache = Annotated[FirstBlockCache | MagCache | TaylorSeerCache, Field(discriminator="kind")]
NO_STEP_CACHE = "none"  # what a request names to run without the model's default step cache


class Performance(_Strict):
    """Speed options of the DiT, each diffusers' own. A choice this device or install cannot do
    refuses to load the model, naming the key; nothing falls back silently."""

    attention_backend: str | None = Field(
        default=None,
        description="diffusers' set_attention_backend name (native, _native_cudnn, flash, _flash_3, "
        "sage, ...); None: diffusers' default (torch SDPA). Only native runs on CPU.",
    )
    compile: Compile = Compile()
    fp8: bool = Field(
        default=False,
        description="Store the DiT's weights as float8_e4m3fn, computed in the model dtype (diffusers' "
        "enable_layerwise_casting): about half the DiT's bytes at bfloat16.",
    )
    step_caches: dict[str, StepCache] = Field(
        default_factory=dict, description="Named step caches a request may choose (step_cache: <name>)."
    )
    step_cache: str | None = Field(
        default=None, description="The step cache a request gets by default (a name above); None: none."
    )

    @model_validator(mode="after")
    def _default_cache_named(self) -> Performance:
        if NO_STEP_CACHE in self.step_caches:
            raise ValueError(f"step_caches: {NO_STEP_CACHE!r} is reserved (a request's way to ask for none)")
        if self.step_cache is not None and self.step_cache not in self.step_caches:
            raise ValueError(
                f"step_cache: {self.step_cache!r} is not one of step_caches {sorted(self.step_caches)}"
            )
        return self


class Adapter(_Strict):
    """A LoRA adapter loaded once beside the base weights; requests select it by ``name``."""

    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$", description="Nickname requests select it by."
    )
    path: Path = Field(description="Diffusers LoRA weights: a folder or a .safetensors file.")
    scale: float = Field(default=1.0, ge=0, le=4, description="Default strength of the adapter.")
    sampler: Sampler | None = Field(
        default=None,
        description="How requests with this adapter are sampled (a distill LoRA: dmd with its sigmas); "
        "None: the model's sampler.",
    )


class TinyCheckpoint(_Strict):
    """Build a tiny random checkpoint at ``paths.checkpoint`` (and tiny random LoRAs at the
    adapters' paths) when missing."""

    build_if_missing: bool = False
    seed: int = 0


class Defaults(_Strict):
    width: int = Field(default=64, gt=0)
    height: int = Field(default=64, gt=0)
    num_frames: int = Field(default=17, gt=0)
    fps: int = Field(default=16, gt=0)
    negative_prompt: str = ""
    strength: float = Field(
        default=0.6,
        gt=0,
        le=1,
        description="Video-to-video: how far from the source a generation may go (1: ignore it). "
        "Denoising starts at the sampler's first sigma at or below it.",
    )
    spritesheet_frames: int = Field(
        default=9,
        ge=1,
        description="Evenly spaced frames in each shot's spritesheet PNG (9: a 3x3 grid; "
        "a shorter clip gives every frame).",
    )


class Tiling(_Strict):
    """Tiled VAE decode. Tile/stride must be multiples of the VAE's spatial ratio.

    Overlap is ``tile - stride`` (pixels or frames); it is blended by the VAE.
    """

    enabled: bool = True
    tile_px: int = Field(default=256, gt=0)
    stride_px: int = Field(default=192, gt=0)
    tile_frames: int = Field(default=16, gt=0)
    stride_frames: int = Field(default=8, gt=0)

    @model_validator(mode="after")
    def _stride_le_tile(self) -> Tiling:
        if self.stride_px > self.tile_px or self.stride_frames > self.tile_frames:
            raise ValueError("tiling stride must not exceed the tile size")
        return self

    @property
    def overlap_px(self) -> int:
        return self.tile_px - self.stride_px

    @property
    def overlap_frames(self) -> int:
        return self.tile_frames - self.stride_frames


class Audio(_Strict):
    silent_track: bool = Field(
        default=True,
        description="Write a silent AAC track for families that make no audio (keeps merges in sync).",
    )
    sample_rate: int = Field(default=24000, gt=0)
    channels: int = Field(default=2, ge=1, le=2)


class MemoryEstimates(_Strict):
    """Working memory beyond the weights, per stage (GiB): what admission and tiering plan with.

    A measured peak of this checkpoint (recorded on CUDA after a run) replaces ``denoise_gib``.
    """

    conditioning_gib: float = Field(default=2.0, ge=0, description="Encoders' activations on a cache miss.")
    denoise_gib: float = Field(default=6.0, ge=0, description="DiT activations while sampling.")
    decode_gib: float = Field(default=4.0, ge=0, description="Tiled VAE decode working memory.")
    reserve_fraction: float = Field(
        default=0.05, ge=0, lt=1, description="Device-relative reserve for DiT residency 'auto'."
    )

    @staticmethod
    def bytes(gib: float) -> int:
        return int(gib * (1 << 30))


class InferenceConfig(_Strict):
    family: Literal["wan", "ltx2"]
    paths: Paths
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: str = "cpu"
    sampler: Sampler = Sampler()
    defaults: Defaults = Defaults()
    tiling: Tiling = Tiling()
    offload: bool = Field(default=False, description="Diffusers group offload of the DiT.")
    memory: MemoryEstimates = MemoryEstimates()
    performance: Performance = Performance()
    audio: Audio = Audio()
    tiny: TinyCheckpoint = TinyCheckpoint()
    adapters: list[Adapter] = Field(
        default_factory=list, description="LoRA adapters loaded at start; switching never reloads the base."
    )

    source: Path | None = Field(default=None, exclude=True)

    def sampler_for(self, adapter: str | None) -> Sampler:
        """The sampler a request with ``adapter`` (or none) is sampled with."""
        for a in self.adapters:
            if a.name == adapter and a.sampler is not None:
                return a.sampler
        return self.sampler

    def named_samplers(self) -> list[tuple[str, Sampler]]:
        """Every sampler of this model with the YAML key it is under (errors name it)."""
        named = [("sampler", self.sampler)]
        return named + [(f"adapters.{a.name}.sampler", a.sampler) for a in self.adapters if a.sampler]

    @model_validator(mode="after")
    def _family_guidance(self) -> InferenceConfig:
        if self.family != "ltx2":
            for prefix, sampler in self.named_samplers():
                if terms := sampler.guidance_terms_set():
                    raise ValueError(
                        f"{prefix}.{terms[0]}: an LTX-2 guidance term; {self.family} runs CFG only"
                    )
        return self

    @field_validator("adapters")
    @classmethod
    def _unique_adapters(cls, v: list[Adapter]) -> list[Adapter]:
        names = [a.name for a in v]
        if len(set(names)) != len(names):
            raise ValueError(f"adapter names must be unique, got {names}")
        return v


def resolve_config_path(path: str | Path | None = None) -> Path:
    if path or env("INFERENCE_CONFIG"):
        return rooted(path or env("INFERENCE_CONFIG") or "", base=Path.cwd())
    return rooted(DEFAULT_INFERENCE_CONFIG)


def load_inference_config(path: str | Path | None = None) -> InferenceConfig:
    """Load the inference YAML; relative paths inside it resolve against the repo root."""
    cfg_path = resolve_config_path(path)
    if not cfg_path.is_file():
        raise FileNotFoundError(f"inference config not found: {cfg_path}")
    data = yaml.safe_load(cfg_path.read_text()) or {}
    cfg = InferenceConfig.model_validate(data)
    checkpoint = env("CHECKPOINT")
    if checkpoint:
        cfg.paths.checkpoint = Path(checkpoint)
    for name in ("checkpoint", "cache_dir"):
        setattr(cfg.paths, name, rooted(getattr(cfg.paths, name)))
    for adapter in cfg.adapters:
        adapter.path = rooted(adapter.path)
    cfg.source = cfg_path
    return cfg
