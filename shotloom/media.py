"""MP4 writing, probing, decoding and merging with PyAV (its wheels bundle FFmpeg: libx264 + AAC).

Audio needs care. FFmpeg's AAC encoder prepends 1024 priming samples and pads the last frame to
1024 samples. MP4 hides the priming with an edit list (the decoder drops that first frame) and the
last packet's duration marks the real end, but a decoder still returns the padded tail. So audio
length is measured from packet timestamps and decoded audio is trimmed to it, and AAC is never
stream-copied across files (the priming packets would land mid-film): merges decode the audio and
encode it once, each segment padded or trimmed to its video length so shots stay in sync.

Every output is written to a hidden temp file in the target directory and renamed into place, so a
reader never sees a partial MP4 (or PNG: thumbnails and spritesheets are written the same way).
"""

from __future__ import annotations

import errno
import hashlib
import math
import os
import shutil
import wave
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal
from uuid import uuid4

import av
import numpy as np
from PIL import Image

VIDEO_CODEC = "libx264"
PIX_FMT = "yuv420p"
AAC_FRAME = 1024  # samples per AAC frame
AAC_RATES = frozenset(av.Codec("aac", "w").audio_rates or ())
# faststart puts the index first so a browser (the Dagster UI, an API client) can play while loading.
_MUX_OPTIONS = {"movflags": "+faststart"}
# Same frames in, same bytes out. With macroblock-tree rate control (mbtree, on by default) the
# bundled x264 (core 165) on an AVX-512 CPU writes streams that depend on what the process's heap
# held before: identical frames encoded after different allocations gave up to 6 distinct streams
# in 6 encodes (64x64 to 480x272, 17 or 85 frames), decoded up to 41/255 apart, so two runs of one
# seed wrote different MP4s. Off either mbtree or AVX-512 (x264's asm flags) every encode was
# byte-identical, so it is one of its AVX-512 mbtree kernels. Masking AVX-512 would need the CPU's
# flags (naming one it lacks crashes), so mbtree goes: at crf 18, PSNR moved by under 0.6 dB either
# way and size by -14..+21% on our clips. tests/test_determinism.py holds it.
_X264_PARAMS = "mbtree=0"

SPRITESHEET_FRAMES = 9  # default cells of a spritesheet (a 3x3 grid)
SPRITESHEET_CELL_WIDTH = 160  # px: cells are downscaled to at most this width, keeping aspect

__all__ = [
    "SPRITESHEET_CELL_WIDTH",
    "SPRITESHEET_FRAMES",
    "ImageInfo",
    "MediaInfo",
    "MergeResult",
    "SpritesheetInfo",
    "extract_audio_wav",
    "extract_frame",
    "file_sha256",
    "iter_frames",
    "merge_mp4",
    "probe",
    "read_audio",
    "read_frames",
    "read_frames_at",
    "spritesheet_indexes",
    "write_mp4",
    "write_mp4_stream",
    "write_spritesheet",
    "write_thumbnail",
]


@dataclass(frozen=True)
class MediaInfo:
    path: Path
    frames: int  # exact: counted from the demuxed video packets
    fps: Fraction
    width: int
    height: int
    video_codec: str
    pix_fmt: str | None
    duration_s: float  # video
    has_audio: bool
    audio_codec: str | None
    audio_sample_rate: int | None
    audio_channels: int | None
    audio_duration_s: float | None  # priming and end padding excluded
    bytes: int
    sha256: str


@dataclass(frozen=True)
class MergeResult:
    video_mode: Literal["copy", "reencode"]
    frames: int
    duration_s: float
    info: MediaInfo


@dataclass(frozen=True)
class ImageInfo:
    """A written PNG (thumbnail or spritesheet)."""

    path: Path
    width: int
    height: int
    bytes: int
    sha256: str


@dataclass(frozen=True)
class SpritesheetInfo(ImageInfo):
    frames: tuple[int, ...]  # indexes of the video frames in the cells, row-major
    columns: int
    rows: int
    cell_width: int
    cell_height: int

    @property
    def grid(self) -> str:
        """``"<columns>x<rows>"``, e.g. ``"3x3"``."""
        return f"{self.columns}x{self.rows}"


# -- small helpers ------------------------------------------------------------------------------


def _as_fps(fps: int | Fraction) -> Fraction:
    q = Fraction(fps)
    if q <= 0:
        raise ValueError(f"fps must be positive, got {fps}")
    return q


def _check_even(width: int, height: int) -> None:
    # yuv420p subsamples chroma 2x2; we refuse rather than silently resize the user's frames.
    if width <= 0 or height <= 0 or width % 2 or height % 2:
        raise ValueError(f"H.264/yuv420p needs positive even width and height, got {width}x{height}")


def _samples_at(n_frames: int, fps: Fraction, rate: int) -> int:
    """Audio samples covering the first ``n_frames`` video frames (rounded half up, cumulative: no drift)."""
    return math.floor(Fraction(n_frames * rate) / fps + Fraction(1, 2))


def _layout(channels: int) -> str:
    if channels not in (1, 2):
        raise ValueError(f"audio must have 1 or 2 channels, got {channels}")
    return "mono" if channels == 1 else "stereo"


def _fit(audio: np.ndarray, n: int) -> np.ndarray:
    """Pad with silence or trim to exactly ``n`` samples."""
    if audio.shape[1] >= n:
        return audio[:, :n]
    return np.pad(audio, ((0, 0), (0, n - audio.shape[1])))


def _open_input(path: Path) -> Any:
    try:
        return av.open(str(path))
    except (av.FFmpegError, OSError) as e:
        raise ValueError(f"cannot read media file {path}: {e}") from e


class NoSpaceLeft(OSError):
    """A file could not be written for want of room: names the file and what was free."""


@contextmanager
def _atomic_output(path: Path) -> Iterator[Path]:
    """Yield a temp path beside ``path``; rename it onto ``path`` only if the body succeeds. A full
    disk (or quota) leaves nothing behind and says so, with the path and the room there."""
    tmp = path.with_name(f".{path.name}.{uuid4().hex}.part")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        yield tmp
        os.replace(tmp, path)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        tmp.unlink(missing_ok=True)  # before measuring: what it took is free again
        try:
            free: int | str = free_bytes(path.parent)
        except OSError:
            free = "unknown"
        raise NoSpaceLeft(
            exc.errno,
            f"no space left to write {path}: {free} bytes free on its disk after dropping the partial file",
        ) from exc
    finally:
        tmp.unlink(missing_ok=True)


def free_bytes(path: Path) -> int:
    """Free bytes on the disk that holds ``path`` (a path not made yet: its nearest parent's)."""
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def _open_mp4_output(tmp: Path) -> Any:
    # The temp name has no .mp4 suffix, so name the muxer explicitly.
    return av.open(str(tmp), "w", format="mp4", options=_MUX_OPTIONS)


# -- audio --------------------------------------------------------------------------------------

# Channel layouts for audio that names none (FFmpeg's defaults for the count).
_DEFAULT_LAYOUTS = {1: "mono", 2: "stereo", 3: "2.1", 4: "4.0", 5: "5.0", 6: "5.1", 7: "6.1", 8: "7.1"}


def _layout_fits(layout: str | None, channels: int) -> bool:
    """Whether ``layout`` names the speakers of ``channels`` channels ("6 channels" names none)."""
    if not layout or layout.endswith("channels"):
        return False
    try:
        return len(av.AudioLayout(layout).channels) == channels
    except ValueError:
        return False


def _resample(
    audio: np.ndarray, rate_in: int, rate_out: int, channels_out: int, layout_in: str | None = None
) -> np.ndarray:
    """Convert (channels, samples) float32 to another rate and/or channel count with swresample.

    Mono becomes each output channel unchanged (swresample would upmix it 3 dB down); more channels
    are downmixed by ``layout_in`` (default: FFmpeg's layout for the channel count).
    """
    channels_in = audio.shape[0]
    if channels_in == 1 and channels_out > 1:
        return np.repeat(_resample(audio, rate_in, rate_out, 1), channels_out, axis=0)
    if rate_in == rate_out and channels_in == channels_out:
        return audio
    if not _layout_fits(layout_in, channels_in):
        layout_in = _DEFAULT_LAYOUTS.get(channels_in)
        if layout_in is None:
            raise ValueError(f"cannot downmix {channels_in} audio channels without a channel layout")
    resampler = av.AudioResampler(format="fltp", layout=_layout(channels_out), rate=rate_out)
    out: list[np.ndarray] = []
    step = 1 << 16  # bounded frames keep swresample's buffers small
    for start in range(0, audio.shape[1], step):
        frame = av.AudioFrame.from_ndarray(
            np.ascontiguousarray(audio[:, start : start + step]), format="fltp", layout=layout_in
        )
        frame.sample_rate = rate_in
        out.extend(f.to_ndarray() for f in resampler.resample(frame))
    out.extend(f.to_ndarray() for f in resampler.resample(None))
    if not out:
        return np.zeros((channels_out, 0), np.float32)
    return np.concatenate(out, axis=1).astype(np.float32, copy=False)


def _normalise_audio(audio: np.ndarray, sample_rate: int | None) -> tuple[np.ndarray, int]:
    arr = np.asarray(audio, dtype=np.float32)
    if arr.ndim == 1:
        arr = arr[None]
    if arr.ndim != 2 or arr.shape[0] not in (1, 2):
        raise ValueError(f"audio must be (channels, samples) with 1 or 2 channels, got shape {arr.shape}")
    if not sample_rate or sample_rate <= 0:
        raise ValueError("sample_rate is required (and positive) when audio is given")
    return arr, sample_rate


def _aac_rate(rate: int, fallback: int) -> int:
    """Keep ``rate`` if AAC can encode it, else use ``fallback`` (which must be an AAC rate)."""
    if rate in AAC_RATES:
        return rate
    if fallback not in AAC_RATES:
        raise ValueError(f"AAC cannot encode {fallback} Hz; use one of {sorted(AAC_RATES)}")
    return fallback


class _AacSink:
    """Encodes (channels, n) float32 blocks into one AAC stream with continuous timestamps."""

    def __init__(self, container: Any, rate: int, channels: int):
        self.container = container
        self.rate = rate
        self.layout = _layout(channels)
        self.stream = container.add_stream("aac", rate=rate)
        self.stream.layout = self.layout
        self.stream.bit_rate = 64000 * channels
        self._pending = np.zeros((channels, 0), np.float32)
        self.written = 0  # samples pushed so far
        self._encoded = 0  # samples handed to the encoder (the next frame's pts)

    def push(self, block: np.ndarray) -> None:
        self.written += block.shape[1]
        pending = np.concatenate([self._pending, block.astype(np.float32, copy=False)], axis=1)
        full = pending.shape[1] - pending.shape[1] % AAC_FRAME
        for start in range(0, full, AAC_FRAME):
            self._encode(pending[:, start : start + AAC_FRAME])
        self._pending = pending[:, full:]

    def close(self) -> None:
        if self._pending.shape[1]:
            self._encode(self._pending)  # a short last frame: the encoder marks its real length
        for packet in self.stream.encode(None):
            self.container.mux(packet)

    def _encode(self, chunk: np.ndarray) -> None:
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(chunk), format="fltp", layout=self.layout)
        frame.sample_rate = self.rate
        frame.time_base = Fraction(1, self.rate)
        frame.pts = self._encoded
        self._encoded += chunk.shape[1]
        for packet in self.stream.encode(frame):
            self.container.mux(packet)


# -- video --------------------------------------------------------------------------------------


def _add_h264(container: Any, width: int, height: int, fps: Fraction, crf: int, preset: str) -> Any:
    _check_even(width, height)
    stream = container.add_stream(VIDEO_CODEC, rate=fps)
    stream.width, stream.height, stream.pix_fmt = width, height, PIX_FMT
    # Time base 1/fps with pts = frame index: frame count and rate are exact, no rounding drift.
    stream.time_base = 1 / fps
    stream.codec_context.time_base = 1 / fps
    stream.options = {"crf": str(crf), "preset": preset, "x264-params": _X264_PARAMS}
    return stream


def _encode_video(container: Any, stream: Any, frame: av.VideoFrame | None) -> None:
    for packet in stream.encode(frame):
        container.mux(packet)


def _iter_single_frames(frames: Iterable[np.ndarray], height: int, width: int) -> Iterator[np.ndarray]:
    """Accept single (H,W,3) frames or (n,H,W,3) chunks (e.g. a decoder's tiles) and yield frames."""
    for item in frames:
        arr = np.asarray(item)
        batch = arr[None] if arr.ndim == 3 else arr
        if batch.ndim != 4 or batch.shape[1:] != (height, width, 3):
            raise ValueError(f"expected frames of shape ({height}, {width}, 3), got {arr.shape}")
        if batch.dtype != np.uint8:
            raise ValueError(f"frames must be uint8, got {batch.dtype}")
        yield from batch


# -- writing ------------------------------------------------------------------------------------


def write_mp4_stream(
    path: str | Path,
    frames: Iterable[np.ndarray],
    width: int,
    height: int,
    fps: int | Fraction,
    audio: np.ndarray | None = None,
    sample_rate: int | None = None,
    *,
    silent_track: bool = True,
    silent_sample_rate: int = 24000,
    silent_channels: int = 2,
    crf: int = 18,
    preset: str = "medium",
) -> MediaInfo:
    """Encode frames from an iterator (H.264) plus one AAC track of exactly the video's duration.

    ``audio`` (channels, samples) float32 is resampled if AAC cannot take ``sample_rate`` and
    padded/trimmed to the video length; ``audio=None`` gives a silent track unless ``silent_track``
    is False (then the file has no audio stream).
    """
    path, fps_q = Path(path), _as_fps(fps)
    _check_even(width, height)
    track: np.ndarray | None = None
    rate, channels = silent_sample_rate, silent_channels
    if audio is not None:
        track, src_rate = _normalise_audio(audio, sample_rate)
        rate, channels = _aac_rate(src_rate, silent_sample_rate), track.shape[0]
        track = _resample(track, src_rate, rate, channels)
    elif silent_track:
        rate = _aac_rate(rate, rate)
    with _atomic_output(path) as tmp, _open_mp4_output(tmp) as out:
        video = _add_h264(out, width, height, fps_q, crf, preset)
        sink = _AacSink(out, rate, channels) if (track is not None or silent_track) else None
        n = 0
        for arr in _iter_single_frames(frames, height, width):
            _encode_at(out, video, av.VideoFrame.from_ndarray(np.ascontiguousarray(arr), format="rgb24"), n)
            n += 1
            if sink is not None:  # interleave: audio up to the end of this frame
                sink.push(_audio_span(track, channels, sink.written, _samples_at(n, fps_q, rate)))
        if n == 0:
            raise ValueError("no frames to write")
        _encode_video(out, video, None)
        if sink is not None:
            sink.close()
    return probe(path)


def _audio_span(track: np.ndarray | None, channels: int, start: int, end: int) -> np.ndarray:
    """Samples [start, end) of ``track``, silence where the track is missing or too short."""
    if track is None:
        return np.zeros((channels, end - start), np.float32)
    return _fit(track[:, start:end], end - start)


def write_mp4(
    path: str | Path,
    frames: np.ndarray,
    fps: int | Fraction,
    audio: np.ndarray | None,
    sample_rate: int | None,
    *,
    silent_track: bool = True,
    silent_sample_rate: int = 24000,
    silent_channels: int = 2,
    crf: int = 18,
    preset: str = "medium",
) -> MediaInfo:
    """Write (F, H, W, 3) uint8 frames; see :func:`write_mp4_stream` (this wrapper iterates views)."""
    frames = np.asarray(frames)  # no copy for an ndarray
    if frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"frames must be (F, H, W, 3), got shape {frames.shape}")
    _, height, width, _ = frames.shape
    return write_mp4_stream(
        path,
        iter(frames),
        width,
        height,
        fps,
        audio,
        sample_rate,
        silent_track=silent_track,
        silent_sample_rate=silent_sample_rate,
        silent_channels=silent_channels,
        crf=crf,
        preset=preset,
    )


# -- probing and reading ------------------------------------------------------------------------


@dataclass
class Span:
    """First timestamp and last timestamp + duration of one stream's packets, in its time base, and
    how many were added (a packet without a timestamp counts, and spans nothing)."""

    start: int | None = None
    end: int | None = None
    packets: int = 0

    def add(self, ts: int | None, duration: int) -> None:
        self.packets += 1
        if ts is not None:
            self.start = ts if self.start is None else min(self.start, ts)
            self.end = ts + duration if self.end is None else max(self.end, ts + duration)

    def seconds(self, time_base: Fraction | None, origin: int | None = None) -> Fraction:
        """From the first timestamp (or ``origin``) to the end, in seconds (0: nothing spanned)."""
        if self.end is None or self.start is None or not time_base:
            return Fraction(0)
        first = self.start if origin is None else origin
        return max(Fraction(0), (self.end - first) * Fraction(time_base))


def _scan(container: Any) -> tuple[Span, Span | None]:
    """One demux pass (no decoding) over the first video and audio streams.

    Packet timestamps are exact where the MP4 header is not: stream durations come from the edit
    list in the movie timescale (milliseconds), e.g. 17 frames at 16 fps read as 1.06201 s.
    Audio is measured from 0: the AAC priming packet has negative pts, and the last packet's short
    duration excludes the encoder's end padding.
    """
    video = container.streams.video[0]
    audio = container.streams.audio[0] if container.streams.audio else None
    spans = {video.index: Span()} | ({audio.index: Span()} if audio is not None else {})
    for packet in container.demux(*[video] + ([audio] if audio is not None else [])):
        if packet.size and packet.pts is not None:  # size 0: flush packets
            spans[packet.stream.index].add(packet.pts, packet.duration or 0)
    return spans[video.index], (spans[audio.index] if audio is not None else None)


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def probe(path: str | Path) -> MediaInfo:
    """Facts about an MP4 (or any file FFmpeg reads with a video stream); ValueError if unreadable."""
    path = Path(path)
    with _open_input(path) as c:
        if not c.streams.video:
            raise ValueError(f"{path} has no video stream")
        v = c.streams.video[0]
        a = c.streams.audio[0] if c.streams.audio else None
        try:
            vspan, aspan = _scan(c)
        except av.FFmpegError as e:
            raise ValueError(f"cannot read media file {path}: {e}") from e
        fps = Fraction(v.average_rate or v.guessed_rate or 0)
        duration = vspan.seconds(v.time_base)
        if not duration and fps:  # containers without packet durations
            duration = vspan.packets / fps
        return MediaInfo(
            path=path,
            frames=vspan.packets,
            fps=fps,
            width=v.codec_context.width,
            height=v.codec_context.height,
            video_codec=v.codec_context.name,
            pix_fmt=v.codec_context.pix_fmt,
            duration_s=float(duration),
            has_audio=a is not None,
            audio_codec=a.codec_context.name if a is not None else None,
            audio_sample_rate=a.codec_context.sample_rate if a is not None else None,
            audio_channels=a.codec_context.channels if a is not None else None,
            audio_duration_s=float(aspan.seconds(a.time_base, origin=0)) if a and aspan else None,
            bytes=path.stat().st_size,
            sha256=file_sha256(path),
        )


def iter_frames(path: str | Path) -> Iterator[np.ndarray]:
    """Decode video frames one at a time as (H, W, 3) uint8 RGB."""
    path = Path(path)
    with _open_input(path) as c:
        if not c.streams.video:
            raise ValueError(f"{path} has no video stream")
        for frame in c.decode(c.streams.video[0]):
            yield frame.to_ndarray(format="rgb24")


def read_frames(path: str | Path) -> np.ndarray:
    """All frames as (F, H, W, 3) uint8."""
    frames = list(iter_frames(path))
    if not frames:
        raise ValueError(f"{path} has no decodable video frames")
    return np.stack(frames)


def extract_frame(path: str | Path, index: int | None = None) -> Image.Image:
    """One frame as a PIL image; default the middle frame (a representative still of a shot)."""
    path = Path(path)
    with _open_input(path) as c:
        if not c.streams.video:
            raise ValueError(f"{path} has no video stream")
        n = _scan(c)[0].packets
    index = n // 2 if index is None else index
    if not 0 <= index < n:
        raise ValueError(f"frame index {index} out of range for {path} ({n} frames)")
    for i, frame in enumerate(iter_frames(path)):
        if i == index:
            return Image.fromarray(frame)
    raise ValueError(f"{path}: decoded fewer than {index + 1} frames")


def _frame_count(path: Path) -> int:
    """Exact video frame count from one demux pass (no decoding)."""
    with _open_input(path) as c:
        if not c.streams.video:
            raise ValueError(f"{path} has no video stream")
        try:
            return _scan(c)[0].packets
        except av.FFmpegError as e:
            raise ValueError(f"cannot read media file {path}: {e}") from e


def read_frames_at(path: str | Path, indexes: Sequence[int]) -> np.ndarray:
    """The frames at ``indexes`` (0-based, presentation order) as (len(indexes), H, W, 3) uint8.

    Each frame is reached by seeking to the keyframe at or before it and decoding forward, so a long
    film costs a few GOPs rather than a full decode. Frame i is the one shown at start + i / fps;
    a file whose timestamps do not allow that (no rate, missing pts) is decoded sequentially instead.
    """
    path = Path(path)
    wanted = sorted(set(indexes))
    if wanted and wanted[0] < 0:
        raise ValueError(f"frame index {wanted[0]} out of range for {path}")
    found: dict[int, np.ndarray] = {}
    with _open_input(path) as c:
        if not c.streams.video:
            raise ValueError(f"{path} has no video stream")
        v = c.streams.video[0]
        fps = Fraction(v.average_rate or v.guessed_rate or 0)
        if fps and v.time_base:
            try:
                found = _seek_frames(c, v, fps, wanted)
            except av.FFmpegError:
                found = {}
    if len(found) < len(wanted):  # seeking did not work for this file: one sequential pass
        found = {}
        for k, frame in enumerate(iter_frames(path)):
            if k in wanted:
                found[k] = frame
            if k >= wanted[-1]:
                break
    missing = [i for i in wanted if i not in found]
    if missing:
        raise ValueError(f"frame index {missing[0]} out of range for {path}")
    return np.stack([found[i] for i in indexes]) if indexes else np.zeros((0, 0, 0, 3), np.uint8)


def _seek_frames(c: Any, v: Any, fps: Fraction, wanted: list[int]) -> dict[int, np.ndarray]:
    """Seek-and-decode each wanted frame; stops early (returns fewer) if timestamps do not fit."""
    tb = Fraction(v.time_base)
    start = v.start_time or 0
    half = Fraction(1, 2) / fps / tb  # half a frame, in time-base units
    found: dict[int, np.ndarray] = {}
    for i in wanted:
        target = start + Fraction(i) / fps / tb
        c.seek(math.floor(target), stream=v, backward=True, any_frame=False)
        for frame in c.decode(v):
            if frame.pts is None:
                return found
            if frame.pts > target + half:  # landed past the target: the seek is not usable
                return found
            if frame.pts >= target - half:
                found[i] = frame.to_ndarray(format="rgb24")
                break
        else:
            return found  # past the end: the caller reports it
    return found


# -- stills: thumbnail and spritesheet ----------------------------------------------------------


def spritesheet_indexes(n_frames: int, count: int = SPRITESHEET_FRAMES) -> list[int]:
    """``count`` evenly spaced frame indexes from first to last frame (every frame if fewer)."""
    if n_frames < 1:
        raise ValueError(f"a clip needs at least one frame, got {n_frames}")
    if count < 1:
        raise ValueError(f"spritesheet count must be at least 1, got {count}")
    if n_frames <= count:
        return list(range(n_frames))
    if count == 1:
        return [n_frames // 2]
    # round(i * (n - 1) / (count - 1)) with integers, half up: distinct since n > count
    return [(2 * i * (n_frames - 1) + count - 1) // (2 * (count - 1)) for i in range(count)]


FrameSource = np.ndarray | str | os.PathLike


def _frames_from(source: FrameSource, choose: Callable[[int], list[int]]) -> tuple[list[int], np.ndarray]:
    """(indexes, frames) picked by ``choose(n_frames)`` from (F, H, W, 3) uint8 frames or a video file."""
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        indexes = choose(_frame_count(path))
        return indexes, read_frames_at(path, indexes)
    frames = np.asarray(source)
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.shape[0] < 1:
        raise ValueError(f"frames must be (F, H, W, 3) with F >= 1, got shape {frames.shape}")
    if frames.dtype != np.uint8:
        raise ValueError(f"frames must be uint8, got {frames.dtype}")
    indexes = choose(frames.shape[0])
    return indexes, frames[indexes]


def _save_png(image: Image.Image, path: Path) -> ImageInfo:
    with _atomic_output(path) as tmp:
        image.save(tmp, format="PNG")
    return ImageInfo(path, image.width, image.height, path.stat().st_size, file_sha256(path))


def write_thumbnail(frames_or_video: FrameSource, path: str | Path) -> ImageInfo:
    """A PNG of the middle frame (index F // 2, as :func:`extract_frame`), at the video's size.

    ``frames_or_video``: the (F, H, W, 3) uint8 frames already in memory (nothing is decoded), or a
    video file (only that frame is decoded, by seeking).
    """
    _, frames = _frames_from(frames_or_video, lambda n: [n // 2])
    return _save_png(Image.fromarray(frames[0]), Path(path))


def write_spritesheet(
    frames_or_video: FrameSource,
    path: str | Path,
    count: int = SPRITESHEET_FRAMES,
    max_cell_width: int = SPRITESHEET_CELL_WIDTH,
) -> SpritesheetInfo:
    """A PNG grid of ``count`` evenly spaced frames (:func:`spritesheet_indexes`), row-major.

    The grid is ceil(sqrt(k)) columns by as many rows as needed for the k frames used (3x3 for 9;
    a clip with fewer than ``count`` frames gives every frame). Each cell is its frame downscaled
    so the cell is at most ``max_cell_width`` px wide, keeping the aspect ratio (never upscaled);
    cells of a last, partial row are left black.
    """
    if max_cell_width < 1:
        raise ValueError(f"max_cell_width must be at least 1, got {max_cell_width}")
    indexes, frames = _frames_from(frames_or_video, lambda n: spritesheet_indexes(n, count))
    k, height, width = frames.shape[0], frames.shape[1], frames.shape[2]
    columns = math.isqrt(k - 1) + 1  # ceil(sqrt(k))
    rows = -(-k // columns)
    cell_w = min(width, max_cell_width)
    cell_h = max(1, round(height * cell_w / width))
    sheet = Image.new("RGB", (columns * cell_w, rows * cell_h))
    for j, frame in enumerate(frames):
        cell = Image.fromarray(frame)
        if (cell_w, cell_h) != (width, height):
            cell = cell.resize((cell_w, cell_h), Image.Resampling.LANCZOS)
        sheet.paste(cell, ((j % columns) * cell_w, (j // columns) * cell_h))
    img = _save_png(sheet, Path(path))
    return SpritesheetInfo(
        **img.__dict__,
        frames=tuple(indexes),
        columns=columns,
        rows=rows,
        cell_width=cell_w,
        cell_height=cell_h,
    )


def _frame_to_float(frame: av.AudioFrame) -> np.ndarray:
    """(channels, samples) float32 from any decoded sample format."""
    arr = frame.to_ndarray()
    if not frame.format.is_planar:
        arr = arr.reshape(-1, len(frame.layout.channels)).T
    if arr.dtype == np.uint8:
        return ((arr.astype(np.float32) - 128.0) / 128.0).astype(np.float32)
    if np.issubdtype(arr.dtype, np.integer):
        return (arr / float(np.iinfo(arr.dtype).max + 1)).astype(np.float32)
    return arr.astype(np.float32, copy=False)


def read_audio(path: str | Path) -> tuple[np.ndarray, int]:
    """Decode the first audio stream to ((channels, samples) float32, sample_rate).

    Trimmed to the packet-timestamp span [0, end): the decoder already drops the priming frame but
    returns the last frame's end padding (e.g. 25600 samples decoded for 25500 written).
    """
    path = Path(path)
    with _open_input(path) as c:
        if not c.streams.audio:
            raise ValueError(f"{path} has no audio stream")
        stream = c.streams.audio[0]
        rate, channels, time_base = (
            stream.codec_context.sample_rate,
            stream.codec_context.channels,
            stream.time_base,
        )
        aspan = _scan(c)[1]
    end = round(aspan.seconds(time_base, origin=0) * rate) if aspan else 0
    parts: list[np.ndarray] = []
    with _open_input(path) as c:  # a fresh demuxer: cheaper and safer than seeking back
        position = 0
        for frame in c.decode(c.streams.audio[0]):
            data = _frame_to_float(frame)
            if frame.pts is not None:
                position = round(Fraction(frame.pts) * time_base * rate)
            lo, hi = max(0, -position), min(data.shape[1], end - position)
            if hi > lo:
                parts.append(data[:, lo:hi])
            position += data.shape[1]
    audio = np.concatenate(parts, axis=1) if parts else np.zeros((channels, 0), np.float32)
    return audio, rate


def extract_audio_wav(path: str | Path, out_wav: str | Path) -> Path:
    """Write the audio track as 16-bit PCM WAV (e.g. to condition a later shot on it)."""
    audio, rate = read_audio(path)
    pcm = (np.clip(audio, -1.0, 1.0) * 32767.0).round().astype("<i2")
    out_wav = Path(out_wav)
    with _atomic_output(out_wav) as tmp, wave.open(str(tmp), "wb") as w:
        w.setnchannels(audio.shape[0])
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.T.tobytes())  # interleaved
    return out_wav


# -- merging ------------------------------------------------------------------------------------


REENCODE = "reencode"  # the signature's mark of an input whose packets cannot be copied


@dataclass(frozen=True)
class _Shot:
    """One merge input, checked: its probe and what placing it in the film needs."""

    index: int  # 0-based among the merge's inputs
    info: MediaInfo
    frames: int  # the frames it shows (an edit list's discarded packets not counted)
    first_pts: int  # its first video frame's pts (video time base)
    start: Fraction  # ... in seconds: its audio is placed relative to it
    rotation: int  # display rotation, degrees counter-clockwise (a multiple of 90)
    signature: tuple[object, ...]  # equal for every input: the video can be stream-copied

    @property
    def display_size(self) -> tuple[int, int]:
        w, h = self.info.width, self.info.height
        return (h, w) if self.rotation % 180 else (w, h)

    def error(self, why: str) -> ValueError:
        return _input_error(self.index, self.info.path, why)


def _input_error(index: int, path: Path, why: str) -> ValueError:
    return ValueError(f"merge input {index} ({path.name}): {why}")


def _inspect(index: int, path: Path) -> _Shot:
    """Probe a merge input and refuse what cannot be shown as a video shot, naming the input.

    Its signature holds everything that must match for packets from several files to form one valid
    H.264 stream: codec, size, pix_fmt, rate, time base, extradata, rotation and the reorder delay
    (first dts - first pts). Stream copy also needs timestamps one frame apart (pts contiguous, dts
    strictly increasing): then shifting each input by the frames before it keeps dts monotonic and
    the film's duration is the sum of the shots'. Any other input gets a signature of its own.
    """
    try:
        info = probe(path)
    except ValueError as e:
        raise _input_error(index, path, str(e)) from e

    def fail(why: str) -> ValueError:
        return _input_error(index, path, why)

    try:
        with _open_input(path) as c:
            fmt, v = c.format.name, c.streams.video[0]
            if fmt == "image2" or fmt.endswith("_pipe"):
                raise fail(f"is a still image ({fmt}), not a video")
            if info.frames == 0:
                raise fail("has no timestamped video frames (a raw stream such as .h264?)")
            if not info.fps:
                raise fail("has no video frame rate")
            if v.frames > info.frames:
                raise fail(f"is truncated: holds {info.frames} of its {v.frames} video frames")
            tb = Fraction(v.time_base)
            cc = v.codec_context
            extradata = bytes(cc.extradata or b"")
            pts: list[int] = []
            dts: list[int | None] = []
            discarded = False
            for packet in c.demux(v):
                if packet.size and packet.pts is not None:
                    if packet.is_discard:  # before an edit list's start: the decoder drops it
                        discarded = True
                        continue
                    pts.append(packet.pts)
                    dts.append(packet.dts)
        with _open_input(path) as c:
            first = next(iter(c.decode(c.streams.video[0])), None)
            if first is None:
                raise fail("has no decodable video frames")
            # the display matrix, as FFmpeg applies it: counter-clockwise degrees
            rotation = round((first.rotation or 0) / 90) * 90 % 360
    except av.FFmpegError as e:
        raise fail(f"cannot read its video: {e}") from e
    if not pts:
        raise _input_error(index, path, "shows no video frames (every packet is cut by its edit list)")
    start = min(pts)
    step = 1 / (info.fps * tb)
    regular = (
        step.denominator == 1
        and None not in dts
        and sorted(pts) == [start + k * step for k in range(len(pts))]
        and dts == [dts[0] + k * step for k in range(len(dts))]  # type: ignore[operator]
    )
    even = info.width % 2 == 0 and info.height % 2 == 0
    if regular and even and not discarded:
        delay = dts[0] - start  # type: ignore[operator]
        signature: tuple[object, ...] = (
            info.video_codec,
            info.width,
            info.height,
            info.pix_fmt,
            info.fps,
            tb,
            extradata,
            delay,
            rotation,
        )
    else:
        signature = (REENCODE, index)
    return _Shot(index, info, len(pts), start, start * tb, rotation, signature)


def _segment_frames(shots: list[_Shot], fps_out: Fraction, copy: bool) -> list[int]:
    """Output frames per input (the frames each shows). Re-encoding to another rate keeps each
    input's duration (cumulative rounding, so the film does not drift)."""
    if copy:
        return [s.frames for s in shots]
    bounds, t = [0], Fraction(0)
    for shot in shots:
        t += Fraction(shot.frames) / shot.info.fps
        bounds.append(math.floor(t * fps_out + Fraction(1, 2)))
    return [b - a for a, b in zip(bounds, bounds[1:], strict=False)]


def _audio_from(path: Path, origin: Fraction, length: Fraction) -> tuple[np.ndarray, int, str]:
    """The first audio stream as ((channels, samples) float32, rate, layout), sample 0 at ``origin``
    seconds (the first video frame), at most ``length`` seconds of it (the segment's: a track that
    starts hours after the video must not size the buffer): a later start is preceded by silence,
    an earlier one trimmed. As :func:`read_audio`, samples before t=0 (AAC priming) and after the
    packets' end are dropped."""
    with _open_input(path) as c:
        stream = c.streams.audio[0]
        rate, channels, time_base = (
            stream.codec_context.sample_rate,
            stream.codec_context.channels,
            stream.time_base,
        )
        layout = stream.layout.name
        aspan = _scan(c)[1]
    end = round(aspan.seconds(time_base, origin=0) * rate) if aspan else 0
    zero = round(origin * rate)  # absolute sample shown with the first video frame
    end = min(end, zero + math.ceil(length * rate) + 1)
    out = np.zeros((channels, max(0, end - zero)), np.float32)
    with _open_input(path) as c:
        position = 0
        for frame in c.decode(c.streams.audio[0]):
            data = _frame_to_float(frame)
            if frame.pts is not None:
                position = round(Fraction(frame.pts) * time_base * rate)
            lo, hi = max(0, -position, zero - position), min(data.shape[1], end - position)
            if hi > lo:
                out[:, position + lo - zero : position + hi - zero] = data[:, lo:hi]
            position += data.shape[1]
            if position >= end:  # the segment is full
                break
    return out, rate, layout


def _segment_audio(shot: _Shot, rate: int, channels: int, n: int) -> np.ndarray:
    if not shot.info.has_audio:
        return np.zeros((channels, n), np.float32)
    try:
        audio, src_rate, layout = _audio_from(shot.info.path, shot.start, Fraction(n, rate))
        return _fit(_resample(audio, src_rate, rate, channels, layout), n)
    except (av.FFmpegError, ValueError) as e:
        raise shot.error(f"cannot use its audio: {e}") from e


def _fit_size(width: int, height: int, box_w: int, box_h: int) -> tuple[int, int]:
    """Even size of a ``width`` x ``height`` picture scaled to fit inside the box, keeping aspect."""
    scale = min(Fraction(box_w, width), Fraction(box_h, height))
    return (
        min(box_w, max(2, 2 * round(width * scale / 2))),
        min(box_h, max(2, 2 * round(height * scale / 2))),
    )


def _pad_yuv420(frame: av.VideoFrame, width: int, height: int) -> av.VideoFrame:
    """``frame`` (yuv420p, even size) centered on a black ``width`` x ``height`` picture."""
    fw, fh = frame.width, frame.height
    src = frame.to_ndarray().ravel()  # the Y plane, then U, then V
    y = src[: fw * fh].reshape(fh, fw)
    u = src[fw * fh : fw * fh * 5 // 4].reshape(fh // 2, fw // 2)
    v = src[fw * fh * 5 // 4 :].reshape(fh // 2, fw // 2)
    x0, y0 = (width - fw) // 4 * 2, (height - fh) // 4 * 2  # even, so the chroma planes line up
    planes = np.full((height, width), 16, np.uint8), np.full((2, height // 2, width // 2), 128, np.uint8)
    planes[0][y0 : y0 + fh, x0 : x0 + fw] = y
    planes[1][0, y0 // 2 : y0 // 2 + fh // 2, x0 // 2 : x0 // 2 + fw // 2] = u
    planes[1][1, y0 // 2 : y0 // 2 + fh // 2, x0 // 2 : x0 // 2 + fw // 2] = v
    data = np.concatenate([planes[0].ravel(), planes[1].ravel()]).reshape(height * 3 // 2, width)
    return av.VideoFrame.from_ndarray(data, format=PIX_FMT)


def _conform(
    frame: av.VideoFrame, rotation: int, size: tuple[int, int], fit: tuple[int, int]
) -> av.VideoFrame:
    """A decoded frame as the film shows it: rotated upright, scaled to ``fit`` and, if that is
    smaller than the film's ``size``, centered on black (letterbox/pillarbox)."""
    if rotation:
        upright = np.rot90(frame.to_ndarray(format="rgb24"), k=rotation // 90)
        frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(upright), format="rgb24")
    out = frame.reformat(width=fit[0], height=fit[1], format=PIX_FMT)
    return out if fit == size else _pad_yuv420(out, *size)


def _copy_video(out: Any, stream: Any, shot: _Shot, offset_s: Fraction) -> None:
    """Remux one input's H.264 packets, shifted so the input starts at ``offset_s``. Each packet is
    also decoded: an input whose frames do not all decode fails here, not in the film's player."""
    decoded = 0
    try:
        with _open_input(shot.info.path) as c:
            v = c.streams.video[0]
            shift = round(offset_s / v.time_base) - shot.first_pts
            for packet in c.demux(v):
                if packet.size == 0 or packet.pts is None:
                    continue
                decoded += len(packet.decode())
                packet.pts += shift
                packet.dts = packet.dts + shift if packet.dts is not None else None
                packet.stream = stream
                out.mux(packet)
            decoded += len(v.codec_context.decode(None))
    except av.FFmpegError as e:
        raise shot.error(f"cannot decode its video: {e}") from e
    if decoded < shot.frames:
        raise shot.error(f"only {decoded} of its {shot.frames} video frames decode")


def _reencode_video(out: Any, stream: Any, shot: _Shot, n_out: int, fps_out: Fraction, first: int) -> int:
    """Decode one input and encode ``n_out`` frames at ``fps_out`` and the output size.

    Output frame j shows the input frame on screen at j / fps_out (nearest earlier frame).
    Returns the next output frame index.
    """
    size = (stream.width, stream.height)
    fit = _fit_size(*shot.display_size, *size)
    j, k, last = 0, 0, None
    try:
        with _open_input(shot.info.path) as c:
            for frame in c.decode(c.streams.video[0]):
                last = _conform(frame, shot.rotation, size, fit)
                while j < n_out and math.floor(Fraction(j) * shot.info.fps / fps_out) <= k:
                    _encode_at(out, stream, last, first + j)
                    j += 1
                k += 1
    except av.FFmpegError as e:
        raise shot.error(f"cannot decode its video: {e}") from e
    if last is None or k < shot.frames:
        raise shot.error(f"only {k} of its {shot.frames} video frames decode")
    while j < n_out:  # rounding to the film's rate: hold the last frame
        _encode_at(out, stream, last, first + j)
        j += 1
    return first + n_out


def _encode_at(out: Any, stream: Any, frame: av.VideoFrame, pts: int) -> None:
    frame.pts = pts
    frame.time_base = stream.codec_context.time_base
    _encode_video(out, stream, frame)


def merge_mp4(
    inputs: list[Path],
    output: Path,
    *,
    silent_sample_rate: int = 24000,
    channels: int = 2,
    crf: int = 18,
    preset: str = "medium",
) -> MergeResult:
    """Concatenate MP4s in order into one MP4 with one AAC track that stays in sync.

    Video is stream-copied when every input has the same encoder settings and timing (codec, even
    size, pix_fmt, rate, time base, extradata, rotation, reorder delay; see :func:`_inspect`),
    otherwise re-encoded with libx264 at the first input's rate and displayed size (rounded down to
    even): each input is rotated upright and scaled to fit inside, keeping its aspect ratio, centered
    on black. Audio is always decoded and encoded once, each input's placed from its first video
    frame: inputs without audio contribute silence, each segment is padded/trimmed to its video
    length, mono is copied to each channel (no level change) and more channels are downmixed by
    their layout. Audio rate: the first input's that has audio (if AAC can encode it), else
    ``silent_sample_rate``. An input that is not a decodable video (a still image, a raw stream
    without timestamps, a truncated file) raises ValueError naming its 0-based index and file name.
    """
    if not inputs:
        raise ValueError("merge_mp4 needs at least one input")
    output = Path(output)
    shots = [_inspect(i, Path(p)) for i, p in enumerate(inputs)]
    infos = [s.info for s in shots]
    signatures = {s.signature for s in shots}
    copy = len(signatures) == 1 and next(iter(signatures))[0] != REENCODE  # even alone
    fps_out = infos[0].fps
    width, height = shots[0].display_size
    width, height = width - width % 2, height - height % 2
    if width < 2 or height < 2:
        raise shots[0].error(f"is too small for a film: {infos[0].width}x{infos[0].height}")
    rate = next((i.audio_sample_rate for i in infos if i.audio_sample_rate), silent_sample_rate)
    rate = _aac_rate(rate, silent_sample_rate)
    seg_frames = _segment_frames(shots, fps_out, copy)
    with _atomic_output(output) as tmp, _open_mp4_output(tmp) as out:
        if copy:
            with _open_input(shots[0].info.path) as c:
                video = out.add_stream_from_template(c.streams.video[0])
        else:
            video = _add_h264(out, width, height, fps_out, crf, preset)
        sink = _AacSink(out, rate, channels)
        done = 0
        for shot, n in zip(shots, seg_frames, strict=True):
            quota = _samples_at(done + n, fps_out, rate) - _samples_at(done, fps_out, rate)
            sink.push(_segment_audio(shot, rate, channels, quota))
            if copy:
                _copy_video(out, video, shot, Fraction(done) / fps_out)
                done += n
            else:
                done = _reencode_video(out, video, shot, n, fps_out, done)
        if not copy:
            _encode_video(out, video, None)
        sink.close()
    info = probe(output)
    return MergeResult(
        video_mode="copy" if copy else "reencode", frames=info.frames, duration_s=info.duration_s, info=info
    )
