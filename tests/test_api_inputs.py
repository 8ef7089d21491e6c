"""The input boundary: data URLs, local paths under allowed roots, http fetches, media validation."""

from __future__ import annotations

import base64
import functools
import io
import threading
import urllib.parse
import wave
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import api.core.inputs as api_inputs
from api.core.inputs import MEDIA_SIZE, InputError, copy_into_assets, resolve_resource
from api.store import Store
from settings.api import ApiConfig, InputPolicy
from shotloom.media import write_mp4


def _png_bytes(w: int = 16, h: int = 20) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((h, w, 3), 120, np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def _image_bytes(mode: str, w: int, h: int, fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    Image.new(mode, (w, h)).save(buf, format=fmt)
    return buf.getvalue()


def _data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


@pytest.fixture
def assets(tmp_path) -> Path:
    return tmp_path / "assets"


@pytest.fixture
def served(tmp_path):
    """A local http.server over tmp_path/www on 127.0.0.1 (a private address)."""
    www = tmp_path / "www"
    www.mkdir()
    handler = functools.partial(_QuietHandler, directory=str(www))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield www, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


class _QuietHandler(SimpleHTTPRequestHandler):
    def do_GET(self):
        if self.path.startswith("/redirect?to="):  # an open redirect, as on many real hosts
            self.send_response(302)
            self.send_header("Location", urllib.parse.unquote(self.path.split("=", 1)[1]))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        super().do_GET()

    def log_message(self, *args):  # keep pytest output clean
        pass


def test_data_url_image_is_stored_content_addressed(tmp_path, assets):
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    data = _png_bytes()
    asset = resolve_resource(_data_url(data), "image", InputPolicy(), assets, store, field="condition_img")
    import hashlib

    sha = hashlib.sha256(data).hexdigest()
    assert asset.sha256 == sha and asset.source == "data"
    assert asset.path == assets / sha[:2] / f"{sha}.png" and asset.path.read_bytes() == data
    assert asset.relative_path == f"{sha[:2]}/{sha}.png"
    assert (asset.media_type, asset.width, asset.height, asset.bytes) == ("image/png", 16, 20, len(data))
    assert store.get_input_asset(sha).path == asset.relative_path
    again = resolve_resource(_data_url(data), "image", InputPolicy(), assets, store)
    assert again.path == asset.path
    assert not list((assets / ".tmp").iterdir())  # no staging leftovers
    store.close()


def test_bad_data_urls_name_the_field(assets):
    field = "memory_slots[2].image_url"
    with pytest.raises(InputError) as e:
        resolve_resource(
            "data:image/png;base64,@@@not base64@@@", "image", InputPolicy(), assets, field=field
        )
    assert e.value.field == field and "base64" in e.value.message
    assert str(e.value).startswith(field + ": ")
    with pytest.raises(InputError, match="not a readable image") as e:
        resolve_resource(_data_url(b"hello, not a picture"), "image", InputPolicy(), assets, field=field)
    assert e.value.field == field
    truncated = _png_bytes(64, 64)[:-40]
    with pytest.raises(InputError, match="not a readable image") as e:
        resolve_resource(_data_url(truncated), "image", InputPolicy(), assets)
    assert str(assets) not in e.value.message and ".part" not in e.value.message  # no server path
    with pytest.raises(InputError, match="no comma"):
        resolve_resource("data:image/png;base64", "image", InputPolicy(), assets)
    for bad in ("relative/path.png", "ftp://host/x.png", "", "C:thing"):
        with pytest.raises(InputError):
            resolve_resource(bad, "image", InputPolicy(), assets)
    assert not list((assets / ".tmp").iterdir())


def test_limits(assets):
    data = _png_bytes(40, 40)
    with pytest.raises(InputError, match="larger than the limit"):
        resolve_resource(_data_url(data), "image", InputPolicy(max_bytes=len(data) - 1), assets)
    with pytest.raises(InputError, match="more than the limit of 1599 pixels"):
        resolve_resource(_data_url(data), "image", InputPolicy(max_pixels=1599), assets)
    assert resolve_resource(_data_url(data), "image", InputPolicy(max_pixels=1600), assets).width == 40


def test_an_image_that_cannot_make_a_frame_is_refused_naming_the_field(assets):
    # Measured in the engine: Wan VACE floors a reference image to its VAE's 8 px grid (a side
    # under 8 is 0, and PIL fails: "height and width must be > 0"), LTX-2 fails on 1x1.
    field = "memory_slots[0].image_url"
    for w, h in ((1, 1), (2, 64), (64, 2), (15, 64)):
        with pytest.raises(InputError) as e:
            resolve_resource(_data_url(_image_bytes("L", w, h)), "image", InputPolicy(), assets, field=field)
        assert (e.value.field, e.value.code) == (field, MEDIA_SIZE)
        assert e.value.message == (
            f"image is {w}x{h} pixels, too small to make a frame of: each side must be at least 16 pixels"
        )
    # Fitted inside a frame, a reference much longer than wide keeps less than a pixel of width.
    with pytest.raises(InputError, match="too narrow .* at most 32 times its shorter one") as e:
        resolve_resource(_data_url(_image_bytes("RGB", 16, 513)), "image", InputPolicy(), assets, field=field)
    assert (e.value.field, e.value.code) == (field, MEDIA_SIZE)
    assert (
        resolve_resource(_data_url(_image_bytes("RGB", 16, 512)), "image", InputPolicy(), assets).height
        == 512
    )
    assert (
        resolve_resource(_data_url(_image_bytes("RGB", 16, 16)), "image", InputPolicy(), assets).width == 16
    )
    # Both limits are the server's: api.inputs.min_side and max_aspect_ratio.
    loose = InputPolicy(min_side=1, max_aspect_ratio=64)
    assert resolve_resource(_data_url(_image_bytes("L", 1, 1)), "image", loose, assets).width == 1
    assert resolve_resource(_data_url(_image_bytes("RGB", 16, 1024)), "image", loose, assets).height == 1024
    assert not list((assets / ".tmp").iterdir())


def test_grayscale_palette_and_alpha_images_big_enough_are_accepted(assets):
    for mode, fmt in (
        ("L", "PNG"), ("1", "PNG"), ("P", "PNG"), ("RGBA", "PNG"), ("LA", "PNG"), ("I;16", "PNG"),
        ("CMYK", "JPEG"), ("L", "JPEG"), ("RGBA", "WEBP"), ("P", "GIF"),
    ):  # fmt: skip
        asset = resolve_resource(_data_url(_image_bytes(mode, 24, 16, fmt)), "image", InputPolicy(), assets)
        assert (asset.width, asset.height) == (24, 16), (mode, fmt)
        with Image.open(asset.path) as im:
            assert im.convert("RGB").size == (24, 16)  # what every family does with it


def test_the_limits_are_server_config():
    assert (InputPolicy().min_side, InputPolicy().max_aspect_ratio) == (16, 32.0)
    inputs = ApiConfig.model_validate({"inputs": {"min_side": 64, "max_aspect_ratio": 4}}).inputs
    assert (inputs.min_side, inputs.max_aspect_ratio) == (64, 4.0)
    for bad in ({"min_side": 0}, {"max_aspect_ratio": 0.5}):
        with pytest.raises(ValueError):
            ApiConfig.model_validate({"inputs": bad})


def test_local_paths_only_under_allowed_roots(tmp_path, assets, image_file):
    allowed = tmp_path  # image_file lies in tmp_path
    outside_dir = tmp_path.parent / f"{tmp_path.name}-outside"
    outside_dir.mkdir()
    outside = outside_dir / "secret.png"
    outside.write_bytes(_png_bytes())

    with pytest.raises(InputError, match="no allowed_roots"):
        resolve_resource(str(image_file), "image", InputPolicy(), assets)
    policy = InputPolicy(allowed_roots=[allowed])
    a = resolve_resource(str(image_file), "image", policy, assets)
    assert a.source == "file" and a.width == 64 and a.path.parent.parent == assets
    b = resolve_resource(image_file.as_uri(), "image", policy, assets)
    assert b.sha256 == a.sha256

    for refused in (
        str(outside),
        outside.as_uri(),
        f"{allowed}/../{outside_dir.name}/secret.png",  # .. out of the root
        str(allowed / "missing.png"),
        f"file://otherhost{image_file}",
    ):
        with pytest.raises(InputError):
            resolve_resource(refused, "image", policy, assets, field="condition_img")

    link = allowed / "escape.png"
    link.symlink_to(outside)
    with pytest.raises(InputError, match="not under an allowed root"):
        resolve_resource(str(link), "image", policy, assets)
    inner = allowed / "inner-link.png"
    inner.symlink_to(image_file)  # a symlink that stays inside is fine
    assert resolve_resource(str(inner), "image", policy, assets).sha256 == a.sha256
    with pytest.raises(InputError, match="not a regular file"):
        resolve_resource(str(allowed), "image", policy, assets)


def test_http_fetch_private_address_policy(served, assets):
    www, base = served
    (www / "ref.png").write_bytes(_png_bytes())
    url = f"{base}/ref.png"
    with pytest.raises(InputError, match="private or local address") as e:
        resolve_resource(url, "image", InputPolicy(), assets, field="memory_slots[0].image_url")
    assert e.value.field == "memory_slots[0].image_url"
    with pytest.raises(InputError, match="private or local address"):
        resolve_resource(f"http://localhost:{base.rsplit(':', 1)[1]}/ref.png", "image", InputPolicy(), assets)

    policy = InputPolicy(allow_private_addresses=True)
    a = resolve_resource(url, "image", policy, assets)
    assert a.source == "http" and a.path.read_bytes() == (www / "ref.png").read_bytes()

    with pytest.raises(InputError, match="HTTP 404"):
        resolve_resource(f"{base}/missing.png", "image", policy, assets)
    noisy = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    Image.fromarray(noisy).save(www / "big.png")
    assert (www / "big.png").stat().st_size > 10_000
    small = InputPolicy(allow_private_addresses=True, max_bytes=10_000)
    with pytest.raises(InputError, match="larger than the limit of 10000 bytes"):
        resolve_resource(f"{base}/big.png", "image", small, assets)
    with pytest.raises(InputError, match="disabled"):
        resolve_resource(url, "image", InputPolicy(fetch_urls=False, allow_private_addresses=True), assets)


def test_http_redirects_are_followed_and_rechecked(served, assets, monkeypatch):
    www, base = served
    (www / "ref.png").write_bytes(_png_bytes())
    policy = InputPolicy(allow_private_addresses=True)
    target = urllib.parse.quote(f"{base}/ref.png", safe="")
    assert resolve_resource(f"{base}/redirect?to={target}", "image", policy, assets).width == 16

    # Pretend the test server's address is public: the redirect to a private address is still refused.
    real_is_public = api_inputs._is_public
    monkeypatch.setattr(api_inputs, "_is_public", lambda ip: str(ip) == "127.0.0.1" or real_is_public(ip))
    assert resolve_resource(f"{base}/ref.png", "image", InputPolicy(), assets).width == 16
    private = urllib.parse.quote("http://10.1.2.3/ref.png", safe="")
    with pytest.raises(InputError, match="private or local address"):
        resolve_resource(f"{base}/redirect?to={private}", "image", InputPolicy(), assets)
    loop = urllib.parse.quote(
        f"{base}/redirect?to=" + urllib.parse.quote(f"{base}/ref.png", safe=""), safe=""
    )
    assert resolve_resource(f"{base}/redirect?to={loop}", "image", InputPolicy(), assets).width == 16


def _wav(path: Path, seconds: float = 0.25, rate: int = 16000) -> Path:
    t = np.arange(int(seconds * rate)) / rate
    pcm = (np.sin(2 * np.pi * 440 * t) * 12000).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())
    return path


def test_audio_and_video_are_probed(tmp_path, assets):
    policy = InputPolicy(allowed_roots=[tmp_path])
    wav = _wav(tmp_path / "voice.wav")
    a = resolve_resource(str(wav), "audio", policy, assets, field="memory_slots[0].audio_url")
    assert (a.media_type, a.path.suffix) == ("audio/wav", ".wav")
    d = resolve_resource(_data_url(wav.read_bytes(), "audio/wav"), "audio", InputPolicy(), assets)
    assert d.sha256 == a.sha256

    frames = np.zeros((4, 32, 32, 3), np.uint8)
    mp4 = tmp_path / "clip.mp4"
    write_mp4(mp4, frames, 8, None, None, preset="ultrafast")
    v = resolve_resource(str(mp4), "video", policy, assets, field="shots[0].video_url")
    assert (v.media_type, v.path.suffix, v.width, v.height) == ("video/mp4", ".mp4", 32, 32)
    au = resolve_resource(str(mp4), "audio", policy, assets)  # its AAC track counts as audio
    assert au.media_type == "audio/mp4"

    silent = tmp_path / "silent.mp4"
    write_mp4(silent, frames, 8, None, None, silent_track=False, preset="ultrafast")
    with pytest.raises(InputError, match="has no audio stream") as e:
        resolve_resource(str(silent), "audio", policy, assets, field="memory_slots[1].audio_url")
    assert e.value.field == "memory_slots[1].audio_url"
    with pytest.raises(InputError, match="has no video stream"):
        resolve_resource(str(wav), "video", policy, assets)
    with pytest.raises(InputError, match="not a readable audio") as e:
        resolve_resource(_data_url(b"\x00garbage" * 50, "audio/wav"), "audio", InputPolicy(), assets)
    assert str(assets) not in e.value.message and ".part" not in e.value.message  # no server path


def test_a_video_that_cannot_make_a_frame_is_refused_naming_the_field(tmp_path, assets):
    policy = InputPolicy(allowed_roots=[tmp_path])
    narrow = tmp_path / "narrow.mp4"
    write_mp4(narrow, np.zeros((3, 64, 2, 3), np.uint8), 8, None, None, preset="ultrafast")
    with pytest.raises(InputError) as e:
        resolve_resource(str(narrow), "video", policy, assets, field="video_url")
    assert (e.value.field, e.value.code) == ("video_url", MEDIA_SIZE)
    assert e.value.message.startswith("video is 2x64 pixels, too small to make a frame of")
    assert resolve_resource(str(narrow), "audio", policy, assets).role == "audio"  # its sound is fine
    ok = tmp_path / "ok.mp4"
    write_mp4(ok, np.zeros((3, 16, 16, 3), np.uint8), 8, None, None, preset="ultrafast")
    assert resolve_resource(str(ok), "video", policy, assets).width == 16


def test_copy_into_assets_trusts_server_files(tmp_path, assets, image_file):
    a = copy_into_assets(image_file, "image", InputPolicy(), assets)
    assert a.path.is_file() and a.width == 64


# -- review fixes: formats, addresses, the fetch's deadline, a video's length and rate -------------


def test_only_the_image_formats_the_service_takes_are_opened(assets, monkeypatch):
    """Data labelled image/png that is really EPS (or any other Pillow format) is refused naming the
    field, the same way as an unreadable image, and never reaches a helper such as Ghostscript."""
    from PIL import EpsImagePlugin

    ghostscript_calls = []

    def fake_ghostscript(*args, **kwargs):
        ghostscript_calls.append(args)
        raise OSError("Ghostscript must not run")

    monkeypatch.setattr(EpsImagePlugin, "Ghostscript", fake_ghostscript)
    eps = (
        b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 32 32\n%%EndComments\n"
        b"newpath 0 0 moveto 32 32 lineto stroke\nshowpage\n%%EOF\n"
    )
    field = "memory_slots[0].image_url"
    with pytest.raises(InputError, match="not a readable image") as e:
        resolve_resource(_data_url(eps), "image", InputPolicy(), assets, field=field)
    assert e.value.field == field and "PNG, JPEG, WEBP, GIF, BMP or TIFF" in e.value.message
    assert ghostscript_calls == []
    for fmt in ("PPM", "ICO", "PCX", "TGA"):  # readable by Pillow, not formats the service takes
        with pytest.raises(InputError, match="not a readable image") as e:
            resolve_resource(
                _data_url(_image_bytes("RGB", 32, 32, fmt)), "image", InputPolicy(), assets, field=field
            )
        assert e.value.field == field, fmt
    for fmt in ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF"):
        asset = resolve_resource(_data_url(_image_bytes("RGB", 32, 32, fmt)), "image", InputPolicy(), assets)
        assert asset.width == 32 and asset.path.suffix == "." + api_inputs._IMAGE_EXT[fmt], fmt
    assert not list((assets / ".tmp").iterdir())


def test_only_globally_routable_addresses_are_public(assets):
    import ipaddress

    for refused in (
        "100.64.0.1",  # carrier-grade NAT, Tailscale
        "100.100.100.200",  # Alibaba Cloud's metadata service
        "100.127.255.254",
        "::ffff:100.100.100.200",  # IPv4-mapped
        "64:ff9b::6464:64c8",  # NAT64 of 100.100.100.200
        "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
        "::7f00:1",  # IPv4-compatible 127.0.0.1
        "2002:6464:64c8::1",  # 6to4 of 100.100.100.200
        "10.0.0.1", "127.0.0.1", "169.254.169.254", "0.0.0.0", "198.18.0.1", "fd00::1", "fe80::1",
        "fec0::1", "::1", "::", "224.0.0.1", "ff02::1",
    ):  # fmt: skip
        assert not api_inputs._is_public(ipaddress.ip_address(refused)), refused
    for public in ("8.8.8.8", "1.1.1.1", "100.63.255.255", "100.128.0.1", "2606:4700:4700::1111"):
        assert api_inputs._is_public(ipaddress.ip_address(public)), public
    # Refused before any connection is made, naming the field.
    with pytest.raises(InputError, match="private or local address") as e:
        resolve_resource(
            "http://100.100.100.200/latest/meta-data/x.png",
            "image",
            InputPolicy(),
            assets,
            field="condition_img",
        )
    assert e.value.field == "condition_img"


class _Trickler:
    """A real HTTP server on 127.0.0.1 that sends its answer one byte every ``gap`` seconds: in the
    status line and headers (``headers``) or, after complete headers, in the body (``body``)."""

    def __init__(self, mode: str, gap: float = 0.1, total_s: float = 15.0):
        import socket

        self.mode, self.gap, self.total_s = mode, gap, total_s
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.port = self.sock.getsockname()[1]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        import time

        try:
            conn, _ = self.sock.accept()
        except OSError:
            return
        with conn:
            conn.recv(65536)
            if self.mode == "body":
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nContent-Length: 100000\r\n\r\n")
                data = b"\x89PNG" + b"x" * 99996
            else:
                data = b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * 100000
            end = time.monotonic() + self.total_s
            for byte in data:
                if self.stop.is_set() or time.monotonic() > end:
                    return
                try:
                    conn.send(bytes([byte]))
                except OSError:  # the client hung up: done
                    return
                time.sleep(self.gap)

    def close(self):
        self.stop.set()
        self.sock.close()
        self.thread.join(timeout=2)


@pytest.mark.parametrize("mode", ["headers", "body"])
def test_a_trickling_server_cannot_hold_a_fetch_past_its_deadline(assets, mode):
    import time

    server = _Trickler(mode)
    try:
        policy = InputPolicy(fetch_timeout_seconds=1.0, allow_private_addresses=True)
        start = time.monotonic()
        with pytest.raises(InputError) as e:
            resolve_resource(
                f"http://127.0.0.1:{server.port}/a.png", "image", policy, assets, field="condition_img"
            )
        elapsed = time.monotonic() - start
    finally:
        server.close()
    assert e.value.field == "condition_img"
    assert "fetch took longer than 1 s" in e.value.message, e.value.message
    assert elapsed < 2.0, f"{mode}: the fetch took {elapsed:.1f} s with a 1 s deadline"
    assert not list((assets / ".tmp").iterdir())


def test_a_slow_host_lookup_counts_against_the_fetch_deadline(assets, monkeypatch):
    import socket
    import time

    real = socket.getaddrinfo

    def slow(host, *args, **kwargs):
        if host == "slow.example":
            time.sleep(3)
        return real("127.0.0.1", *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", slow)
    policy = InputPolicy(fetch_timeout_seconds=0.5, allow_private_addresses=True)
    start = time.monotonic()
    with pytest.raises(InputError, match="fetch took longer than 0.5 s") as e:
        resolve_resource("http://slow.example/a.png", "image", policy, assets, field="condition_img")
    assert e.value.field == "condition_img" and time.monotonic() - start < 1.5


def _sparse_mp4(path: Path, n: int, gap_s: float, size: int = 32) -> Path:
    """``n`` H.264 frames ``gap_s`` seconds apart: a tiny file that claims a long, sparse video."""
    from fractions import Fraction

    import av

    with av.open(str(path), "w", format="mp4") as out:
        stream = out.add_stream("libx264", rate=16)
        stream.width, stream.height, stream.pix_fmt = size, size, "yuv420p"
        stream.codec_context.time_base = Fraction(1, 1000)
        for i in range(n):
            frame = av.VideoFrame.from_ndarray(np.full((size, size, 3), i * 20, np.uint8), format="rgb24")
            frame.pts, frame.time_base = int(i * gap_s * 1000), Fraction(1, 1000)
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return path


def test_a_video_too_long_or_too_sparse_is_refused_naming_the_field(tmp_path, assets):
    policy = InputPolicy(allowed_roots=[tmp_path])
    hours = _sparse_mp4(tmp_path / "hours.mp4", 10, 3600)  # the review's 1.8 KB "merge bomb"
    assert hours.stat().st_size < 4000
    with pytest.raises(InputError) as e:
        resolve_resource(str(hours), "video", policy, assets, field="shots[1].video_url")
    assert e.value.field == "shots[1].video_url"
    assert "longer than the limit of 600 s" in e.value.message, e.value.message
    sparse = _sparse_mp4(tmp_path / "sparse.mp4", 10, 30)  # 4.5 minutes: under the limit, 10 frames
    with pytest.raises(InputError) as e:
        resolve_resource(str(sparse), "video", policy, assets, field="source_video")
    assert e.value.field == "source_video"
    assert "at least 1 frame per second on average" in e.value.message, e.value.message
    dense = _sparse_mp4(tmp_path / "dense.mp4", 10, 0.5)  # 2 frames a second: fine
    assert resolve_resource(str(dense), "video", policy, assets).width == 32
    ok = tmp_path / "ok.mp4"
    write_mp4(ok, np.zeros((17, 16, 16, 3), np.uint8), 8, None, None, preset="ultrafast")  # 2.1 s
    assert resolve_resource(str(ok), "video", policy, assets).width == 16
    short = InputPolicy(allowed_roots=[tmp_path], max_video_seconds=2)
    with pytest.raises(InputError, match="longer than the limit of 2 s"):
        resolve_resource(str(ok), "video", short, assets, field="video_url")
    assert not list((assets / ".tmp").iterdir())


def test_audio_longer_than_the_limit_is_refused_naming_the_field(tmp_path, assets):
    policy = InputPolicy(allowed_roots=[tmp_path], max_audio_seconds=2)
    wav = _wav(tmp_path / "long.wav", seconds=3)
    with pytest.raises(InputError, match="longer than the limit of 2 s") as e:
        resolve_resource(str(wav), "audio", policy, assets, field="memory_slots[0].audio_url")
    assert e.value.field == "memory_slots[0].audio_url"
    assert resolve_resource(str(wav), "audio", InputPolicy(allowed_roots=[tmp_path]), assets).role == "audio"
    assert resolve_resource(str(_wav(tmp_path / "short.wav", 1.5)), "audio", policy, assets).role == "audio"


def test_the_length_limits_are_server_config():
    assert (InputPolicy().max_video_seconds, InputPolicy().max_audio_seconds) == (600.0, 600.0)
    inputs = ApiConfig.model_validate({"inputs": {"max_video_seconds": 30, "max_audio_seconds": 20}}).inputs
    assert (inputs.max_video_seconds, inputs.max_audio_seconds) == (30.0, 20.0)
    for bad in ({"max_video_seconds": 0}, {"max_audio_seconds": -1}):
        with pytest.raises(ValueError):
            ApiConfig.model_validate({"inputs": bad})
