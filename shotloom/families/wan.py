"""Wan 2.1/2.2: ``WanVACEPipeline`` (every feature), ``WanImageToVideoPipeline``, ``WanPipeline`` (t2v).

The stages must run in separate processes, so ``encode`` runs every encoder (UMT5, CLIP where
the checkpoint has one, VAE encode of the conditioning) and stores the results; ``denoise``
then calls the pipeline's own ``__call__`` with the stored tensors injected in place of the
methods that would run those encoders (``_patched``). Reusing ``__call__`` keeps upstream
behaviour (CFG, Wan 2.2 two-expert switching, TI2V timestep masks) without a copied loop.
"""

from __future__ import annotations

import functools
import string
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from diffusers.utils.torch_utils import randn_tensor
from PIL import Image

from shotloom.bundle import TensorBundle
from shotloom.capabilities import Capabilities, CapabilityError
from shotloom.config import InferenceConfig, Tiling
from shotloom.families.base import DecodedMedia, FamilyAdapter, Progress, fit_image, source_frames
from shotloom.families.weights import build_checkpoint, ensure_checkpoint, place_pipeline
from shotloom.guides import guide_field, guide_frames
from shotloom.request import GenerationRequest
from shotloom.sampler import first_sigma, from_step, pinned, seed_everything, strength_schedule, tail_start

VACE, I2V, T2V = "WanVACEPipeline", "WanImageToVideoPipeline", "WanPipeline"
SUPPORTED_PIPELINES = (VACE, I2V, T2V)
MAX_SEQUENCE_LENGTH = 512  # Wan's default text length; encode and denoise must agree
MAX_VACE_REFERENCES = 7
FPS = (16,)
TI2V_FPS = (24,)  # Wan 2.2 TI2V-5B was trained at 24 fps
GUIDANCE_RANGE = (1.0, 10.0)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# Tiny checkpoint: shapes that run in well under a second on CPU (see DESIGN.md).
_TINY_TEXT_DIM = 32
_TINY_WORDS = (
    "a an the of and in on with at to from is are cat dog bird fish man woman child city street forest "
    "river sea sky night day sun moon red blue green white black slow fast camera shot light walks runs flies"
).split()


# -- tiny checkpoint -----------------------------------------------------------------------------
def _full_size_components(text_layers: int) -> dict[str, Any]:
    """Wan 2.1 VACE 1.3B's published component configs (text encoder shortened: see the builder)."""
    from diffusers import AutoencoderKLWan, WanVACETransformer3DModel

    tokenizer, text_encoder = _text_encoder(
        d_model=4096, d_kv=64, d_ff=10240, num_layers=text_layers, num_heads=64
    )
    transformer = WanVACETransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=12,
        attention_head_dim=128,
        in_channels=16,
        out_channels=16,
        text_dim=4096,
        freq_dim=256,
        ffn_dim=8960,
        num_layers=30,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        eps=1e-6,
        rope_max_seq_len=1024,
        vace_layers=[0, 5, 10, 15, 20, 25],
        vace_in_channels=96,
    )
    vae = AutoencoderKLWan(base_dim=96, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2)
    return {
        "tokenizer": tokenizer,
        "text_encoder": text_encoder,
        "vae": vae,
        "transformer": transformer,
        "scheduler": _checkpoint_scheduler(flow_shift=3.0),
    }


def _text_encoder(**dims: Any):
    """The tiny vocabulary's tokenizer and a randomly initialised UMT5 encoder of ``dims``."""
    from transformers import T5Tokenizer, UMT5Config, UMT5EncoderModel

    tokenizer = T5Tokenizer(vocab=_tiny_vocab(), extra_ids=0)
    config = UMT5Config(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
        **dims,
    )
    return tokenizer, UMT5EncoderModel(config)


def _tiny_vocab() -> list[tuple[str, float]]:
    """A Unigram vocabulary built offline: specials, single characters and a few whole words."""
    specials = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    chars = [(c, -5.0) for c in string.ascii_letters + string.digits + string.punctuation]
    words = [("\u2581" + w, -1.0) for w in _TINY_WORDS]
    return specials + [("\u2581", -2.0)] + chars + words


# The shapes of the published Wan folders a tiny checkpoint can stand for: pipeline class, DiT
# input channels, experts, VAE, and the scheduler the real folder ships (flow_shift and the
# sampling defaults of the official configs: Wan 2.1 480p 3.0; 2.2 T2V-A14B 12.0, I2V-A14B 5.0,
# TI2V-5B 5.0).
TINY_SHAPES: dict[str, dict[str, Any]] = {
    "vace": {"pipeline": VACE, "flow_shift": 3.0},
    "t2v": {"pipeline": T2V, "flow_shift": 3.0},
    "i2v": {"pipeline": I2V, "flow_shift": 3.0},  # 2.2-style I2V (no CLIP image encoder)
    "t2v-a14b": {"pipeline": T2V, "flow_shift": 12.0, "boundary_ratio": 0.875},
    "i2v-a14b": {"pipeline": I2V, "flow_shift": 5.0, "boundary_ratio": 0.9},
    "ti2v-5b": {"pipeline": T2V, "flow_shift": 5.0, "expand_timesteps": True, "z_dim": 48},
}
SHAPE_OF_PIPELINE = {VACE: "vace", T2V: "t2v", I2V: "i2v"}


def _checkpoint_scheduler(flow_shift: float):
    """The scheduler a published Wan folder ships: UniPC on flow sigmas (flow prediction)."""
    from diffusers import UniPCMultistepScheduler

    return UniPCMultistepScheduler(
        prediction_type="flow_prediction",
        use_flow_sigmas=True,
        num_train_timesteps=1000,
        flow_shift=flow_shift,
    )


def _tiny_vae(z_dim: int):
    from diffusers import AutoencoderKLWan

    if z_dim == 16:
        return AutoencoderKLWan(
            base_dim=3,
            z_dim=16,
            dim_mult=[1, 1, 1, 1],
            num_res_blocks=1,
            temperal_downsample=[False, True, True],
        )
    # Wan 2.2's residual VAE: 48 latent channels, pixels folded 2x2 first (12 input channels), 16x in space.
    return AutoencoderKLWan(
        base_dim=4,
        decoder_base_dim=4,
        z_dim=z_dim,
        dim_mult=[1, 1, 1, 1],
        num_res_blocks=1,
        temperal_downsample=[False, True, True],
        is_residual=True,
        in_channels=12,
        out_channels=12,
        patch_size=2,
        scale_factor_spatial=16,
        latents_mean=[0.0] * z_dim,
        latents_std=[1.0] * z_dim,
    )


def _tiny_components(shape: str, dit_overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    from diffusers import WanTransformer3DModel, WanVACETransformer3DModel

    if shape not in TINY_SHAPES:
        raise ValueError(f"shape: unknown tiny Wan shape {shape!r}; known: {list(TINY_SHAPES)}")
    spec = TINY_SHAPES[shape]
    pipeline, z_dim = spec["pipeline"], spec.get("z_dim", 16)
    tokenizer, text_encoder = _text_encoder(
        d_model=_TINY_TEXT_DIM, d_kv=8, d_ff=64, num_layers=2, num_heads=4, relative_attention_num_buckets=8
    )
    dit: dict[str, Any] = dict(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=12,
        out_channels=z_dim,
        text_dim=_TINY_TEXT_DIM,
        freq_dim=32,
        ffn_dim=32,
        num_layers=2,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32,
    )
    dit.update(dit_overrides or {})
    common: dict[str, Any] = dict(
        tokenizer=tokenizer,
        text_encoder=text_encoder,
        vae=_tiny_vae(z_dim),
        scheduler=_checkpoint_scheduler(spec["flow_shift"]),
    )
    if pipeline == VACE:
        # vace_in_channels = 2 x z_dim (inactive + reactive video) + 8x8 (spatially folded mask)
        transformer = WanVACETransformer3DModel(in_channels=16, vace_layers=[0], vace_in_channels=96, **dit)
        return {**common, "transformer": transformer}
    # I2V (2.2-style, no CLIP): noise + frame mask (4) + image latents; T2V: the noise alone.
    in_channels = 2 * z_dim + 4 if pipeline == I2V else z_dim
    experts = {"transformer": WanTransformer3DModel(in_channels=in_channels, **dit)}
    if "boundary_ratio" in spec:  # Wan 2.2 A14B: a high-noise and a low-noise expert
        experts["transformer_2"] = WanTransformer3DModel(in_channels=in_channels, **dit)
        common["boundary_ratio"] = spec["boundary_ratio"]
    if spec.get("expand_timesteps"):
        common["expand_timesteps"] = True
    if pipeline == I2V:
        common.update(image_encoder=None, image_processor=None)
    return {**common, **experts}


# -- helpers -------------------------------------------------------------------------------------
def _pipeline_kind(pipe) -> str:
    name = type(pipe).__name__
    if name not in SUPPORTED_PIPELINES:
        raise ValueError(
            f"paths.checkpoint: unsupported Wan pipeline {name}; supported: {list(SUPPORTED_PIPELINES)}"
        )
    return name


class _DitConfigView:
    """The pipeline, with a DiT that is only its config (all diffusers' helpers read of it)."""

    def __init__(self, pipe, config):
        self._pipe = pipe
        self.transformer = SimpleNamespace(config=config)

    def __getattr__(self, name: str):
        return getattr(self._pipe, name)


def _load_rgb(path: Path, width: int, height: int) -> Image.Image:
    with Image.open(path) as im:
        return fit_image(im, width, height)


def _latent_stats(vae, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (1, vae.config.z_dim, 1, 1, 1)
    mean = torch.tensor(vae.config.latents_mean).view(shape).to(device, dtype)
    std = torch.tensor(vae.config.latents_std).view(shape).to(device, dtype)
    return mean, std


@contextmanager
def _patched(obj: Any, **methods: Callable) -> Iterator[None]:
    """Shadow methods on one instance (not the class), always restoring them."""
    missing = object()
    saved = {name: obj.__dict__.get(name, missing) for name in methods}
    try:
        for name, fn in methods.items():
            setattr(obj, name, fn)
        yield
    finally:
        for name, value in saved.items():
            if value is missing:
                obj.__dict__.pop(name, None)
            else:
                setattr(obj, name, value)


# -- adapter -------------------------------------------------------------------------------------
class WanAdapter(FamilyAdapter):
    family = "wan"
    pinned_dtypes = {"vae": "float32"}  # upstream runs the Wan VAE in float32

    # -- checkpoint -----------------------------------------------------------------------------
    @classmethod
    def build_tiny_checkpoint(
        cls,
        out_dir: Path,
        seed: int = 0,
        *,
        pipeline: str = VACE,
        shape: str | None = None,
        dit: dict[str, Any] | None = None,
    ) -> Path:
        """A tiny random checkpoint (~0.5 MB) of a published Wan folder's shape (``TINY_SHAPES``;
        by default the one of ``pipeline``), its scheduler as that folder ships it; same seed ->
        identical files. ``dit``: DiT config overrides (a bench's larger DiT beside tiny encoders)."""
        import diffusers

        shape = shape or SHAPE_OF_PIPELINE[pipeline]
        cls_name = TINY_SHAPES[shape]["pipeline"]
        return build_checkpoint(
            out_dir, seed, lambda: getattr(diffusers, cls_name)(**_tiny_components(shape, dit))
        )

    @classmethod
    def build_full_size_checkpoint(cls, out_dir: Path, seed: int = 0, *, text_layers: int = 2) -> Path:
        """A randomly initialised checkpoint shaped like Wan 2.1 VACE 1.3B (the DiT and VAE at full
        size, as published), for GPU checks without a download: real memory figures and kernels.
        The UMT5 text encoder keeps the real width (4096, what the DiT reads) but ``text_layers``
        layers and the tiny vocabulary: the real 24-layer one is 5.7B parameters of no interest
        here. Saved in bfloat16 (2.6 GB for the DiT)."""
        import diffusers

        def make():
            pipe = diffusers.WanVACEPipeline(**_full_size_components(text_layers))
            return pipe.to(torch.bfloat16)

        return build_checkpoint(out_dir, seed, make)

    @classmethod
    def load(cls, cfg: InferenceConfig, device: str = "cpu") -> WanAdapter:
        ckpt = ensure_checkpoint(cfg, cls.build_tiny_checkpoint)
        from diffusers import DiffusionPipeline

        dtype = DTYPES[cfg.dtype]
        # ``torch_dtype`` is deprecated for ``dtype``; pinned components (the VAE) stay float32.
        dtypes = {"default": dtype, **{k: DTYPES[v] for k, v in cls.pinned_dtypes.items()}}
        pipe = DiffusionPipeline.from_pretrained(str(ckpt), local_files_only=True, dtype=dtypes)
        _pipeline_kind(pipe)
        pipe.set_progress_bar_config(disable=True)
        place_pipeline(pipe, device, cfg.offload)
        adapter = cls(cfg, pipe, device)
        adapter.keep_checkpoint_scheduler(pipe.scheduler)
        pipe.scheduler = adapter.scheduler_for(cfg.sampler)  # requests switch it per sampler
        adapter.configure_tiling(cfg.tiling)
        adapter._count_encoders()
        return adapter

    @property
    def kind(self) -> str:
        """The pipeline class named in model_index.json: decides which features exist."""
        return _pipeline_kind(self.pipe)

    @property
    def ti2v(self) -> bool:
        """Wan 2.2 TI2V-5B: one checkpoint for text- and image-to-video (timesteps per token)."""
        return bool(self.pipe.config.get("expand_timesteps", False))

    def _kind_for(self, req: GenerationRequest) -> str:
        """The pipeline a request runs on: a TI2V checkpoint's first frame takes its I2V form."""
        if self.kind == T2V and self.ti2v and req.first_frame is not None:
            return I2V
        return self.kind

    def _pipe_for(self, kind: str):
        """The loaded pipeline, or for a TI2V first frame an I2V pipeline over the same components
        (as diffusers' docs load the TI2V folder with WanImageToVideoPipeline): no weights copied."""
        if kind == self.kind:
            return self.pipe
        from diffusers import WanImageToVideoPipeline

        components = {
            k: v for k, v in self.pipe.components.items() if k not in ("image_encoder", "image_processor")
        }
        view = WanImageToVideoPipeline(
            **components,
            boundary_ratio=self.pipe.config.get("boundary_ratio"),
            expand_timesteps=True,
        )
        view.set_progress_bar_config(disable=True)
        return view

    def configure_tiling(self, tiling: Tiling) -> None:
        """Spatial tiled decode (Wan's VAE does not tile time). Tile/stride must align to latents."""
        vae = self.pipe.vae
        if not tiling.enabled:
            vae.disable_tiling()
            return
        ratio = self.pipe.vae_scale_factor_spatial
        for field in ("tile_px", "stride_px"):
            value = getattr(tiling, field)
            if value % ratio:
                raise ValueError(
                    f"tiling.{field}: must be a multiple of the VAE spatial ratio {ratio}, got {value}"
                )
        vae.enable_tiling(
            tile_sample_min_height=tiling.tile_px,
            tile_sample_min_width=tiling.tile_px,
            tile_sample_stride_height=tiling.stride_px,
            tile_sample_stride_width=tiling.stride_px,
        )

    def _count_encoders(self) -> None:
        """Count real encoder forwards: hooks on the encoders, a wrapper around ``vae.encode``."""
        for name in ("text_encoder", "image_encoder"):
            module = getattr(self.pipe, name, None)
            if isinstance(module, torch.nn.Module):
                module.register_forward_pre_hook(lambda _m, _a, n=name: self.encoder_counter.hit(n))
        vae = self.pipe.vae
        encode = vae.encode

        @functools.wraps(encode)
        def counted_encode(*args, **kwargs):
            self.encoder_counter.hit("vae_encode")
            return encode(*args, **kwargs)

        vae.encode = counted_encode

    # -- capabilities ---------------------------------------------------------------------------
    @property
    def capabilities(self) -> Capabilities:
        kind = self.kind
        dit = self.generator_config()
        ti2v = self.ti2v  # 2.2 TI2V: a first frame only (its I2V form), no last frame
        return Capabilities(
            max_reference_images=MAX_VACE_REFERENCES if kind == VACE else 0,
            first_frame=kind in (VACE, I2V) or ti2v,
            last_frame=kind == VACE or (kind == I2V and not ti2v),
            audio_in=False,
            audio_out=False,
            frame_multiple=self.pipe.vae_scale_factor_temporal,
            size_multiple=self.pipe.vae_scale_factor_spatial * dit.patch_size[1],
            fps=TI2V_FPS if ti2v else FPS,
            guidance_range=GUIDANCE_RANGE,
            video_to_video=True,
            adapters=self.adapter_names(),
            references_per_latent_frame=kind == VACE,  # VACE prepends one latent frame per reference
            frame_guides=kind == VACE,  # frames kept at their positions in VACE's masked video
            audio_guides=False,  # Wan makes no sound, and conditions on none
        )

    def check(self, req: GenerationRequest) -> None:
        super().check(req)
        if self.kind == I2V and req.first_frame is None:
            raise CapabilityError("first_frame", "this image-to-video checkpoint needs a first frame")

    # -- encode ---------------------------------------------------------------------------------
    @torch.no_grad()
    def encode(self, req: GenerationRequest) -> TensorBundle:
        """Text (+ negative when guidance > 1) and the image conditioning, all as tensors."""
        self.check(req)
        kind = self._kind_for(req)
        pipe = self._pipe_for(kind)
        device = pipe._execution_device
        # Read the VACE video (frames and guides) first: a bad file fails before any encoder runs.
        vace_video = self._vace_video(req) if kind == VACE else None
        use_negative = self.uses_negative(req)
        prompt_embeds, negative = pipe.encode_prompt(
            prompt=req.prompt,
            negative_prompt=req.negative_prompt,
            do_classifier_free_guidance=use_negative,
            max_sequence_length=MAX_SEQUENCE_LENGTH,
            device=device,
        )
        tensors = {"prompt_embeds": prompt_embeds}
        if negative is not None:
            tensors["negative_prompt_embeds"] = negative
        num_refs = 0
        if vace_video is not None:
            vace, num_refs = self._encode_vace(req, device, vace_video)
            tensors.update(vace)
        elif kind == I2V:
            tensors.update(self._encode_i2v(req, device, pipe))
        if req.source_video is not None:
            tensors["source_latents"] = self._encode_source(req, device)
        meta = {
            "family": self.family,
            "pipeline": kind,
            "width": req.width,
            "height": req.height,
            "num_frames": req.num_frames,
            "num_reference_images": num_refs,
            "uses_negative": use_negative,
        }
        return TensorBundle({k: v.detach().to("cpu") for k, v in tensors.items()}, meta)

    def _vace_video(self, req: GenerationRequest) -> tuple[np.ndarray | None, np.ndarray | None]:
        """First/last frame and guides as a masked VACE video: given frames kept (mask 0) at their
        positions, the rest generated. A guide video's frames go one per clip frame from its frame."""
        guides = [
            (g, guide_frames(g, guide_field(i), req.num_frames))
            for i, g in enumerate(req.guides)
            if g.kind == "video"  # sounds: refused by the capabilities (Wan takes none)
        ]
        if req.first_frame is None and req.last_frame is None and not guides:
            return None, None  # the pipeline's own default: an all-zero video, all-ones mask
        shape = (1, req.num_frames, req.height, req.width, 3)  # 5-D (B, F, H, W, C) floats in [0, 1]
        video = np.full(shape, 0.5, dtype=np.float32)  # 0.5 = 0 in the VAE's [-1, 1]: "unknown"
        mask = np.ones(shape, dtype=np.float32)
        for index, path in ((0, req.first_frame), (-1, req.last_frame)):
            if path is not None:
                video[0, index] = np.asarray(_load_rgb(path, req.width, req.height), dtype=np.float32) / 255.0
                mask[0, index] = 0.0
        for guide, frames in guides:
            for offset, frame in enumerate(frames):
                fitted = fit_image(Image.fromarray(frame), req.width, req.height)
                video[0, guide.frame + offset] = np.asarray(fitted, dtype=np.float32) / 255.0
                mask[0, guide.frame + offset] = 0.0
        return video, mask

    def _encode_vace(
        self, req: GenerationRequest, device, vace_video: tuple[np.ndarray | None, np.ndarray | None]
    ) -> tuple[dict[str, torch.Tensor], int]:
        pipe = self.pipe
        video, mask = vace_video
        refs = [_load_rgb_any(slot.image) for slot in req.memory] or None
        video, mask, refs = pipe.preprocess_conditions(
            video, mask, refs, 1, req.height, req.width, req.num_frames, torch.float32, device
        )
        latents = pipe.prepare_video_latents(video, mask, refs, None, device)
        # prepare_masks reads the DiT's patch size; the DiT may be released while encoders run.
        masks = type(pipe).prepare_masks(_DitConfigView(pipe, self.generator_config()), mask, refs, None)
        return {"vace_video_latents": latents, "vace_mask": masks}, len(refs[0])

    def _encode_i2v(self, req: GenerationRequest, device, pipe) -> dict[str, torch.Tensor]:
        first = _load_rgb(req.first_frame, req.width, req.height)
        last = _load_rgb(req.last_frame, req.width, req.height) if req.last_frame else None

        def prep(im: Image.Image) -> torch.Tensor:
            return pipe.video_processor.preprocess(im, height=req.height, width=req.width).to(
                device, torch.float32
            )

        shape = self._latent_shape(req, pipe.vae.config.z_dim)
        out = pipe.prepare_latents(
            prep(first),
            1,
            shape[1],
            req.height,
            req.width,
            req.num_frames,
            torch.float32,
            device,
            None,
            torch.zeros(shape, device=device),
            prep(last) if last is not None else None,
        )  # zero "noise" so the encode stage draws no random numbers; only the condition is kept
        tensors = {"i2v_condition": out[1]}
        if len(out) == 3:
            tensors["i2v_first_frame_mask"] = out[2]
        if self.generator_config().image_dim is not None:  # Wan 2.1 I2V: CLIP image embeddings
            tensors["image_embeds"] = pipe.encode_image(first if last is None else [first, last], device)
        return tensors

    def _encode_source(self, req: GenerationRequest, device) -> torch.Tensor:
        """The source video's latents, normalised as the DiT sees them (VAE mode: no sampling)."""
        vae = self.pipe.vae
        frames = source_frames(req.source_video, req.num_frames, req.width, req.height)
        video = torch.from_numpy(frames).permute(3, 0, 1, 2).unsqueeze(0) * 2.0 - 1.0  # (1, 3, F, H, W)
        z = vae.encode(video.to(device, vae.dtype)).latent_dist.mode()
        mean, std = _latent_stats(vae, z.device, z.dtype)
        return ((z - mean) / std).float()

    context_parallel = True  # diffusers' _cp_plan for WanTransformer3DModel (not the VACE one)

    def dit_tokens(self, req: GenerationRequest) -> int:
        _, _, frames, height, width = self._latent_shape(req, 1)
        pt, ph, pw = self.generator_config().patch_size
        return (frames // pt) * (height // ph) * (width // pw)

    def _latent_shape(self, req: GenerationRequest, channels: int) -> tuple[int, int, int, int, int]:
        pipe = self.pipe
        frames = (req.num_frames - 1) // pipe.vae_scale_factor_temporal + 1
        ratio = pipe.vae_scale_factor_spatial
        return (1, channels, frames, req.height // ratio, req.width // ratio)

    # -- denoise --------------------------------------------------------------------------------
    @torch.no_grad()
    def denoise(
        self, cond: TensorBundle, req: GenerationRequest, progress: Progress | None = None
    ) -> TensorBundle:
        """Sample from ``cond`` alone (runs no encoder) with the request's sampler: the pipeline's
        own ``__call__`` on the checkpoint's scheduler (native) or the DMD one. Same seed ->
        bit-identical latents, and the pipeline's own for a prompt-only request (native)."""
        kind = self._kind_for(req)
        self._check_cond(cond, req, kind)
        pipe = self._pipe_for(kind)
        device = pipe._execution_device
        t = {k: v.to(device) for k, v in cond.tensors.items()}
        source = t.get("source_latents")
        strength = req.strength if source is not None else None
        sampler, steps = self.sampling(req)
        pipe.scheduler = self.scheduler_for(sampler)
        if sampler.mode == "dmd":
            sigmas = strength_schedule(sampler.sigmas, strength)
            schedule: AbstractContextManager = pinned(pipe.scheduler, sigmas)
            steps = total = len(sigmas)
            start = 0
        else:
            start = tail_start(pipe.scheduler, steps, strength, device=device)
            schedule = from_step(pipe.scheduler, start)
            total = steps - start

        def on_step_end(_pipe, i: int, _t, _kwargs: dict) -> dict:
            if progress is not None:
                progress(i + 1, total)  # may raise (cancel): propagates out of the pipeline
            return {}

        # Initial noise from a CPU generator seeded as a diffusers user seeds one
        # (``torch.Generator().manual_seed(seed)``); DMD's re-noise from the seeded global RNG.
        generator = seed_everything(req.seed)
        kwargs: dict[str, Any] = dict(
            prompt_embeds=t["prompt_embeds"],
            negative_prompt_embeds=t.get("negative_prompt_embeds"),
            height=req.height,
            width=req.width,
            num_frames=req.num_frames,
            num_inference_steps=steps,
            guidance_scale=req.guidance_scale,
            generator=generator,
            output_type="latent",
            callback_on_step_end=on_step_end,
            max_sequence_length=MAX_SEQUENCE_LENGTH,
        )
        if self.two_experts and sampler.guidance_scale_2 is not None:
            kwargs["guidance_scale_2"] = sampler.guidance_scale_2
        if source is not None:
            with pinned(pipe.scheduler, sigmas) if sampler.mode == "dmd" else nullcontext():
                sigma0 = first_sigma(pipe.scheduler, steps, start, device=device)
            kwargs["latents"] = self._renoised(source, cond.meta, generator, sigma0)
        with schedule, self._inject(pipe, kind, t, cond.meta, req, kwargs), self.step_cache(req, total):
            latents = pipe(**kwargs).frames
            used = [float(s) for s in pipe.scheduler.sigmas[: len(pipe.scheduler.timesteps)]]
        # VACE prepends one latent frame per reference image; the pipeline drops them only when it decodes.
        latents = latents[:, :, int(cond.meta.get("num_reference_images", 0)) :]
        meta = {
            "family": self.family,
            "kind": "latents",
            "pipeline": kind,
            "shape": list(latents.shape),
            "seed": req.seed,
            "sigmas": used,
            "strength": strength,
            "shift": self.cfg.sampler.shift,
            "width": req.width,
            "height": req.height,
            "num_frames": req.num_frames,
            "sampling": self.sampling_record(
                sampler, req, used, guidance_scale_2=kwargs.get("guidance_scale_2")
            ),
        }
        return TensorBundle({"video": latents.float().to("cpu").contiguous()}, meta)

    @property
    def two_experts(self) -> bool:
        """Wan 2.2 A14B: a high-noise ``transformer`` and a low-noise ``transformer_2``."""
        return self.pipe.config.get("boundary_ratio") is not None

    def _renoised(self, source: torch.Tensor, meta: dict, generator, sigma: float) -> torch.Tensor:
        """The starting latents of a video-to-video run: the source re-noised to ``sigma`` (the
        schedule's first, as the scheduler shifts it), noise drawn from the seed's generator.
        VACE's reference frames, prepended, start from noise at that sigma."""
        refs = int(meta.get("num_reference_images", 0))
        shape = (source.shape[0], source.shape[1], source.shape[2] + refs, *source.shape[3:])
        noise = randn_tensor(shape, generator=generator, device=source.device, dtype=torch.float32)
        start = noise * sigma
        start[:, :, refs:] += (1.0 - sigma) * source
        return start

    def _check_cond(self, cond: TensorBundle, req: GenerationRequest, kind: str) -> None:
        meta = cond.meta
        if meta.get("pipeline") not in (None, kind):
            raise ValueError(f"conditioning was encoded for {meta['pipeline']}, this request runs on {kind}")
        for name in ("width", "height", "num_frames"):
            if name in meta and meta[name] != getattr(req, name):
                raise ValueError(
                    f"{name}: conditioning was encoded at {meta[name]}, request has {getattr(req, name)}"
                )
        if self.uses_negative(req) and "negative_prompt_embeds" not in cond.tensors:
            raise ValueError(
                "guidance_scale: conditioning has no negative_prompt_embeds (encoded with guidance 1)"
            )

    def _inject(
        self, pipe, kind: str, t: dict[str, torch.Tensor], meta: dict, req: GenerationRequest, kwargs: dict
    ) -> AbstractContextManager:
        """Bind the pipeline's encoder-running methods to return the precomputed tensors."""
        if kind == VACE:
            placeholders = [[None] * int(meta.get("num_reference_images", 0))]  # only their count is read
            return _patched(
                pipe,
                preprocess_conditions=lambda *_a, **_k: (None, None, placeholders),
                prepare_video_latents=lambda *_a, **_k: t["vace_video_latents"],
                prepare_masks=lambda *_a, **_k: t["vace_mask"],
            )
        if kind == I2V:
            return self._inject_i2v(pipe, t, req, kwargs)
        return nullcontext()

    def _inject_i2v(
        self, pipe, t: dict[str, torch.Tensor], req: GenerationRequest, kwargs: dict
    ) -> AbstractContextManager:
        condition, mask = t["i2v_condition"], t.get("i2v_first_frame_mask")
        shape = self._latent_shape(req, self.pipe.vae.config.z_dim)

        def prepare_latents(
            image,
            batch_size,
            channels,
            height,
            width,
            num_frames,
            dtype,
            device,
            generator,
            latents=None,
            last_image=None,
        ):
            # The same noise draw as the pipeline's own prepare_latents, minus its VAE encode
            # (video-to-video passes its re-noised source instead).
            noise = (
                randn_tensor(shape, generator=generator, device=device, dtype=dtype)
                if latents is None
                else latents
            )
            return (noise, condition) if mask is None else (noise, condition, mask)

        # __call__ requires ``image``; only the two patched methods would read it.
        kwargs["image"] = Image.new("RGB", (req.width, req.height))
        return _patched(
            pipe, prepare_latents=prepare_latents, encode_image=lambda *_a, **_k: t["image_embeds"]
        )

    # -- decode ---------------------------------------------------------------------------------
    @torch.no_grad()
    def decode(
        self, latents: TensorBundle, req: GenerationRequest, progress: Progress | None = None
    ) -> DecodedMedia:
        """Denormalise as the pipeline does, VAE-decode (tiled per config), to uint8 (F, H, W, 3)."""
        pipe = self.pipe
        vae = pipe.vae
        z = latents.tensors["video"].to(pipe._execution_device, vae.dtype)
        mean, std = _latent_stats(vae, z.device, z.dtype)
        video = vae.decode(z * std + mean, return_dict=False)[0]
        frames = pipe.video_processor.postprocess_video(video, output_type="np")[0]  # (F, H, W, 3) in [0, 1]
        frames = (np.clip(frames, 0.0, 1.0) * 255.0).round().astype(np.uint8)
        expected = (req.num_frames, req.height, req.width, 3)
        if frames.shape != expected:
            raise RuntimeError(
                f"decoded {frames.shape}, expected {expected}: latents do not match the request"
            )
        if progress is not None:
            progress(1, 1)
        return DecodedMedia(frames=frames)


def _load_rgb_any(path: Path) -> Image.Image:
    """A reference image at its own size (the pipeline fits it onto a white canvas)."""
    with Image.open(path) as im:
        return im.convert("RGB")
