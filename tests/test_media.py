"""shotloom.media: exact frame counts and rates, A/V sync, stream-copy vs re-encode merges."""

from __future__ import annotations

import wave
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
from PIL import Image

from shotloom import media

FPS = 16
SR = 24000
N_FRAMES = 17


def gradient(frames: int = N_FRAMES, height: int = 64, width: int = 64, shift: int = 0) -> np.ndarray:
    """A moving gradient: smooth enough for H.264 to keep close to the input."""
    y, x = np.mgrid[0:height, 0:width]
    out = np.empty((frames, height, width, 3), np.uint8)
    for i in range(frames):
        out[i, ..., 0] = (x * 2 + i * 6 + shift) % 256
        out[i, ..., 1] = (y * 3) % 256
        out[i, ..., 2] = 64 + i * 4
    return out


def sine(seconds: float, rate: int = SR, channels: int = 2, hz: float = 440.0) -> np.ndarray:
    t = np.arange(round(seconds * rate)) / rate
    tone = (0.5 * np.sin(2 * np.pi * hz * t)).astype(np.float32)
    return np.repeat(tone[None], channels, axis=0)


def assert_in_sync(info: media.MediaInfo) -> None:
    assert info.has_audio and info.audio_duration_s is not None
    assert abs(info.audio_duration_s - info.duration_s) <= 1 / float(info.fps)


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict[str, Path]:
    """Written once: tone clip, silent-track clip, clip without audio, and a differently encoded clip."""
    d = tmp_path_factory.mktemp("media")
    seconds = N_FRAMES / FPS
    media.write_mp4(d / "tone.mp4", gradient(), FPS, sine(seconds), SR)
    media.write_mp4(d / "silent.mp4", gradient(shift=90), FPS, None, None)
    media.write_mp4(d / "mute.mp4", gradient(shift=30), FPS, None, None, silent_track=False)
    # other fps, size, crf and a mono 44.1 kHz track: nothing matches, so merges must re-encode
    other = gradient(frames=9, height=32, width=48)
    media.write_mp4(d / "other.mp4", other, 8, sine(9 / 8, rate=44100, channels=1), 44100, crf=30)
    return {p.stem: p for p in d.glob("*.mp4")}


def test_write_probe_roundtrip(clips):
    info = media.probe(clips["tone"])
    assert (info.frames, info.width, info.height, info.fps) == (N_FRAMES, 64, 64, Fraction(FPS))
    assert info.video_codec == "h264" and info.pix_fmt == "yuv420p"
    assert info.duration_s == pytest.approx(N_FRAMES / FPS)
    assert (info.audio_codec, info.audio_sample_rate, info.audio_channels) == ("aac", SR, 2)
    assert_in_sync(info)
    assert info.bytes == clips["tone"].stat().st_size and len(info.sha256) == 64

    frames = media.read_frames(clips["tone"])
    assert frames.shape == (N_FRAMES, 64, 64, 3) and frames.dtype == np.uint8
    assert np.abs(frames.astype(np.int16) - gradient().astype(np.int16)).mean() < 4  # lossy, but close


def test_audio_roundtrip_exact_length_and_aligned(clips):
    audio, rate = media.read_audio(clips["tone"])
    expected = sine(N_FRAMES / FPS)
    # exact sample count: AAC priming and end padding are both removed
    assert rate == SR and audio.shape == expected.shape
    # no offset: the middle of the decoded tone matches the input sample for sample
    assert np.abs(audio[:, 2000:-2000] - expected[:, 2000:-2000]).mean() < 0.01


def test_silent_track_and_no_audio(clips):
    silent = media.probe(clips["silent"])
    assert_in_sync(silent)
    assert (silent.audio_sample_rate, silent.audio_channels) == (SR, 2)
    assert np.abs(media.read_audio(clips["silent"])[0]).max() == 0.0
    mute = media.probe(clips["mute"])
    assert not mute.has_audio and mute.audio_duration_s is None
    with pytest.raises(ValueError, match="no audio stream"):
        media.read_audio(clips["mute"])


def test_audio_padded_trimmed_and_resampled(tmp_path):
    short = media.write_mp4(tmp_path / "short.mp4", gradient(), FPS, sine(0.3), SR)
    long = media.write_mp4(tmp_path / "long.mp4", gradient(), FPS, sine(5.0), SR)
    # 22050 Hz is AAC-encodable: kept; 23000 Hz is not: resampled to the silent-track rate
    kept = media.write_mp4(tmp_path / "kept.mp4", gradient(), FPS, sine(1.0, rate=22050), 22050)
    odd = media.write_mp4(tmp_path / "odd.mp4", gradient(), FPS, sine(1.0, rate=23000)[0], 23000)
    for info in (short, long, kept, odd):
        assert_in_sync(info)
    assert kept.audio_sample_rate == 22050
    assert (odd.audio_sample_rate, odd.audio_channels) == (SR, 1)


def test_stream_writer_accepts_chunks(tmp_path):
    frames = gradient(frames=12)
    chunks = [frames[:5], frames[5], frames[6:]]  # a decoder yielding tiles and single frames
    info = media.write_mp4_stream(tmp_path / "s.mp4", iter(chunks), 64, 64, 12, None, None)
    assert (info.frames, info.fps) == (12, Fraction(12))
    assert_in_sync(info)


def test_write_rejects_bad_input_and_leaves_no_partial_file(tmp_path):
    with pytest.raises(ValueError, match="even"):
        media.write_mp4(tmp_path / "odd.mp4", gradient(height=63, width=64), FPS, None, None)
    with pytest.raises(ValueError, match="uint8"):
        media.write_mp4(tmp_path / "f.mp4", gradient().astype(np.float32), FPS, None, None)
    with pytest.raises(ValueError, match="sample_rate"):
        media.write_mp4(tmp_path / "a.mp4", gradient(), FPS, sine(1.0), None)

    def broken():
        yield from gradient(frames=3)
        yield np.zeros((32, 32, 3), np.uint8)  # wrong size mid-stream

    with pytest.raises(ValueError, match="shape"):
        media.write_mp4_stream(tmp_path / "b.mp4", broken(), 64, 64, FPS)
    assert list(tmp_path.iterdir()) == []  # neither the target nor a temp file


def test_merge_same_settings_stream_copies(clips, tmp_path):
    result = media.merge_mp4([clips["tone"], clips["silent"]], tmp_path / "m.mp4")
    assert result.video_mode == "copy"
    assert result.frames == 2 * N_FRAMES and result.duration_s == pytest.approx(2 * N_FRAMES / FPS)
    assert_in_sync(result.info)
    # stream copy: the merged pictures are bit-identical to the inputs'
    merged = media.read_frames(tmp_path / "m.mp4")
    parts = [media.read_frames(clips["tone"]), media.read_frames(clips["silent"])]
    assert np.array_equal(merged, np.concatenate(parts))
    # the tone stays in the first shot; the second shot is (near) silence
    audio, _ = media.read_audio(tmp_path / "m.mp4")
    half = round(N_FRAMES / FPS * SR)
    assert np.abs(audio[:, :half]).mean() > 0.1 and np.abs(audio[:, half + 2048 :]).max() < 0.01


def test_merge_different_settings_reencodes_in_sync(clips, tmp_path):
    inputs = [clips["tone"], clips["other"], clips["mute"]]
    result = media.merge_mp4(inputs, tmp_path / "m.mp4")
    assert result.video_mode == "reencode"
    info = result.info
    assert (info.width, info.height, info.fps) == (64, 64, Fraction(FPS))  # the first input's
    # durations are kept: 17/16 s + 9/8 s + 17/16 s at 16 fps
    assert result.frames == N_FRAMES + 18 + N_FRAMES
    assert media.read_frames(tmp_path / "m.mp4").shape[0] == result.frames
    assert_in_sync(info)
    assert info.audio_sample_rate == SR and info.audio_channels == 2


def test_merge_audio_and_no_audio_stays_in_sync(clips, tmp_path):
    result = media.merge_mp4([clips["mute"], clips["tone"]], tmp_path / "m.mp4")
    assert result.video_mode == "copy" and result.frames == 2 * N_FRAMES
    assert_in_sync(result.info)
    audio, _ = media.read_audio(tmp_path / "m.mp4")
    half = round(N_FRAMES / FPS * SR)
    assert np.abs(audio[:, : half - 2048]).max() < 0.01 and np.abs(audio[:, half + 2048 :]).mean() > 0.1


def test_merge_errors(clips, tmp_path):
    with pytest.raises(ValueError, match="at least one"):
        media.merge_mp4([], tmp_path / "m.mp4")
    with pytest.raises(ValueError, match="missing.mp4"):
        media.merge_mp4([clips["tone"], tmp_path / "missing.mp4"], tmp_path / "m.mp4")
    junk = tmp_path / "junk.mp4"
    junk.write_bytes(b"not an mp4" * 50)
    with pytest.raises(ValueError, match="junk.mp4"):
        media.merge_mp4([junk], tmp_path / "m.mp4")
    assert not (tmp_path / "m.mp4").exists()


def test_extract_frame_and_wav(clips, tmp_path):
    image = media.extract_frame(clips["tone"])
    assert image.size == (64, 64)
    middle = media.read_frames(clips["tone"])[N_FRAMES // 2]
    assert np.array_equal(np.asarray(image), middle)
    with pytest.raises(ValueError, match="out of range"):
        media.extract_frame(clips["tone"], N_FRAMES)

    out = media.extract_audio_wav(clips["tone"], tmp_path / "a.wav")
    with wave.open(str(out)) as w:
        assert (w.getnchannels(), w.getframerate(), w.getnframes()) == (2, SR, round(N_FRAMES / FPS * SR))


# -- stills: thumbnail and spritesheet -----------------------------------------------------------


def cells(sheet: Image.Image, columns: int, rows: int) -> list[np.ndarray]:
    """The grid's cells, row-major."""
    w, h = sheet.width // columns, sheet.height // rows
    arr = np.asarray(sheet)
    return [arr[r * h : (r + 1) * h, c * w : (c + 1) * w] for r in range(rows) for c in range(columns)]


def test_spritesheet_indexes_are_evenly_spaced():
    assert media.spritesheet_indexes(17, 9) == [0, 2, 4, 6, 8, 10, 12, 14, 16]
    assert media.spritesheet_indexes(17, 4) == [0, 5, 11, 16]
    assert media.spritesheet_indexes(5, 9) == [0, 1, 2, 3, 4]  # fewer frames than cells: all
    assert media.spritesheet_indexes(100, 1) == [50]
    picked = media.spritesheet_indexes(1000, 9)
    assert picked[0] == 0 and picked[-1] == 999 and len(set(picked)) == 9
    with pytest.raises(ValueError):
        media.spritesheet_indexes(0, 9)
    with pytest.raises(ValueError):
        media.spritesheet_indexes(17, 0)


def test_thumbnail_is_the_middle_frame_at_video_size(clips, tmp_path):
    decoded_middle = media.read_frames(clips["tone"])[N_FRAMES // 2]
    # from the frames in memory (what write_op does): the pre-codec frame, close to the decoded one
    thumb = media.write_thumbnail(gradient(), tmp_path / "a" / "thumbnail.png")
    with Image.open(thumb.path) as im:
        assert (im.format, im.mode, im.size) == ("PNG", "RGB", (64, 64))
        pixels = np.asarray(im)
    assert np.array_equal(pixels, gradient()[N_FRAMES // 2])
    assert np.abs(pixels.astype(np.int16) - decoded_middle.astype(np.int16)).mean() < 4
    assert (thumb.width, thumb.height) == (64, 64)
    assert thumb.bytes == thumb.path.stat().st_size and thumb.sha256 == media.file_sha256(thumb.path)
    # from the video file: exactly the decoded middle frame (PNG is lossless), at the video's size
    from_video = media.write_thumbnail(clips["other"], tmp_path / "b.png")
    with Image.open(from_video.path) as im:
        assert im.size == (48, 32)
        assert np.array_equal(np.asarray(im), media.read_frames(clips["other"])[9 // 2])
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["b.png", "thumbnail.png"]  # no temp


def test_spritesheet_grid_and_cells_match_the_chosen_frames(tmp_path):
    frames = gradient(frames=N_FRAMES, height=96, width=320)  # wider than a cell: downscaled
    path = tmp_path / "wide.mp4"
    media.write_mp4(path, frames, FPS, None, None)
    decoded = media.read_frames(path)
    chosen = media.spritesheet_indexes(N_FRAMES, 9)

    def shrink(frame: np.ndarray) -> np.ndarray:  # 320x96 -> 160x48: aspect kept
        return np.asarray(Image.fromarray(frame).resize((160, 48), Image.Resampling.LANCZOS))

    for source, expected in ((frames, frames), (path, decoded)):
        sheet = media.write_spritesheet(source, tmp_path / "spritesheet.png")
        assert sheet.frames == tuple(chosen) and sheet.grid == "3x3"
        assert (sheet.cell_width, sheet.cell_height) == (160, 48)
        assert sheet.sha256 == media.file_sha256(sheet.path) and sheet.bytes == sheet.path.stat().st_size
        with Image.open(sheet.path) as im:
            assert (im.format, im.size) == ("PNG", (3 * 160, 3 * 48)) == ("PNG", (sheet.width, sheet.height))
            got = cells(im.convert("RGB"), 3, 3)
        for cell, index in zip(got, chosen, strict=True):
            assert np.array_equal(cell, shrink(expected[index]))
    # the sheet from the video and the one from memory differ only by the codec
    for cell, index in zip(got, chosen, strict=True):
        own = np.abs(cell.astype(np.int16) - shrink(frames[index]).astype(np.int16)).mean()
        neighbour = frames[index + 1 if index + 1 < N_FRAMES else index - 1]
        # and each cell is its own frame, not a neighbour (the gradient moves 6 levels a frame)
        assert own < 4 and own < np.abs(cell.astype(np.int16) - shrink(neighbour).astype(np.int16)).mean()


def test_spritesheet_of_a_short_clip_has_every_frame(clips, tmp_path):
    frames = gradient(frames=5)
    sheet = media.write_spritesheet(frames, tmp_path / "s.png", count=9)
    assert sheet.frames == (0, 1, 2, 3, 4) and sheet.grid == "3x2"
    assert (sheet.cell_width, sheet.cell_height) == (64, 64)  # narrower than 160: never upscaled
    with Image.open(sheet.path) as im:
        assert im.size == (3 * 64, 2 * 64)
        got = cells(im, 3, 2)
    for j in range(5):
        assert np.array_equal(got[j], frames[j])
    assert not got[5].any()  # the unused last cell is black
    # the 9-frame clip with the default count: exactly its 9 frames, 3x3, cells 48x32
    sheet = media.write_spritesheet(clips["other"], tmp_path / "o.png")
    assert sheet.frames == tuple(range(9)) and sheet.grid == "3x3"
    assert (sheet.width, sheet.height) == (3 * 48, 3 * 32)
    with pytest.raises(ValueError, match="uint8"):
        media.write_spritesheet(frames.astype(np.float32), tmp_path / "f.png")


def test_read_frames_at_seeks_to_the_same_frames_as_a_full_decode(clips, tmp_path):
    copy = media.merge_mp4([clips["tone"], clips["silent"]], tmp_path / "copy.mp4")
    reencoded = media.merge_mp4([clips["tone"], clips["other"]], tmp_path / "re.mp4")
    assert (copy.video_mode, reencoded.video_mode) == ("copy", "reencode")
    for result in (copy, reencoded):
        full = media.read_frames(result.info.path)
        picked = [0, 3, full.shape[0] // 2, full.shape[0] - 1, 3]  # any order, repeats allowed
        assert np.array_equal(media.read_frames_at(result.info.path, picked), full[picked])
    with pytest.raises(ValueError, match="out of range"):
        media.read_frames_at(clips["tone"], [N_FRAMES])


# -- merge inputs not written by write_mp4 ---------------------------------------------------------


def pyav_clip(
    path: Path,
    frames: np.ndarray,
    fps: int = FPS,
    *,
    pix_fmt: str = "yuv420p",
    audio: np.ndarray | None = None,
    rate: int = 48000,
    layout: str = "stereo",
    audio_start: int = 0,
    video_start: int = 0,
    rotation: int = 0,
    fmt: str | None = None,
) -> Path:
    """Encode with PyAV's defaults (as another tool would): timestamps, sizes and layouts we choose."""
    with av.open(str(path), "w", format=fmt) as c:
        v = c.add_stream("libx264", rate=fps)
        v.width, v.height, v.pix_fmt = frames.shape[2], frames.shape[1], pix_fmt
        if rotation:
            v.set_display_rotation(rotation)
        a = None
        if audio is not None:
            a = c.add_stream("aac", rate=rate)
            a.layout = layout
        for i, rgb in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(rgb, format="rgb24")
            frame.pts, frame.time_base = i + video_start, Fraction(1, fps)
            for packet in v.encode(frame):
                c.mux(packet)
        for packet in v.encode(None):
            c.mux(packet)
        if a is not None and audio is not None:
            for pos in range(0, audio.shape[1], 1024):
                chunk = np.ascontiguousarray(audio[:, pos : pos + 1024])
                frame = av.AudioFrame.from_ndarray(chunk, format="fltp", layout=layout)
                frame.sample_rate, frame.pts, frame.time_base = rate, pos + audio_start, Fraction(1, rate)
                for packet in a.encode(frame):
                    c.mux(packet)
            for packet in a.encode(None):
                c.mux(packet)
    return path


def rms(audio: np.ndarray) -> list[float]:
    return [float(np.sqrt((channel**2).mean())) for channel in audio]


def test_merge_copies_only_inputs_with_the_same_reorder_delay(tmp_path):
    # write_mp4 starts dts 2 frames before pts from 3 frames up (B-frames), at pts for 1-2 frames
    clip = {
        n: media.write_mp4(tmp_path / f"f{n}.mp4", gradient(n, 32, 32), FPS, None, None).path
        for n in (1, 2, 16)
    }
    for counts in ([2, 16], [1, 1, 16], [16, 1], [16, 16]):
        result = media.merge_mp4([clip[n] for n in counts], tmp_path / "m.mp4")
        assert result.video_mode == ("copy" if counts == [16, 16] else "reencode")
        assert result.frames == sum(counts) and result.duration_s == pytest.approx(sum(counts) / FPS)
        assert media.read_frames(tmp_path / "m.mp4").shape[0] == sum(counts)


def test_merge_takes_an_odd_sized_first_shot(tmp_path):
    odd = pyav_clip(tmp_path / "odd.mp4", gradient(8, 33, 65), pix_fmt="yuv444p")
    result = media.merge_mp4([odd, odd], tmp_path / "m.mp4")
    assert (result.info.width, result.info.height, result.frames) == (64, 32, 16)  # even, same aspect
    assert np.abs(media.read_frames(tmp_path / "m.mp4")[0].astype(int) - gradient(1, 32, 64)[0]).mean() < 20


def test_merge_downmixes_surround_audio_by_its_layout(tmp_path):
    surround = sine(0.5, rate=48000, channels=6)
    surround[1:] = 0  # the tone in front-left only
    six = pyav_clip(tmp_path / "six.mp4", gradient(8, 32, 32), audio=surround, layout="5.1")
    result = media.merge_mp4([six], tmp_path / "m.mp4")
    assert result.info.audio_channels == 2
    audio, _ = media.read_audio(tmp_path / "m.mp4")
    left, right = rms(audio[:, 2000:-2000])
    assert left > 0.1 and right < 0.01  # front-left goes left


def test_merge_keeps_a_mono_shots_level(tmp_path):
    mono = media.write_mp4(tmp_path / "mono.mp4", gradient(16, 32, 32), FPS, sine(1.0, channels=1), SR)
    result = media.merge_mp4([mono.path], tmp_path / "m.mp4")
    assert result.info.audio_channels == 2
    source, _ = media.read_audio(mono.path)
    film, _ = media.read_audio(tmp_path / "m.mp4")
    level = rms(source[:, 2000:-2000])[0]
    assert rms(film[:, 2000:-2000]) == pytest.approx([level, level], rel=0.05)  # not 3 dB down


def test_merge_fits_another_aspect_inside_with_black_bars(tmp_path):
    land = media.write_mp4(tmp_path / "land.mp4", gradient(4, 32, 64), FPS, None, None).path
    white = np.full((4, 64, 32, 3), 255, np.uint8)
    port = media.write_mp4(tmp_path / "port.mp4", white, FPS, None, None).path
    result = media.merge_mp4([land, port], tmp_path / "m.mp4")
    assert (result.video_mode, result.info.width, result.info.height) == ("reencode", 64, 32)
    shown = media.read_frames(tmp_path / "m.mp4")[6, ..., 0].astype(int)
    columns = np.nonzero(shown.mean(axis=0) > 128)[0]
    # 32x64 scaled to 16x32 (aspect kept), centered: black pillars of 24 px each side
    assert abs(columns.min() - 24) <= 1 and abs(columns.max() - 39) <= 1
    assert shown[:, 28:36].min() > 200 and shown[:, :20].max() < 40 and shown[:, 44:].max() < 40


def onset(audio: np.ndarray, rate: int) -> float:
    return float(np.nonzero(np.abs(audio[0]) > 0.3)[0][0]) / rate


def test_merge_keeps_each_shots_audio_in_sync_with_its_own_video(tmp_path):
    first = media.write_mp4(tmp_path / "first.mp4", gradient(16, 32, 32), FPS, None, None).path  # 1 s
    rate = 48000

    def click(at_s: float, seconds: float) -> np.ndarray:
        audio = np.zeros((2, round(seconds * rate)), np.float32)
        audio[:, round(at_s * rate) : round(at_s * rate) + 240] = 0.8
        return audio

    frames = gradient(16, 32, 32)
    # audio starting 0.25 s after the video, click 0.1 s into it: 0.35 s into the shot
    late_audio = pyav_clip(tmp_path / "la.mp4", frames, audio=click(0.1, 0.75), audio_start=rate // 4)
    # video starting 0.25 s after the audio, click 0.35 s into the audio: 0.1 s into the shot
    late_video = pyav_clip(tmp_path / "lv.mp4", frames, audio=click(0.35, 1.25), video_start=FPS // 4)
    for shot, at in ((late_audio, 1.35), (late_video, 1.1)):
        media.merge_mp4([first, shot], tmp_path / "m.mp4")
        audio, got_rate = media.read_audio(tmp_path / "m.mp4")
        # MP4 keeps the audio's edit in milliseconds, and AAC smears the click by a few ms
        assert onset(audio, got_rate) == pytest.approx(at, abs=0.03)


def test_a_track_starting_hours_after_its_video_costs_no_more_memory_than_its_segment(tmp_path):
    """The buffer a shot's audio is placed in is the segment's length, whatever its timestamps
    say: an hour's offset (1.4 GB of float32 at 48 kHz stereo) stays a second's buffer."""
    import tracemalloc

    rate = 48000
    audio = np.full((2, rate // 2), 0.5, np.float32)
    late = pyav_clip(tmp_path / "late.mp4", gradient(16, 32, 32), audio=audio, audio_start=rate * 3600)
    first = media.write_mp4(tmp_path / "first.mp4", gradient(16, 32, 32), FPS, None, None).path
    tracemalloc.start()
    try:
        media.merge_mp4([first, late], tmp_path / "m.mp4")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, peak
    film, film_rate = media.read_audio(tmp_path / "m.mp4")
    assert film.shape[1] == 2 * film_rate  # two 1 s shots
    assert np.abs(film[:, film_rate:]).max() < 0.05  # the late track's sound lies past the shot: silence


def test_merge_shows_what_an_edit_list_keeps_of_a_trimmed_clip(tmp_path):
    """A clip cut as `ffmpeg -ss ... -c copy` cuts one: packets before the edit list's start are
    demuxed but discarded by the decoder. The film shows the 10 kept frames (not 12, nor a refusal
    that "only 10 of 12 decode"), the first of them first."""
    trimmed = tmp_path / "trimmed.mp4"
    with av.open(str(trimmed), "w") as out:
        stream = out.add_stream("libx264", rate=FPS)
        stream.width = stream.height = 32
        stream.pix_fmt, stream.time_base = "yuv420p", Fraction(1, FPS)
        for i in range(12):  # pts -2..9: the muxer writes an edit list starting at 0
            frame = av.VideoFrame.from_ndarray(np.full((32, 32, 3), i * 20, np.uint8), format="rgb24")
            frame.pts, frame.time_base = i - 2, Fraction(1, FPS)
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    result = media.merge_mp4([trimmed], tmp_path / "m.mp4")
    assert result.frames == 10 and media.probe(tmp_path / "m.mp4").frames == 10
    first = media.read_frames(tmp_path / "m.mp4")[0]
    assert abs(float(first.mean()) - 40) < 6  # frame 2 (pts 0), not frame 0


def test_merge_refuses_an_input_without_decodable_video_naming_it(clips, tmp_path):
    raw = pyav_clip(tmp_path / "raw.h264", gradient(8, 32, 32), fmt="h264")  # packets without pts
    noise = np.random.default_rng(0).integers(0, 255, (48, 32, 32, 3)).astype(np.uint8)
    whole = media.write_mp4(tmp_path / "whole.mp4", noise, FPS, None, None).path
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])  # index first: frames stop early
    still = tmp_path / "still.png"
    Image.fromarray(gradient(1)[0]).save(still)
    for bad in (raw, cut, still):
        with pytest.raises(ValueError, match=rf"merge input 1 \({bad.name}\)"):
            media.merge_mp4([clips["tone"], bad, clips["tone"]], tmp_path / "m.mp4")
        assert not (tmp_path / "m.mp4").exists()


def test_merge_shows_rotated_shots_upright_and_copies_no_rotation(tmp_path):
    frames = np.zeros((4, 32, 48, 3), np.uint8)
    frames[:, :8, :8] = 255  # a white block top-left, as stored
    rotated = pyav_clip(tmp_path / "rot.mp4", frames, rotation=-90)  # shown turned 90 degrees clockwise
    plain = pyav_clip(tmp_path / "plain.mp4", frames)
    result = media.merge_mp4([rotated, plain], tmp_path / "m.mp4")
    assert (result.video_mode, result.info.width, result.info.height) == ("reencode", 32, 48)
    film = media.read_frames(tmp_path / "m.mp4")
    with av.open(str(tmp_path / "m.mp4")) as c:
        assert {frame.rotation for frame in c.decode(video=0)} == {0}
    upright = film[0, ..., 0]
    assert upright[:8, 24:].min() > 200 and upright[:8, :20].max() < 40  # the block is now top-right
    # the plain 48x32 shot: letterboxed into 32x48 (32x22 in the middle), its block top-left
    letterbox = film[5, ..., 0]
    assert letterbox[:12].max() < 40 and letterbox[12:17, :4].min() > 200
    # the other way round: the film is the plain shot's size and shows the rotated one upright
    result = media.merge_mp4([plain, rotated], tmp_path / "m.mp4")
    assert (result.info.width, result.info.height) == (48, 32)
    with av.open(str(tmp_path / "m.mp4")) as c:
        assert {frame.rotation for frame in c.decode(video=0)} == {0}


def test_merge_fails_naming_an_input_whose_counted_frames_do_not_decode(tmp_path):
    noise = np.random.default_rng(1).integers(0, 255, (16, 32, 32, 3)).astype(np.uint8)
    good = media.write_mp4(tmp_path / "good.mp4", noise, FPS, None, None).path
    broken = media.write_mp4(tmp_path / "broken.mp4", noise, FPS, None, None).path
    with av.open(str(broken)) as c:
        spans = [(packet.pos, packet.size) for packet in c.demux(video=0) if packet.size]
    data = bytearray(broken.read_bytes())
    for pos, size in spans[8:]:  # the index still lists 16 frames; the last 8 are zeros
        data[pos : pos + size] = bytes(size)
    broken.write_bytes(bytes(data))
    other = media.write_mp4(tmp_path / "other.mp4", gradient(4, 32, 48), FPS, None, None).path
    for inputs in ([good, broken], [other, broken]):  # stream copy, re-encode
        with pytest.raises(ValueError, match=r"merge input 1 \(broken.mp4\)"):
            media.merge_mp4(inputs, tmp_path / "m.mp4")
        assert not (tmp_path / "m.mp4").exists()
