"""LTX-2 (``LTX2ConditionPipeline``): text/image-to-video with a jointly generated audio track.

The stages run in separate processes, so ``encode`` runs every encoder (Gemma + text connectors, VAE
encode of the image conditions, audio VAE encode of an input track) and stores the results.
``denoise`` runs its own loop, written after ``LTX2ConditionPipeline.__call__`` (same steps, same
order; for text-only it is bit-identical to ``__call__``, in both sampler modes) instead of calling it,
because:

* the condition latents come from the bundle, and ``__call__`` can only VAE-encode images itself;
* DMD re-noises to the next sigma. The scheduler does that to every token, which would put noise
  back into clean first-frame tokens that the model is told are clean (timestep 0). Here each token
  is re-noised to its own level, ``sigma_next * (1 - strength)``;
* an input audio track is held clean (timestep 0, no audio step) while the video cross-attends to
  it, as diffusers' LTX-2 DFR pipeline does with ``freeze_audio``; ``__call__`` fully re-noises any
  ``audio_latents`` it is given (``noise_scale`` = first sigma = 1), so it cannot condition on audio.

Everything else (packing, normalisation, first-frame and keyframe conditioning, RoPE coordinates)
is the pipeline's own code, called as methods.

Samplers (``sampler.mode``): ``native`` keeps the checkpoint's scheduler (flow-match Euler with
LTX-2's token-count-dependent shift ``mu`` and ``shift_terminal``), and each step is ``__call__``'s
own: its sigmas (``linspace(1, 1/steps, steps)`` shifted by ``mu`` of the video's token count), CFG
in x0 space with ``guidance_scale`` for the video and ``audio_guidance_scale`` for the audio stream,
the conditioning mask blended in x0 space, one Euler step. So a prompt-only request, a first frame,
and a keyframe where ``__call__``'s latent index puts one (pixel frame 8k+1) equal
``__call__(..., output_type="latent")`` for a seed, steps and guidance (tested). ``__call__``'s
further terms run where the sampler YAML sets them, under its names: STG (one more DiT call on the
positive prompt with ``spatio_temporal_guidance_blocks`` perturbed), modality isolation (one more,
the audio-video cross-attention off) and guidance rescale, each stream with its own values; with
them too the latents equal ``__call__``'s (tested). Off by default (``__call__``'s own defaults turn
them on: a YAML for a real checkpoint sets them, as ``configs/models/ltx2-dev.yaml`` does).
``dmd`` re-noises each token to its own level as described above.

Conditions, in pixel frames: ``first_frame`` replaces the first latent frame (strength 1);
``last_frame`` is a keyframe at frame ``num_frames - 1`` (strength 1); memory images are keyframes
at ``REFERENCE_STRENGTH``, spread evenly over frames 1..num_frames-1. Keyframes are extra tokens
appended to the sequence and dropped after sampling, so a reference steers the clip through
attention without becoming a frame of it; spreading them keeps the identity present throughout, and
half strength lets pose and motion depart from the still. LTX-2 has no other image-reference input.

Guides (``req.guides``): an image or a video anchored at a frame is a condition at that pixel
frame, strength 1: at frame 0 it replaces the first latent frames, elsewhere its tokens are
appended as a keyframe (a video as one multi-frame keyframe, on the VAE's 8k+1 frame grid: frames
past the last whole latent step are dropped, as the pipeline's own ``trim_conditioning_sequence``).

Audio in: the audio of (at most) one memory slot becomes the clip's soundtrack, cut or padded with
silence to the clip, and the video is generated to it (audio-to-video). It is not a voice or timbre
reference: LTX-2 has no such input. The output track is that audio through the audio VAE + vocoder.
A guide's sound (a sound alone, or a guide video's own) is that one track instead, but anchored: it
starts at the guide's frame, and only the audio tokens it covers are held clean (per-token audio
timesteps, as the video's conditioning mask); the rest of the track is generated around it.
"""

from __future__ import annotations

import copy
import inspect
import math
import string
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from shotloom.bundle import TensorBundle
from shotloom.capabilities import Capabilities, CapabilityError
from shotloom.config import InferenceConfig, Sampler, StepCalls, Tiling
from shotloom.families.base import DecodedMedia, FamilyAdapter, Progress, source_frames
from shotloom.families.weights import build_checkpoint, ensure_checkpoint, place_pipeline
from shotloom.guides import guide_field, guide_frames
from shotloom.request import GenerationRequest, Guide
from shotloom.sampler import from_step, pinned, seed_everything, strength_schedule, tail_start

PIPELINE = "LTX2ConditionPipeline"
# Checkpoints declaring a sibling pipeline hold the same components; they are re-wrapped.
SUPPORTED_PIPELINES = (PIPELINE, "LTX2Pipeline", "LTX2ImageToVideoPipeline")
MAX_REFERENCES = 7
REFERENCE_STRENGTH = 0.5
FPS = (24, 25, 50)
GUIDANCE_RANGE = (1.0, 10.0)
SIZE_MULTIPLE = 32  # the pipeline's own check_inputs rule
MEL_N_FFT = 1024  # LTX-2's audio preprocessing (ltx-core AudioProcessor): 1024-point STFT, slaney mel
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# -- tiny checkpoint -----------------------------------------------------------------------------
_TINY_TEXT_DIM = 32  # Gemma3 hidden size == connector heads x head_dim (2 x 16)
_TINY_TEXT_LAYERS = 2
# The scheduler the real LTX-2 diffusers folders ship (Lightricks/LTX-2 ``scheduler/``, as diffusers'
# LTX-Video 0.9.1+ converter writes it): flow-match Euler, shift by ``mu`` from the video's token count
# (exponential time shift between base_shift at 1024 tokens and max_shift at 4096), the schedule
# stretched to end at shift_terminal. Native sampling keeps it; the DMD scheduler overrides its
# shifting (tested).
_LTX2_SCHEDULER = dict(
    num_train_timesteps=1000,
    shift=1.0,
    use_dynamic_shifting=True,
    base_shift=0.95,
    max_shift=2.05,
    base_image_seq_len=1024,
    max_image_seq_len=4096,
    shift_terminal=0.1,
    time_shift_type="exponential",
    stochastic_sampling=False,
)


def _tiny_tokenizer():
    """Character-level BPE with byte fallback: builds offline, saves and reloads with from_pretrained."""
    from transformers import GemmaTokenizer

    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
    chars = ["\u2581", *(string.ascii_letters + string.digits + string.punctuation)]
    byte_tokens = [f"<0x{i:02X}>" for i in range(256)]
    vocab = {token: i for i, token in enumerate(specials + chars + byte_tokens)}
    return GemmaTokenizer(vocab=vocab, merges=[])


def _tiny_text_encoder(vocab_size: int):
    from transformers import (
        Gemma3Config,
        Gemma3ForConditionalGeneration,
        Gemma3TextConfig,
        SiglipVisionConfig,
    )

    text = Gemma3TextConfig(
        vocab_size=vocab_size,
        hidden_size=_TINY_TEXT_DIM,
        intermediate_size=64,
        num_hidden_layers=_TINY_TEXT_LAYERS,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=2048,
        sliding_window=64,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
    )
    vision = SiglipVisionConfig(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=16,
        patch_size=8,
    )
    config = Gemma3Config(
        text_config=text,
        vision_config=vision,
        mm_tokens_per_image=4,
        image_token_index=4,
        boi_token_index=2,
        eoi_token_index=1,
    )
    return Gemma3ForConditionalGeneration(config)


def _tiny_components() -> dict[str, Any]:
    """8x spatial/temporal video VAE (patch_size 4), 4x audio VAE, 240x vocoder (16 kHz mel -> 24 kHz)."""
    from diffusers import (
        AutoencoderKLLTX2Audio,
        AutoencoderKLLTX2Video,
        FlowMatchEulerDiscreteScheduler,
        LTX2VideoTransformer3DModel,
    )
    from diffusers.pipelines.ltx2 import LTX2TextConnectors
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder

    tokenizer = _tiny_tokenizer()
    connector = dict(attention_head_dim=16, num_attention_heads=2, num_layers=1, num_learnable_registers=None)
    connectors = LTX2TextConnectors(
        caption_channels=_TINY_TEXT_DIM,
        text_proj_in_factor=_TINY_TEXT_LAYERS + 1,
        **{f"{side}_connector_{k}": v for side in ("video", "audio") for k, v in connector.items()},
        connector_rope_base_seq_len=32,
        rope_double_precision=False,
        rope_type="split",
    )
    transformer = LTX2VideoTransformer3DModel(
        in_channels=8,
        out_channels=8,
        num_attention_heads=2,
        attention_head_dim=8,
        cross_attention_dim=16,
        vae_scale_factors=(8, 8, 8),
        audio_in_channels=4,
        audio_out_channels=4,
        audio_num_attention_heads=2,
        audio_attention_head_dim=4,
        audio_cross_attention_dim=8,
        num_layers=2,
        caption_channels=_TINY_TEXT_DIM,
        rope_double_precision=False,
        rope_type="split",
    )
    vae = AutoencoderKLLTX2Video(
        latent_channels=8,
        block_out_channels=(8, 8, 8),
        down_block_types=("LTX2VideoDownBlock3D",) * 3,
        layers_per_block=(1, 1, 1, 1),
        spatio_temporal_scaling=(True, True, True),
        downsample_type=("temporal", "temporal", "spatiotemporal"),
        decoder_block_out_channels=(8, 8, 8),
        decoder_layers_per_block=(1, 1, 1, 1),
        decoder_spatio_temporal_scaling=(True, True, True),
        decoder_inject_noise=(False,) * 4,
        upsample_type=("spatiotemporal", "temporal", "temporal"),
        upsample_residual=(False,) * 3,
        upsample_factor=(1,) * 3,
        patch_size=4,
        patch_size_t=1,
        spatial_compression_ratio=8,
        temporal_compression_ratio=8,
    )
    # Packed audio token width = latent_channels x mel_bins / 4 = 4 = base_channels (the latent stats' size).
    audio_vae = AutoencoderKLLTX2Audio(
        base_channels=4,
        output_channels=2,
        ch_mult=(1, 1, 1),
        num_res_blocks=1,
        in_channels=2,
        resolution=32,
        latent_channels=2,
        sample_rate=16000,
        mel_hop_length=160,
        mel_bins=8,
    )
    # 100 mel frames/s x (6 x 5 x 8) = 24000 samples/s; kernel - stride even keeps lengths exact.
    vocoder = LTX2Vocoder(
        in_channels=2 * 8,
        hidden_channels=32,
        out_channels=2,
        upsample_kernel_sizes=[16, 15, 16],
        upsample_factors=[6, 5, 8],
        resnet_kernel_sizes=[3],
        resnet_dilations=[[1, 3]],
        output_sampling_rate=24000,
    )
    return dict(
        scheduler=FlowMatchEulerDiscreteScheduler(**_LTX2_SCHEDULER),
        vae=vae,
        audio_vae=audio_vae,
        text_encoder=_tiny_text_encoder(len(tokenizer)),
        tokenizer=tokenizer,
        connectors=connectors,
        transformer=transformer,
        vocoder=vocoder,
    )


# -- helpers -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _ImageCondition:
    role: str  # first_frame | last_frame | reference | guide
    field: str  # the request field it came from (named in errors)
    path: Path
    pixel_frame: int
    strength: float
    guide: Guide | None = None  # a guide's frames are read as guides are (an image or a video)


@dataclass(frozen=True)
class _Dims:
    frames: int  # latent frames
    height: int  # latent height
    width: int  # latent width
    audio_frames: int  # audio latent frames


@dataclass
class _Video:
    latents: torch.Tensor  # packed (1, tokens, C): the clip's tokens, then appended keyframe tokens
    mask: torch.Tensor  # (1, tokens, 1) conditioning strength: 0 = generate, 1 = keep clean
    clean: torch.Tensor  # clean condition latents where mask > 0
    coords: torch.Tensor  # RoPE positions of every token
    clip_tokens: int  # the clip's own tokens; keyframe tokens are dropped after sampling


@contextmanager
def _untiled(vae) -> Iterator[None]:
    """Encode conditions untiled: they must not depend on decode tiling (not part of the cache key)."""
    saved = vae.use_tiling, vae.use_framewise_encoding, vae.use_framewise_decoding
    vae.use_tiling = vae.use_framewise_encoding = vae.use_framewise_decoding = False
    try:
        yield
    finally:
        vae.use_tiling, vae.use_framewise_encoding, vae.use_framewise_decoding = saved


@contextmanager
def _reading(field: str) -> Iterator[None]:
    """Name the request field when its input file cannot be read."""
    import av

    try:
        yield
    except (OSError, ValueError, av.FFmpegError) as e:
        raise CapabilityError(field, f"cannot read {e}") from e


def _open_rgb(path: Path) -> Image.Image:
    with Image.open(path) as im:
        return im.convert("RGB")


def _fit(audio: np.ndarray, samples: int) -> np.ndarray:
    """Trim or pad with silence to exactly ``samples``."""
    if audio.shape[1] >= samples:
        return audio[:, :samples]
    return np.pad(audio, ((0, 0), (0, samples - audio.shape[1])))


def _read_audio(path: Path, rate: int, channels: int, limit: int) -> np.ndarray:
    """The first audio stream of any file FFmpeg reads, resampled, at most ``limit`` samples per channel."""
    import av

    layout = {1: "mono", 2: "stereo"}[channels]
    resampler = av.AudioResampler(format="fltp", layout=layout, rate=rate)
    parts: list[np.ndarray] = []
    with av.open(str(path)) as container:
        if not container.streams.audio:
            raise ValueError(f"{path} has no audio stream")
        for frame in [*container.decode(container.streams.audio[0]), None]:  # None flushes the resampler
            parts += [out.to_ndarray() for out in resampler.resample(frame)]
            if sum(part.shape[1] for part in parts) >= limit:
                break
    if not parts:
        raise ValueError(f"{path} has an empty audio track")
    return np.concatenate(parts, axis=1)[:, :limit].astype(np.float32)


def _log_mel(wave: torch.Tensor, rate: int, hop: int, mel_bins: int) -> torch.Tensor:
    """(channels, samples) -> (1, channels, frames, mel_bins) log-mel, as LTX-2's audio VAE was trained on."""
    from transformers.audio_utils import mel_filter_bank

    spec = torch.stft(
        wave,
        MEL_N_FFT,
        hop_length=hop,
        win_length=MEL_N_FFT,
        window=torch.hann_window(MEL_N_FFT),
        center=True,
        pad_mode="reflect",
        return_complex=True,
    ).abs()  # (channels, freqs, frames), power 1
    bank = mel_filter_bank(
        num_frequency_bins=MEL_N_FFT // 2 + 1,
        num_mel_filters=mel_bins,
        min_frequency=0.0,
        max_frequency=rate / 2,
        sampling_rate=rate,
        norm="slaney",
        mel_scale="slaney",
    )
    mel = torch.from_numpy(bank.T).float() @ spec
    return torch.log(mel.clamp(min=1e-5)).transpose(1, 2).unsqueeze(0)


@dataclass(frozen=True)
class _Guidance:
    """One stream's guidance (the video's or the audio's), as ``__call__`` resolves it: CFG's scale
    and LTX-2's further terms (STG, modality isolation, rescale; their "off" values by default)."""

    cfg: float
    stg: float = 0.0
    modality: float = 1.0
    rescale: float = 0.0


@dataclass(frozen=True)
class _Terms:
    """Each stream's guidance and the DiT calls a step makes (the sampler's
    :meth:`~shotloom.config.Sampler.step_calls`, as ``__call__`` decides them)."""

    video: _Guidance
    audio: _Guidance
    calls: StepCalls
    stg_blocks: tuple[int, ...] = ()

    @classmethod
    def of(cls, sampler: Sampler, scale: float) -> _Terms:
        """The terms of a request with guidance ``scale`` on ``sampler`` (each audio_* value None:
        the video's, as ``__call__``)."""

        def audio(value: float | None, video: float) -> float:
            return video if value is None else value

        return cls(
            _Guidance(scale, sampler.stg_scale, sampler.modality_scale, sampler.guidance_rescale),
            _Guidance(
                sampler.audio_guidance(scale),
                audio(sampler.audio_stg_scale, sampler.stg_scale),
                audio(sampler.audio_modality_scale, sampler.modality_scale),
                audio(sampler.audio_guidance_rescale, sampler.guidance_rescale),
            ),
            sampler.step_calls(scale),
            tuple(sampler.spatio_temporal_guidance_blocks),
        )

    def record(self) -> dict[str, Any]:
        """The terms that ran, for the sampling record (nothing when only CFG did)."""
        out: dict[str, Any] = {}
        if self.calls.stg:
            out.update(
                stg_scale=self.video.stg,
                audio_stg_scale=self.audio.stg,
                spatio_temporal_guidance_blocks=list(self.stg_blocks),
            )
        if self.calls.modality:
            out.update(modality_scale=self.video.modality, audio_modality_scale=self.audio.modality)
        if self.video.rescale > 0 or self.audio.rescale > 0:
            out.update(guidance_rescale=self.video.rescale, audio_guidance_rescale=self.audio.rescale)
        return out


@dataclass(frozen=True)
class _Preds:
    """One stream's velocity predictions of a step: the conditional one and, where that call ran,
    the negative prompt's (CFG), the perturbed DiT's (STG) and the isolated modality's."""

    cond: torch.Tensor
    uncond: torch.Tensor | None = None
    stg: torch.Tensor | None = None
    modality: torch.Tensor | None = None


def _guided_x0(sample: torch.Tensor, preds: _Preds, sigma: torch.Tensor, g: _Guidance) -> torch.Tensor:
    """Velocities -> the guided x0, as ``__call__`` combines them: each term a delta in x0 space
    added to the conditional x0 in its order (CFG, STG, modality), then guidance rescale toward the
    conditional x0's std (diffusers' ``rescale_noise_cfg``)."""
    x0 = sample - preds.cond * sigma
    out = x0
    if preds.uncond is not None:
        out = out + (g.cfg - 1) * (x0 - (sample - preds.uncond * sigma))
    if preds.stg is not None:
        out = out + g.stg * (x0 - (sample - preds.stg * sigma))
    if preds.modality is not None:
        out = out + (g.modality - 1) * (x0 - (sample - preds.modality * sigma))
    if g.rescale > 0:
        from diffusers.pipelines.ltx2.pipeline_ltx2_condition import rescale_noise_cfg

        out = rescale_noise_cfg(out, x0, guidance_rescale=g.rescale)
    return out


def _check_sigmas(scheduler, sampler: Sampler) -> None:
    """The scheduler must reproduce the YAML's sigma list exactly (after ``shift``)."""
    probe = copy.deepcopy(scheduler)
    probe.set_timesteps(sigmas=sampler.sigmas)
    s = np.asarray(sampler.sigmas, dtype=np.float64)
    expected = sampler.shift * s / (1 + (sampler.shift - 1) * s)
    got = probe.sigmas[:-1].double().cpu().numpy()
    if got.shape != expected.shape or not np.allclose(got, expected, atol=1e-6):
        raise ValueError(f"sampler.sigmas: the scheduler config turns {sampler.sigmas} into {got.tolist()}")


# -- adapter -------------------------------------------------------------------------------------
class LTX2Adapter(FamilyAdapter):
    family = "ltx2"
    # Small, and the waveform degrades audibly in half precision.
    pinned_dtypes = {"audio_vae": "float32", "vocoder": "float32"}

    # -- checkpoint -----------------------------------------------------------------------------
    @classmethod
    def build_tiny_checkpoint(cls, out_dir: Path, seed: int = 0) -> Path:
        """A tiny random LTX2ConditionPipeline (~1 MB); same seed -> identical files."""
        from diffusers import LTX2ConditionPipeline

        return build_checkpoint(out_dir, seed, lambda: LTX2ConditionPipeline(**_tiny_components()))

    @classmethod
    def load(cls, cfg: InferenceConfig, device: str = "cpu") -> LTX2Adapter:
        ckpt = ensure_checkpoint(cfg, cls.build_tiny_checkpoint)
        from diffusers import DiffusionPipeline, LTX2ConditionPipeline

        dtype = {"default": DTYPES[cfg.dtype], **{k: DTYPES[v] for k, v in cls.pinned_dtypes.items()}}
        pipe = DiffusionPipeline.from_pretrained(str(ckpt), local_files_only=True, dtype=dtype)
        name = type(pipe).__name__
        if name not in SUPPORTED_PIPELINES:
            raise ValueError(f"paths.checkpoint: {name} is not an LTX-2 pipeline ({SUPPORTED_PIPELINES})")
        if name != PIPELINE:  # same components; not from_pipe, which casts everything to float32
            params = inspect.signature(LTX2ConditionPipeline.__init__).parameters
            pipe = LTX2ConditionPipeline(**{k: v for k, v in pipe.components.items() if k in params})
        pipe.set_progress_bar_config(disable=True)
        place_pipeline(pipe, device, cfg.offload)
        adapter = cls(cfg, pipe, device)
        # The checkpoint's schedulers; without an audio one, __call__ samples audio on a copy of the video's.
        adapter.keep_checkpoint_scheduler(pipe.scheduler)
        adapter.keep_checkpoint_scheduler(pipe.audio_scheduler or pipe.scheduler, name="audio_scheduler")
        layers = pipe.transformer.config.num_layers
        for where, sampler in cfg.named_samplers():
            if sampler.mode == "dmd":
                _check_sigmas(adapter.scheduler_for(sampler), sampler)
            if bad := [b for b in sampler.spatio_temporal_guidance_blocks if not 0 <= b < layers]:
                raise ValueError(
                    f"{where}.spatio_temporal_guidance_blocks: {bad} are not blocks of this DiT "
                    f"(0..{layers - 1})"
                )
        adapter._use(cfg.sampler)  # requests switch them per sampler
        adapter.configure_tiling(cfg.tiling)
        adapter._count_encoders()
        return adapter

    def configure_tiling(self, tiling: Tiling) -> None:
        """Tiled decode in space and time; tiles and strides must fall on latent boundaries."""
        vae = self.pipe.vae
        if not tiling.enabled:
            vae.disable_tiling()
            vae.use_framewise_decoding = False
            return
        spatial, temporal = vae.spatial_compression_ratio, vae.temporal_compression_ratio
        ratios = dict(tile_px=spatial, stride_px=spatial, tile_frames=temporal, stride_frames=temporal)
        for field, ratio in ratios.items():
            value = getattr(tiling, field)
            if value % ratio:
                raise ValueError(f"tiling.{field}: must be a multiple of the VAE ratio {ratio}, got {value}")
        vae.enable_tiling(
            tile_sample_min_height=tiling.tile_px,
            tile_sample_min_width=tiling.tile_px,
            tile_sample_min_num_frames=tiling.tile_frames,
            tile_sample_stride_height=tiling.stride_px,
            tile_sample_stride_width=tiling.stride_px,
            tile_sample_stride_num_frames=tiling.stride_frames,
        )
        vae.use_framewise_decoding = True  # LTX-2's VAE tiles time only in "framewise" decoding

    def _count_encoders(self) -> None:
        """Count real encoder forwards with pre-hooks on the encoder modules."""
        pipe = self.pipe
        modules = {
            "text_encoder": pipe.text_encoder,
            "connectors": pipe.connectors,
            "vae_encode": pipe.vae.encoder,
            "audio_vae_encode": pipe.audio_vae.encoder,
        }
        for name, module in modules.items():
            module.register_forward_pre_hook(lambda _m, _a, n=name: self.encoder_counter.hit(n))

    # -- capabilities ---------------------------------------------------------------------------
    @property
    def capabilities(self) -> Capabilities:
        pipe = self.pipe
        spatial = pipe.vae_spatial_compression_ratio * pipe.transformer_spatial_patch_size
        return Capabilities(
            max_reference_images=MAX_REFERENCES,
            first_frame=True,
            last_frame=True,
            audio_in=True,
            audio_out=True,
            frame_multiple=pipe.vae_temporal_compression_ratio * pipe.transformer_temporal_patch_size,
            size_multiple=math.lcm(SIZE_MULTIPLE, spatial),
            video_to_video=True,
            adapters=self.adapter_names(),
            anchors_need_two_latent_frames=True,  # one latent frame: nothing after the first to anchor
            max_audio_references=1,  # LTX-2 conditions on one audio track
            frame_guides=True,  # conditions at any pixel frame (first-frame tokens or keyframes)
            audio_guides=True,  # the one audio track, held where the guide's sound is
            fps=FPS,
            guidance_range=GUIDANCE_RANGE,
        )

    # -- encode ---------------------------------------------------------------------------------
    @torch.no_grad()
    def encode(self, req: GenerationRequest) -> TensorBundle:
        """Text (+ negative when guidance > 1), image condition latents, the input audio's latents."""
        self.check(req)
        device = torch.device(self.device)
        # Read every input first: a bad file fails before any encoder runs.
        conditions = self._image_conditions(req)
        images: list[Image.Image | np.ndarray] = []
        for c in conditions:
            if c.guide is not None:
                frames = guide_frames(c.guide, c.field, req.num_frames)
                images.append(Image.fromarray(frames[0]) if len(frames) == 1 else np.stack(frames))
                continue
            with _reading(c.field):
                images.append(_open_rgb(c.path))
        audio, audio_mask = self._read_input_audio(req)
        source = None
        if req.source_video is not None:
            source = source_frames(req.source_video, req.num_frames, req.width, req.height)
        whole = audio is not None and audio_mask is None  # the input track is the whole soundtrack
        source_audio = self._read_source_audio(req) if source is not None and not whole else None
        tensors = self._encode_text(req, device)
        with _untiled(self.pipe.vae):
            for i, image in enumerate(images):
                tensors[f"image_latents.{i}"] = self._encode_image(image, req, device)
            if source is not None:
                tensors["source_latents"] = self._encode_source(source, device)
        if audio is not None:
            tensors["audio_latents"] = self._encode_audio(audio, req, device)
        if audio_mask is not None:
            tensors["audio_mask"] = audio_mask
        if source_audio is not None:
            tensors["source_audio_latents"] = self._encode_audio(source_audio, req, device)
        meta = {
            "family": self.family,
            "width": req.width,
            "height": req.height,
            "num_frames": req.num_frames,
            "fps": req.fps,
            "uses_negative": self.uses_negative(req),
            "audio_in": audio is not None,
            "conditions": [
                {"role": c.role, "pixel_frame": c.pixel_frame, "strength": c.strength} for c in conditions
            ],
        }
        return TensorBundle({k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}, meta)

    def _encode_text(self, req: GenerationRequest, device: torch.device) -> dict[str, torch.Tensor]:
        """Gemma hidden states, then the connectors: their output is ~25x smaller than Gemma's layer stack."""
        pipe = self.pipe
        use_negative = self.uses_negative(req)
        embeds, mask, neg_embeds, neg_mask = pipe.encode_prompt(
            prompt=req.prompt,
            negative_prompt=req.negative_prompt,
            do_classifier_free_guidance=use_negative,
            device=device,
        )
        out: dict[str, torch.Tensor] = {}
        for prefix, e, m in (("", embeds, mask), ("negative_", neg_embeds, neg_mask)):
            if e is None:
                continue
            video, audio, connector_mask = pipe.connectors(e, m, padding_side=pipe.tokenizer_padding_side)
            out[f"{prefix}prompt_embeds"] = video
            out[f"{prefix}audio_prompt_embeds"] = audio
            out[f"{prefix}prompt_attention_mask"] = connector_mask
        return out

    @staticmethod
    def _image_conditions(req: GenerationRequest) -> list[_ImageCondition]:
        last = req.num_frames - 1
        out = []
        if req.first_frame is not None:
            out.append(_ImageCondition("first_frame", "first_frame", req.first_frame, 0, 1.0))
        if req.last_frame is not None:
            out.append(_ImageCondition("last_frame", "last_frame", req.last_frame, last, 1.0))
        n = len(req.memory)
        for i, slot in enumerate(req.memory):
            frame = max(1, round((i + 1) * last / (n + 1)))  # evenly spread, never frame 0 (that overwrites)
            field = f"memory[{i}].image"
            out.append(_ImageCondition("reference", field, slot.image, frame, REFERENCE_STRENGTH))
        for i, guide in enumerate(req.guides):
            if guide.kind == "video":
                out.append(_ImageCondition("guide", guide_field(i), guide.path, guide.frame, 1.0, guide))
        return out

    def _encode_image(
        self, image: Image.Image | np.ndarray, req: GenerationRequest, device: torch.device
    ) -> torch.Tensor:
        """The pipeline's own preprocessing (H.264 CRF re-compression of a still, cover-resize, crop,
        a video trimmed to the 8k+1 grid) + VAE mode."""
        from diffusers.pipelines.ltx2.pipeline_ltx2_condition import LTX2VideoCondition

        pipe = self.pipe
        frames = pipe.preprocess_conditions(
            LTX2VideoCondition(frames=image), req.height, req.width, req.num_frames, device=device
        )[0][0]
        latents = pipe.vae.encode(frames).latent_dist.mode()
        return pipe._normalize_latents(latents, pipe.vae.latents_mean, pipe.vae.latents_std).float()

    def _encode_source(self, frames: np.ndarray, device: torch.device) -> torch.Tensor:
        """A source video's normalised latents (VAE mode), as the DiT sees clean video."""
        pipe = self.pipe
        video = torch.from_numpy(frames).permute(3, 0, 1, 2).unsqueeze(0) * 2.0 - 1.0  # (1, 3, F, H, W)
        latents = pipe.vae.encode(video.to(device, pipe.vae.dtype)).latent_dist.mode()
        return pipe._normalize_latents(latents, pipe.vae.latents_mean, pipe.vae.latents_std).float()

    def _read_source_audio(self, req: GenerationRequest) -> np.ndarray | None:
        """The source video's own audio track (re-noised like its frames), or None without one."""
        import av

        with _reading("source_video"), av.open(str(req.source_video)) as container:
            if not container.streams.audio:
                return None
        return self._audio_span(req.source_video, req, "source_video")

    def _audio_span(self, path: Path, req: GenerationRequest, field: str) -> np.ndarray:
        """``path``'s audio at the audio VAE's rate, covering exactly the clip's audio latents."""
        pipe = self.pipe
        ratio, hop = pipe.audio_vae_temporal_compression_ratio, pipe.audio_hop_length
        span = self._dims(req).audio_frames * ratio * hop
        channels = pipe.audio_vae.config.in_channels
        with _reading(field):
            wave = _read_audio(path, pipe.audio_sampling_rate, channels, span)
        return _fit(wave, span)  # silence past the input's end

    def _read_input_audio(self, req: GenerationRequest) -> tuple[np.ndarray | None, torch.Tensor | None]:
        """The one input track at the audio VAE's rate, covering exactly the clip's audio latents,
        and which audio latent frames it holds ((1, frames), 1 = held; None: all of them): a memory
        slot's audio (the whole track), or a guide's sound (from its frame on). (None, None) without."""
        slot = next((i for i, s in enumerate(req.memory) if s.audio is not None), None)
        if slot is not None:
            return self._audio_span(req.memory[slot].audio, req, f"memory[{slot}].audio"), None
        for i, guide in enumerate(req.guides):
            if guide.kind == "audio" or guide.with_audio:
                wave, mask = self._guide_audio(guide, req, guide_field(i))
                return wave, None if bool(mask.all()) else mask
        return None, None

    def _guide_audio(
        self, guide: Guide, req: GenerationRequest, field: str
    ) -> tuple[np.ndarray, torch.Tensor]:
        """A guide's sound placed at its frame (snapped to an audio latent frame) in a silent track
        as long as the clip's audio latents, cut at the clip's end; and the latent frames it covers."""
        pipe = self.pipe
        dims = self._dims(req)
        per_latent = pipe.audio_vae_temporal_compression_ratio * pipe.audio_hop_length  # samples
        start = min(dims.audio_frames, round(guide.frame / req.fps * pipe.audio_sampling_rate / per_latent))
        span = dims.audio_frames * per_latent
        channels = pipe.audio_vae.config.in_channels
        with _reading(field):
            sound = _read_audio(guide.path, pipe.audio_sampling_rate, channels, span - start * per_latent)
        wave = np.zeros((channels, span), dtype=np.float32)
        wave[:, start * per_latent : start * per_latent + sound.shape[1]] = sound
        mask = torch.zeros(1, dims.audio_frames)
        mask[:, start : min(dims.audio_frames, start + math.ceil(sound.shape[1] / per_latent))] = 1.0
        return wave, mask

    def _encode_audio(self, wave: np.ndarray, req: GenerationRequest, device: torch.device) -> torch.Tensor:
        """Log-mel, then the audio VAE: raw latents (1, C, frames, mel), as __call__'s ``audio_latents``."""
        pipe = self.pipe
        avae = pipe.audio_vae
        wave_t = torch.from_numpy(wave)
        mel = _log_mel(wave_t, pipe.audio_sampling_rate, pipe.audio_hop_length, pipe.audio_mel_bins)
        latents = avae.encode(mel.to(device, avae.dtype)).latent_dist.mode()
        return latents[:, :, : self._dims(req).audio_frames].float()

    # -- denoise --------------------------------------------------------------------------------
    @torch.no_grad()
    def denoise(
        self, cond: TensorBundle, req: GenerationRequest, progress: Progress | None = None
    ) -> TensorBundle:
        """Sample from ``cond`` alone (runs no encoder) with the request's sampler: the checkpoint's
        scheduler as ``__call__`` runs it (native) or few-step DMD. Same seed -> bit-identical
        latents, and ``__call__``'s own for a prompt-only or first-frame request."""
        self._check_cond(cond, req)
        pipe = self.pipe
        device = torch.device(self.device)
        t = {k: v.to(device) for k, v in cond.tensors.items()}
        dims = self._dims(req)
        v2v = "source_latents" in t
        strength = req.strength if v2v else None
        sampler, steps = self.sampling(req)
        sched, audio_sched = self._use(sampler)
        # 1. The clip's tokens and the appended keyframes' (native shifts its schedule by their count).
        video = self._prepare_video(t, cond.meta["conditions"], req, dims)
        # 2. Timesteps. dmd: the YAML's sigmas (pinned on the DMD scheduler); native: __call__'s.
        #    Video-to-video: their tail from the strength on, starting from the source at its sigma.
        if sampler.mode == "dmd":
            sigmas = strength_schedule(sampler.sigmas, strength)
            for s in (sched, audio_sched):
                with pinned(s, sigmas):  # DMD schedulers answer their pinned list, whatever is passed
                    s.set_timesteps(sigmas=sigmas, device=device)
            noise_scale = float(sched.sigmas[0])
        else:
            tokens = video.latents.shape[1]
            noise_scale = _native_schedule((sched, audio_sched), steps, tokens, strength, device)
        # 3. Noise from the generator (video, then audio, as __call__); DMD re-noise from the global RNG.
        generator = seed_everything(req.seed)
        video = self._noised(video, generator, noise_scale)
        held = "audio_latents" in t
        audio = self._prepare_audio(t, dims, generator, device, noise_scale if v2v else None)
        # 4. Sample: CFG (a [negative, positive] batch) where either stream's guidance is > 1 (the
        #    video's is the request's), and LTX-2's further terms (STG, modality isolation, rescale)
        #    as the sampler sets them.
        hold = self._audio_hold(t) if held else None
        terms = _Terms.of(sampler, req.guidance_scale)
        with self.step_cache(req, len(sched.timesteps)):
            latents, audio = self._sample(
                t, video, audio, held, hold, (sched, audio_sched), req, dims, progress, sampler.mode, terms
            )
        used = [float(s) for s in sched.sigmas[: len(sched.timesteps)]]
        # 5. Unpack and denormalise, as __call__ does for output_type="latent".
        vae, avae = pipe.vae, pipe.audio_vae
        latents = pipe._unpack_latents(
            latents[:, : video.clip_tokens],
            dims.frames,
            dims.height,
            dims.width,
            pipe.transformer_spatial_patch_size,
            pipe.transformer_temporal_patch_size,
        )
        latents = pipe._denormalize_latents(
            latents, vae.latents_mean, vae.latents_std, vae.config.scaling_factor
        )
        audio = pipe._denormalize_audio_latents(audio, avae.latents_mean, avae.latents_std)
        audio = pipe._unpack_audio_latents(audio, dims.audio_frames, num_mel_bins=self._latent_mel_bins)
        meta = {
            "family": self.family,
            "kind": "latents",
            "seed": req.seed,
            "shift": sampler.shift,
            "sigmas": used,
            "strength": strength,
            "shape": list(latents.shape),
            "audio_shape": list(audio.shape),
            "audio_held": held,
            "audio_held_frames": int(t["audio_mask"].sum())
            if "audio_mask" in t
            else dims.audio_frames * held,
            "width": req.width,
            "height": req.height,
            "num_frames": req.num_frames,
            "fps": req.fps,
            "sampling": self.sampling_record(
                sampler,
                req,
                used,
                audio_guidance_scale=terms.audio.cfg if terms.calls.cfg else None,
                **terms.record(),
            ),
        }
        tensors = {"video": latents.float().cpu().contiguous(), "audio": audio.float().cpu().contiguous()}
        return TensorBundle(tensors, meta)

    def scheduler_for(self, sampler, name: str = "scheduler"):
        """As every family's; but LTX-2's scheduler shifts dynamically (by ``mu`` of the token
        count), where a fixed ``shift`` is ignored: a native ``flow_shift`` replaces the dynamic
        shift with that fixed one (the exponential time shift by ``mu`` is the fixed shift exp(mu))."""
        base = self._checkpoint_schedulers[name]
        dynamic = bool(base.config.get("use_dynamic_shifting"))
        if sampler.mode != "native" or sampler.flow_shift is None or not dynamic:
            return super().scheduler_for(sampler, name)
        key = (name, sampler.model_dump_json())
        if key not in self._schedulers:
            self._schedulers[key] = type(base).from_config(
                base.config, shift=sampler.flow_shift, use_dynamic_shifting=False
            )
        return self._schedulers[key]

    def _use(self, sampler: Sampler) -> tuple:
        """Put ``sampler``'s video and audio schedulers on the pipeline (an audio one only where the
        checkpoint has one: __call__ copies the video's otherwise) and return them."""
        pipe = self.pipe
        pipe.scheduler = self.scheduler_for(sampler)
        audio = self.scheduler_for(sampler, "audio_scheduler")
        if pipe.audio_scheduler is not None:
            pipe.audio_scheduler = audio
        return pipe.scheduler, audio

    def _check_cond(self, cond: TensorBundle, req: GenerationRequest) -> None:
        meta = cond.meta
        if meta.get("family") != self.family:
            raise ValueError(f"conditioning was encoded for {meta.get('family')!r}, not {self.family!r}")
        for name in ("width", "height", "num_frames", "fps"):
            given = getattr(req, name)
            if meta.get(name) != given:
                raise ValueError(f"{name}: conditioning was encoded at {meta.get(name)}, request has {given}")
        if self.uses_negative(req) and "negative_prompt_embeds" not in cond.tensors:
            raise ValueError("guidance_scale: conditioning has no negative prompt (encoded with guidance 1)")

    @property
    def _latent_mel_bins(self) -> int:
        return self.pipe.audio_mel_bins // self.pipe.audio_vae_mel_compression_ratio

    def _dims(self, req: GenerationRequest) -> _Dims:
        pipe = self.pipe
        ratio = float(pipe.audio_vae_temporal_compression_ratio)
        per_second = pipe.audio_sampling_rate / pipe.audio_hop_length / ratio
        return _Dims(
            frames=(req.num_frames - 1) // pipe.vae_temporal_compression_ratio + 1,
            height=req.height // pipe.vae_spatial_compression_ratio,
            width=req.width // pipe.vae_spatial_compression_ratio,
            audio_frames=round(req.num_frames / req.fps * per_second),
        )

    def _prepare_video(
        self,
        t: dict[str, torch.Tensor],
        conditions: list[dict],
        req: GenerationRequest,
        dims: _Dims,
    ) -> _Video:
        """``LTX2ConditionPipeline.prepare_latents`` with the condition latents taken from the bundle,
        before its noise (``_noised``)."""
        pipe = self.pipe
        device = torch.device(self.device)
        p, pt = pipe.transformer_spatial_patch_size, pipe.transformer_temporal_patch_size
        shape = (1, pipe.transformer.config.in_channels, dims.frames, dims.height, dims.width)
        # Video-to-video starts from the source (re-noised below to noise_scale), else from nothing.
        base = t["source_latents"].float() if "source_latents" in t else torch.zeros(shape, device=device)
        latents = pipe._pack_latents(base, p, pt)
        mask = pipe._pack_latents(torch.zeros((1, 1, *shape[2:]), device=device), p, pt)
        packed = [pipe._pack_latents(t[f"image_latents.{i}"].float(), p, pt) for i in range(len(conditions))]
        first = [i for i, c in enumerate(conditions) if c["pixel_frame"] == 0]
        # Frame-0 conditions replace the first latent frame's tokens.
        strengths = [float(c["strength"]) for c in conditions]
        latents, mask, clean = pipe.apply_first_frame_conditioning(
            latents,
            mask,
            [packed[i] for i in first],
            [strengths[i] for i in first],
            [0] * len(first),
            latent_height=dims.height,
            latent_width=dims.width,
        )
        coords = pipe.transformer.rope.prepare_video_coords(
            1, dims.frames, dims.height, dims.width, device, fps=float(req.fps)
        )
        clip_tokens = latents.shape[1]
        # The others are keyframes: tokens appended at their pixel frame, with mask = strength.
        for i, c in enumerate(conditions):
            if c["pixel_frame"] == 0:
                continue
            kf_shape = t[f"image_latents.{i}"].shape
            kf_coords = pipe._prepare_keyframe_coords(
                kf_shape[2],
                kf_shape[3],
                kf_shape[4],
                pixel_frame_idx=c["pixel_frame"],
                # A still is one pixel frame; a guide video's latent frames are 8 each after the first.
                num_pixel_frames=(kf_shape[2] - 1) * pipe.vae_temporal_compression_ratio + 1,
                fps=float(req.fps),
                device=device,
            )
            latents, clean = torch.cat([latents, packed[i]], 1), torch.cat([clean, packed[i]], 1)
            kf_mask = torch.full((*packed[i].shape[:2], 1), strengths[i], device=device)
            mask = torch.cat([mask, kf_mask], 1)
            coords = torch.cat([coords, kf_coords], dim=2)
        return _Video(latents, mask, clean, coords, clip_tokens)

    @staticmethod
    def _noised(video: _Video, generator, noise_scale: float) -> _Video:
        """The end of ``prepare_latents``: noise over every token, to ``noise_scale``."""
        noise = _randn(video.latents.shape, generator, video.latents.device)
        # Conditioned tokens start (1 - strength) of the way to noise.
        scaled = (1.0 - video.mask) * noise_scale
        return replace(video, latents=noise * scaled + video.latents * (1 - scaled))

    def _audio_hold(self, t: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """A partly held input track: (mask (1, tokens, 1), its clean packed latents); None when the
        whole track is held (or none is)."""
        if "audio_mask" not in t:
            return None
        pipe, avae = self.pipe, self.pipe.audio_vae
        packed = pipe._pack_audio_latents(t["audio_latents"].float())
        clean = pipe._normalize_audio_latents(packed, avae.latents_mean, avae.latents_std)
        return t["audio_mask"].float().view(1, -1, 1), clean

    def _prepare_audio(
        self,
        t: dict[str, torch.Tensor],
        dims: _Dims,
        generator,
        device: torch.device,
        v2v_sigma: float | None,
    ) -> torch.Tensor:
        """Packed audio latents: the input track (normalised, kept clean), or noise as __call__ draws
        it; for video-to-video, the source's track (or silence) re-noised to ``v2v_sigma``."""
        pipe = self.pipe
        avae = pipe.audio_vae

        def normalised(raw: torch.Tensor) -> torch.Tensor:
            packed = pipe._pack_audio_latents(raw.float())
            return pipe._normalize_audio_latents(packed, avae.latents_mean, avae.latents_std)

        if "audio_latents" in t and "audio_mask" not in t:
            return normalised(t["audio_latents"])
        shape = (1, dims.audio_frames, pipe.audio_latent_channels * self._latent_mel_bins)
        noise = _randn(shape, generator, device)
        if v2v_sigma is None:
            start = noise
        else:
            source = t.get("source_audio_latents")
            clean = normalised(source) if source is not None else torch.zeros_like(noise)
            start = noise * v2v_sigma + clean * (1.0 - v2v_sigma)
        if "audio_mask" not in t:
            return start
        # A guide's sound: its tokens start (and stay) clean, the others as without it.
        held = t["audio_mask"].float().view(1, -1, 1)
        return start * (1 - held) + normalised(t["audio_latents"]) * held

    def _sample(
        self,
        t: dict[str, torch.Tensor],
        video: _Video,
        audio: torch.Tensor,
        held: bool,
        hold: tuple[torch.Tensor, torch.Tensor] | None,
        schedulers: tuple,
        req: GenerationRequest,
        dims: _Dims,
        progress: Progress | None,
        mode: str,
        terms: _Terms,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The denoising loop of ``__call__``: CFG as one [negative, positive] batch, then STG and
        modality isolation each one more DiT call on the positive half (as ``__call__``, which names
        them ``uncond_stg`` and ``uncond_modality`` for step caches), combined by :func:`_guided_x0`.

        ``mode`` native: each step is ``__call__``'s (x0 at the step's sigma, the conditioning mask
        blended in x0 space, one step of the scheduler); dmd: each token re-noised to its own level.
        ``held``: an input track is held clean; ``hold`` (mask, clean latents) when only part of it is
        (a guide's sound): those tokens at timestep 0, the others denoised like the video's tokens.
        ``terms``: each stream's guidance (the video's CFG is the request's)."""
        pipe = self.pipe
        device = torch.device(self.device)
        sched, audio_sched = schedulers
        names = ("prompt_embeds", "audio_prompt_embeds", "prompt_attention_mask")
        if terms.calls.cfg:  # CFG batch: [negative, positive]
            text = [torch.cat([t[f"negative_{n}"], t[n]]) for n in names]
        else:
            text = [t[n] for n in names]
        batch = text[0].shape[0]

        def rep(x: torch.Tensor) -> torch.Tensor:
            return x.repeat((batch,) + (1,) * (x.ndim - 1))

        video_coords, mask_in = rep(video.coords), rep(video.mask)
        audio_coords = rep(pipe.transformer.audio_rope.prepare_audio_coords(1, dims.audio_frames, device))
        latents, dtype = video.latents, text[0].dtype

        def call(name: str, batch_inputs: dict, where: dict, **perturb) -> tuple[torch.Tensor, torch.Tensor]:
            # One cache context a call, as __call__ names it (step caches key on it).
            with pipe.transformer.cache_context(name, **where):
                pred_video, pred_audio = pipe.transformer(
                    **batch_inputs,
                    num_frames=dims.frames,
                    height=dims.height,
                    width=dims.width,
                    fps=float(req.fps),
                    audio_num_frames=dims.audio_frames,
                    use_cross_timestep=True,
                    return_dict=False,
                    **perturb,
                )
            return pred_video.float(), pred_audio.float()

        steps = len(sched.timesteps)
        for i, step_t in enumerate(sched.timesteps):
            timestep = step_t.expand(batch)
            audio_step = audio_sched.timesteps[i].expand(batch)
            if hold is not None:  # per-token timesteps: held tokens at 0
                audio_timestep = audio_step.unsqueeze(-1) * (1 - rep(hold[0]).squeeze(-1))
                audio_sigma = audio_step  # the cross-attention's level: the generated tokens'
            else:
                audio_timestep = torch.zeros_like(timestep) if held else audio_step
                audio_sigma = audio_timestep
            inputs = dict(
                hidden_states=rep(latents).to(dtype),
                audio_hidden_states=rep(audio).to(dtype),
                encoder_hidden_states=text[0],
                audio_encoder_hidden_states=text[1],
                timestep=timestep.unsqueeze(-1) * (1 - mask_in.squeeze(-1)),
                audio_timestep=audio_timestep,
                sigma=timestep,
                audio_sigma=audio_sigma,
                encoder_attention_mask=text[2],
                audio_encoder_attention_mask=text[2],
                video_coords=video_coords,
                audio_coords=audio_coords,
            )
            where = dict(step_index=i, sigma=float(sched.sigmas[i]), num_inference_steps=steps)

            both = call("cond_uncond", inputs, where)
            if batch > 1:
                video_preds = _Preds(both[0][1:], uncond=both[0][:1])
                audio_preds = _Preds(both[1][1:], uncond=both[1][:1])
            else:
                video_preds, audio_preds = _Preds(both[0]), _Preds(both[1])
            # STG and modality isolation perturb the positive prompt's call (the batch's last).
            positive = {k: v[batch - 1 :] for k, v in inputs.items()}
            if terms.calls.stg:
                stg = call(
                    "uncond_stg", positive, where, spatio_temporal_guidance_blocks=list(terms.stg_blocks)
                )
                video_preds, audio_preds = replace(video_preds, stg=stg[0]), replace(audio_preds, stg=stg[1])
            if terms.calls.modality:
                alone = call("uncond_modality", positive, where, isolate_modalities=True)
                video_preds = replace(video_preds, modality=alone[0])
                audio_preds = replace(audio_preds, modality=alone[1])
            sigma = sched.sigmas[i]
            if mode == "native":  # __call__'s step: x0 at the step's sigma for every token
                x0 = _guided_x0(latents, video_preds, sigma, terms.video)
                x0 = (x0 * (1 - video.mask) + video.clean * video.mask).to(x0.dtype)
                latents = sched.step((latents - x0) / sigma, step_t, latents, return_dict=False)[0]
            else:
                # Each token's own noise level: a token held at strength s sits at (1 - s) * sigma.
                x0 = _guided_x0(latents, video_preds, sigma * (1 - video.mask), terms.video)
                x0 = (x0 * (1 - video.mask) + video.clean * video.mask).to(x0.dtype)
                renoised = sched.step((latents - x0) / sigma, step_t, latents, return_dict=False)[0]
                # Re-noise each token to sigma_next * (1 - s); lerp is exact at weights 0 and 1.
                latents = torch.lerp(x0, renoised, 1 - video.mask)
            if hold is not None:  # as the video's conditioned tokens: held ones stay exactly clean
                # (the mask is 0 or 1, so the per-token level is the step's sigma wherever it counts, and
                # a native Euler step leaves a clean token where it is: the lerp changes nothing there)
                mask, clean = hold
                level = audio_sched.sigmas[i]
                audio_x0 = _guided_x0(audio, audio_preds, level * (1 - mask), terms.audio)
                audio_x0 = (audio_x0 * (1 - mask) + clean * mask).to(audio_x0.dtype)
                renoised = audio_sched.step((audio - audio_x0) / level, step_t, audio, return_dict=False)[0]
                audio = torch.lerp(audio_x0, renoised, 1 - mask)
            elif not held:
                level = audio_sched.sigmas[i]
                audio_x0 = _guided_x0(audio, audio_preds, level, terms.audio)
                velocity = (audio - audio_x0) / level
                audio = audio_sched.step(velocity, step_t, audio, return_dict=False)[0]
            if progress is not None:
                progress(i + 1, steps)  # may raise (cancel): propagates
        return latents, audio

    # -- decode ---------------------------------------------------------------------------------
    @torch.no_grad()
    def decode(
        self, latents: TensorBundle, req: GenerationRequest, progress: Progress | None = None
    ) -> DecodedMedia:
        """VAE decode (tiled per config) to uint8 frames; audio VAE + vocoder to the clip's exact duration."""
        frames = self._decode_video(latents.tensors["video"], req)
        if progress is not None:
            progress(1, 2)
        audio, rate = self._decode_audio(latents.tensors["audio"], req)
        if progress is not None:
            progress(2, 2)
        return DecodedMedia(frames=frames, audio=audio, sample_rate=rate)

    def _decode_video(self, z: torch.Tensor, req: GenerationRequest) -> np.ndarray:
        pipe = self.pipe
        vae = pipe.vae
        z = z.to(self.device, vae.dtype)
        # __call__'s defaults: decode_timestep 0 and no decode noise (used only by timestep-conditioned VAEs).
        temb = None
        if vae.config.timestep_conditioning:
            temb = torch.zeros(z.shape[0], device=z.device, dtype=z.dtype)
        video = vae.decode(z, temb, return_dict=False)[0]
        frames = pipe.video_processor.postprocess_video(video, output_type="np")[0]  # (F, H, W, 3) in [0, 1]
        frames = (np.clip(frames, 0.0, 1.0) * 255.0).round().astype(np.uint8)
        expected = (req.num_frames, req.height, req.width, 3)
        if frames.shape != expected:
            raise RuntimeError(f"decoded {frames.shape}, expected {expected}: latents do not fit the request")
        return frames

    def _decode_audio(self, z: torch.Tensor, req: GenerationRequest) -> tuple[np.ndarray, int]:
        """(channels, samples) float32 in [-1, 1], trimmed/padded to round(num_frames / fps * rate).

        The causal audio VAE yields 4 x frames - 3 mel frames and audio latents run at 25/s, so the raw
        waveform is a few tens of milliseconds off the video's duration; the tail is padded with silence
        or trimmed so that audio and video end together.
        """
        pipe = self.pipe
        mel = pipe.audio_vae.decode(z.to(self.device, pipe.audio_vae.dtype), return_dict=False)[0]
        wave = pipe.vocoder(mel.to(pipe.vocoder.dtype))[0].float().cpu().numpy()
        rate = int(pipe.vocoder.config.output_sampling_rate)
        samples = round(req.num_frames / req.fps * rate)
        return _fit(np.clip(wave, -1.0, 1.0), samples).astype(np.float32), rate


def _native_schedule(schedulers: tuple, steps: int, tokens: int, strength: float | None, device) -> float:
    """``__call__``'s timesteps on the checkpoint's (video, audio) schedulers: ``steps`` sigmas from 1
    to 1/steps, shifted by ``mu`` of the video's ``tokens`` (the clip's and the keyframes', as
    ``__call__`` counts them) where the scheduler shifts dynamically; for video-to-video their tail
    from the first sigma at or below ``strength``. Returns the noise scale the latents start at
    (``__call__``'s 1.0; the tail's first sigma for video-to-video)."""
    from diffusers.pipelines.ltx2.pipeline_ltx2_condition import calculate_shift

    config = schedulers[0].config
    sigmas = np.linspace(1.0, 1 / steps, steps)
    mu = calculate_shift(
        tokens,
        config.get("base_image_seq_len", 1024),
        config.get("max_image_seq_len", 4096),
        config.get("base_shift", 0.95),
        config.get("max_shift", 2.05),
    )
    start = tail_start(schedulers[0], steps, strength, device=device, sigmas=sigmas, mu=mu)
    for scheduler in schedulers:
        with from_step(scheduler, start):
            scheduler.set_timesteps(sigmas=sigmas, device=device, mu=mu)
    return 1.0 if strength is None else float(schedulers[0].sigmas[0])


def _randn(shape: tuple[int, ...], generator, device: torch.device) -> torch.Tensor:
    from diffusers.utils.torch_utils import randn_tensor

    return randn_tensor(shape, generator=generator, device=device, dtype=torch.float32)


__all__ = ["LTX2Adapter", "MAX_REFERENCES", "REFERENCE_STRENGTH", "SUPPORTED_PIPELINES"]
