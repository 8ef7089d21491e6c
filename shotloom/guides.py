"""Frame-anchored guides: what a guide file is (an image, a video, a sound) and how many clip
frames it covers, measured once from the file. No torch: the API measures guides at admission
with the same code the workers run before they encode.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from shotloom.capabilities import CapabilityError
from shotloom.request import GenerationRequest, Guide


def guide_field(index: int) -> str:
    return f"guides[{index}]"


def anchor(frame: int, num_frames: int, field: str) -> int:
    """A guide's frame as a clip frame index: from the end when below 0 (-1: the last frame).
    Outside the clip: CapabilityError naming ``field``."""
    index = frame + num_frames if frame < 0 else frame
    if not 0 <= index < num_frames:
        raise CapabilityError(
            field,
            f"frame {frame} is outside the clip's {num_frames} frames "
            f"(0..{num_frames - 1}, or -{num_frames}..-1 from the end)",
        )
    return index


def is_image(path: Path) -> bool:
    """A still image Pillow reads (an animated GIF counts as its first frame)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            im.verify()
        return True
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError):
        return False


def measure(guide: Guide, field: str) -> Guide:
    """``guide`` with ``frames`` counted (1 for an image) and ``with_audio`` kept only where the
    video has a sound. Unreadable: CapabilityError naming ``field``."""
    if guide.kind == "audio":
        return replace(guide, frames=None, with_audio=False)
    if is_image(guide.path):
        return replace(guide, frames=1, with_audio=False)
    from shotloom.media import probe  # PyAV

    try:
        info = probe(guide.path)
    except Exception as exc:  # any demux/decode error: the file is what is wrong
        raise CapabilityError(field, f"neither an image nor a readable video ({exc})") from exc
    if info.frames < 1:
        raise CapabilityError(field, "the video has no frames")
    return replace(guide, frames=info.frames, with_audio=guide.with_audio and info.has_audio)


def measured(req: GenerationRequest) -> GenerationRequest:
    """The request with every guide measured (see :func:`measure`)."""
    if not req.guides:
        return req
    return replace(req, guides=tuple(measure(g, guide_field(i)) for i, g in enumerate(req.guides)))


def guide_frames(guide: Guide, field: str, num_frames: int) -> list[np.ndarray]:
    """A video-kind guide's frames as uint8 (H, W, 3) at their own size: an image's one, or a
    video's, which must fit in the clip from the guide's frame (CapabilityError naming ``field``
    otherwise, and when the file cannot be read)."""
    from PIL import Image

    room = num_frames - guide.frame
    if is_image(guide.path):
        try:
            with Image.open(guide.path) as im:
                return [np.asarray(im.convert("RGB"))]
        except (OSError, ValueError) as exc:
            raise CapabilityError(field, f"cannot read {guide.path}: {exc}") from exc
    from shotloom.media import iter_frames

    frames: list[np.ndarray] = []
    try:
        for frame in iter_frames(guide.path):
            frames.append(frame)
            if len(frames) > room:
                break
    except Exception as exc:  # PyAV/FFmpeg errors of any kind: the input is what is wrong
        raise CapabilityError(field, f"cannot read {guide.path}: {exc}") from exc
    if not frames:
        raise CapabilityError(field, f"{guide.path} has no decodable video frames")
    if len(frames) > room:
        raise CapabilityError(
            field,
            f"the video does not fit in the clip from frame {guide.frame}: "
            f"more than {room} frames, the clip has {num_frames}",
        )
    return frames
