"""Checkpoint publishing and weight placement shared by every family."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import torch

MODEL_INDEX = "model_index.json"


def publish_checkpoint(tmp: Path, out: Path) -> None:
    """Rename a finished build into place; a reader never sees a half-written checkpoint."""
    if out.exists() and not (out / MODEL_INDEX).is_file():
        if any(out.iterdir()):
            raise FileExistsError(f"{out} exists and is not a diffusers checkpoint; refusing to replace it")
        out.rmdir()
    old = out.with_name(f".{out.name}.old-{uuid.uuid4().hex}") if out.exists() else None
    if old is not None:
        out.rename(old)
    try:
        tmp.rename(out)
    except OSError:
        if not (out / MODEL_INDEX).is_file():  # otherwise a concurrent builder won the race: fine
            raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def place_module(name: str, module, device: str, offload: bool) -> None:
    """Put one pipeline component on the device; with offload on CUDA the DiT streams in by blocks."""
    dev = torch.device(device)
    if offload and dev.type == "cuda" and name.startswith("transformer"):  # Wan 2.2 has transformer_2
        module.enable_group_offload(
            onload_device=dev,
            offload_device=torch.device("cpu"),
            offload_type="block_level",
            num_blocks_per_group=1,
            use_stream=True,
        )
    else:
        module.to(dev)  # on CPU offloading is a no-op: the weights already live there


def place_pipeline(pipe, device: str, offload: bool) -> None:
    """Move every component to the device (the DiT by group offloading when ``offload`` on CUDA)."""
    for name, module in pipe.components.items():
        if isinstance(module, torch.nn.Module):
            place_module(name, module, device, offload)


def build_checkpoint(out_dir: Path, seed: int, make_pipeline) -> Path:
    """Build ``make_pipeline()`` under a fixed seed into a temp sibling, then publish it atomically."""
    import tempfile

    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        with torch.random.fork_rng(devices=[]):  # leave the caller's global RNG alone
            torch.manual_seed(seed)
            pipe = make_pipeline()
        pipe.save_pretrained(tmp)
        tmp.chmod(0o755)  # mkdtemp makes it private
        publish_checkpoint(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # nothing left after a successful rename
    return out_dir


LORA_TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]  # the DiTs' attention projections (Wan, LTX-2)


def build_tiny_lora(checkpoint: Path, out: Path, seed: int, rank: int = 4) -> Path:
    """A random LoRA for a checkpoint's DiT, written by the pipeline's own ``save_lora_weights``
    (the diffusers on-disk format real adapters use). Non-zero B matrices: it changes outputs."""
    import json

    import diffusers
    from peft import LoraConfig, get_peft_model_state_dict

    index = json.loads((Path(checkpoint) / MODEL_INDEX).read_text())
    pipe_cls = getattr(diffusers, index["_class_name"])
    dit = getattr(diffusers, index["transformer"][1]).from_pretrained(
        str(Path(checkpoint) / "transformer"), local_files_only=True
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        config = LoraConfig(r=rank, lora_alpha=rank, target_modules=LORA_TARGETS, init_lora_weights=False)
        dit.add_adapter(config)
    import tempfile

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:  # published by one rename: workers building the same adapter at once never see half of it
        pipe_cls.save_lora_weights(str(tmp), transformer_lora_layers=get_peft_model_state_dict(dit))
        tmp.chmod(0o755)
        try:
            tmp.rename(out)
        except OSError:
            if not out.exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def ensure_checkpoint(cfg, build) -> Path:
    """The checkpoint folder; build the tiny one first when missing and the YAML allows it."""
    ckpt = Path(cfg.paths.checkpoint)
    if not (ckpt / MODEL_INDEX).is_file():
        if not cfg.tiny.build_if_missing:
            raise FileNotFoundError(f"paths.checkpoint: no {MODEL_INDEX} in {ckpt}")
        build(ckpt, seed=cfg.tiny.seed)
    return ckpt
