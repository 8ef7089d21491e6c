"""Standalone generation from an inference YAML, no Dagster.

    shotloom generate --config configs/inference.wan-tiny.yaml \
        --prompt "a red kite over the sea" --seed 7 --output out.mp4
    python inference.py ...   (the same, from a checkout)

On a terminal a bar shows the denoise steps on stderr; otherwise each step is a plain line there.
The summary (JSON) is the one line on stdout.

Obeys the inference YAML exactly (checkpoint, dtype, sampler, defaults, tiling,
offload). It is also the baseline the benchmarks compare the service against.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from shotloom.capabilities import CapabilityError
from shotloom.performance import PerformanceError
from shotloom.request import MemorySlot


@contextmanager
def step_progress(stream: TextIO) -> Iterator[Callable[[int, int], None]]:
    """A denoise progress callback: a bar on a terminal (tqdm), a plain line a step elsewhere (a log
    file, a pipe), so the one line on stdout stays the summary."""
    if stream.isatty():
        from tqdm import tqdm

        bar = None

        def on_step(done: int, total: int) -> None:
            nonlocal bar
            if bar is None:
                bar = tqdm(total=total, desc="denoise", unit="step", file=stream)
            bar.update(done - bar.n)

        try:
            yield on_step
        finally:
            if bar is not None:
                bar.close()
        return

    def on_line(done: int, total: int) -> None:
        print(f"denoise step {done}/{total}", file=stream, flush=True)

    yield on_line


def parse_memory(value: str) -> MemorySlot:
    image, _, audio = value.partition(",")
    return MemorySlot(Path(image), Path(audio) if audio else None)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="inference YAML (default: $SHOTLOOM_INFERENCE_CONFIG or the tiny Wan)")
    p.add_argument("--prompt", required=True)
    p.add_argument("--negative-prompt")
    p.add_argument("--first-frame", type=Path)
    p.add_argument("--last-frame", type=Path)
    p.add_argument("--memory", type=parse_memory, action="append", default=[], metavar="IMG[,AUDIO]")
    p.add_argument("--seed", type=int)
    p.add_argument("--width", type=int)
    p.add_argument("--height", type=int)
    p.add_argument("--num-frames", type=int)
    p.add_argument("--fps", type=int)
    p.add_argument("--steps", type=int, help="denoising steps (native sampler; dmd takes only its own)")
    p.add_argument(
        "--guidance-scale", type=float, help=">1: classifier-free guidance with the negative prompt"
    )
    p.add_argument(
        "--step-cache", metavar="NAME", help="a step cache of the YAML's performance.step_caches, or none"
    )
    p.add_argument("--source-video", type=Path, help="video-to-video: the clip to start from")
    p.add_argument(
        "--strength", type=float, help="how far from --source-video to go, in (0, 1] (default: the YAML's)"
    )
    p.add_argument("--lora", metavar="NAME[:SCALE]", help="a LoRA adapter of the YAML's `adapters`, by name")
    p.add_argument("--output", type=Path, required=True)
    p.add_argument(
        "--save-latents",
        type=Path,
        metavar="PATH",
        help="also write the denoised latents (safetensors, key `latents`; `audio_latents` with sound)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from shotloom.runtime import get_runtime

    runtime = get_runtime(args.config)
    req = runtime.resolve(
        args.prompt,
        width=args.width,
        height=args.height,
        num_frames=args.num_frames,
        fps=args.fps,
        seed=args.seed,
        guidance_scale=args.guidance_scale,
        num_inference_steps=args.steps,
        step_cache=args.step_cache,
        negative_prompt=args.negative_prompt,
        first_frame=args.first_frame,
        last_frame=args.last_frame,
        memory=args.memory,
        source_video=args.source_video,
        strength=args.strength,
        lora=args.lora.partition(":")[0] if args.lora else None,
        lora_scale=float(args.lora.partition(":")[2]) if args.lora and ":" in args.lora else None,
    )
    try:
        with step_progress(sys.stderr) as progress:
            result = runtime.generate(req, args.output, progress, save_latents=args.save_latents)
    except (CapabilityError, FileNotFoundError, PerformanceError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    summary = {
        "output": str(result.output),
        "seed": req.seed,
        "strength": req.strength,
        "lora": req.lora,
        "sampling": {k: v for k, v in result.sampling.items() if k != "sigmas"},
        "latents": str(args.save_latents) if args.save_latents else None,
        "checkpoint": runtime.checkpoint_id,
        "cache_hit": result.cache_hit,
        "timings": result.timings,
        # On CUDA the allocator's peak; elsewhere the process's peak resident set.
        "peak_memory_mb": round(runtime.peak_memory_mb()[0], 1),
        **result.media,
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
