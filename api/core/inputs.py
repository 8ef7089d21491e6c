"""The input boundary: turn a client's resource reference into a validated, stored local asset.

Accepted (r2v spec "Input boundary", limited by :class:`settings.api.InputPolicy`):

- ``data:`` URLs (base64 or percent-encoded);
- ``http(s)://`` URLs, fetched with httpx (streamed, size-limited) when ``fetch_urls`` is on; the
  whole fetch (host lookups, connects, TLS, headers and body of every hop) ends by one deadline,
  ``fetch_timeout_seconds``, however slowly the peer answers. Hosts that resolve to any address that is
  not globally routable (private, loopback, link-local, carrier-grade NAT 100.64.0.0/10, reserved;
  IPv4-mapped, 6to4 and NAT64 addresses judged by the IPv4 address inside) are refused unless
  ``allow_private_addresses``. The connection goes to the checked address (Host header and TLS SNI keep
  the name), so a second DNS answer cannot swap in another host; redirects are followed by hand and
  each hop is checked again;
- ``file://`` URLs and absolute paths, only when the path (symlinks resolved) lies under
  ``allowed_roots``.

Every accepted resource is copied to ``assets_dir/<sha[:2]>/<sha>.<ext>`` (content-addressed) before
the job is queued, so a job never depends on a URL or a caller's file staying the same. Images are
opened only as the formats the service takes (PNG, JPEG, WEBP, GIF, BMP, TIFF: never EPS or another
format that hands the bytes to a helper program) and fully decoded with PIL (pixel limit checked before
decoding); audio and video are probed with PyAV: their packets' timestamps measured (no decoding), a
file longer than ``max_video_seconds`` / ``max_audio_seconds`` refused, and a video whose frames come
less than 1 a second on average (a few frames hours apart, which a merge would fill in) refused, then
the first frame decoded. An image or video whose size cannot make a frame (a side under
``min_side`` pixels, sides further apart than ``max_aspect_ratio``) is refused here, on every route,
before anything is queued. Every refusal is an :class:`InputError` naming the request field.

Sync code (routes call it in a threadpool). No torch.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import os
import socket
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal

from settings.api import InputPolicy
from shotloom.media import Span, file_sha256

if TYPE_CHECKING:
    from api.store import Store

Role = Literal["image", "audio", "video"]
Source = Literal["data", "http", "file"]

__all__ = ["MEDIA_SIZE", "InputAsset", "InputError", "Role", "copy_into_assets", "resolve_resource"]

# InputError.code of a readable image or video whose size cannot make a frame.
MEDIA_SIZE = "invalid_media_size"
_MAX_REDIRECTS = 5
_CHUNK = 1 << 16

# PIL format -> file extension: the only formats an image input is opened as (Image.open(formats=)).
_IMAGE_EXT = {"PNG": "png", "JPEG": "jpg", "WEBP": "webp", "GIF": "gif", "BMP": "bmp", "TIFF": "tiff"}
_IMAGE_FORMATS = ", ".join(list(_IMAGE_EXT)[:-1]) + " or " + list(_IMAGE_EXT)[-1]
# A video's frames must come at least this often on average (frames per second over its length).
_MIN_VIDEO_FPS = 1
# FFmpeg demuxer name (first of the comma list) -> extension and media type, per role.
_AUDIO_FORMATS = {
    "wav": ("wav", "audio/wav"),
    "mp3": ("mp3", "audio/mpeg"),
    "flac": ("flac", "audio/flac"),
    "ogg": ("ogg", "audio/ogg"),
    "aac": ("aac", "audio/aac"),
    "mov": ("m4a", "audio/mp4"),
    "matroska": ("mka", "audio/x-matroska"),
}
_VIDEO_FORMATS = {
    "mov": ("mp4", "video/mp4"),
    "matroska": ("mkv", "video/x-matroska"),
    "avi": ("avi", "video/x-msvideo"),
}


class InputError(ValueError):
    """A refused or invalid resource; the route answers 422 (r2v) or 400 (/v1) naming ``field``.
    ``code``: why, where a client may want to tell (:data:`MEDIA_SIZE`); None otherwise."""

    def __init__(self, field: str, message: str, code: str | None = None):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
        self.code = code


@dataclass(frozen=True)
class InputAsset:
    sha256: str
    path: Path  # absolute, inside assets_dir
    relative_path: str  # relative to assets_dir (what the store and the job request keep)
    media_type: str
    bytes: int
    role: Role
    source: Source
    width: int | None = None  # images and video
    height: int | None = None


def resolve_resource(
    value: str,
    role: Role,
    policy: InputPolicy,
    assets_dir: Path,
    store: Store | None = None,
    *,
    field: str | None = None,
) -> InputAsset:
    """Fetch/copy/decode ``value``, validate it as ``role`` and store it content-addressed.

    ``field`` names the request field in errors (e.g. ``memory_slots[2].image_url``); default: ``role``.
    """
    field = field or role
    if not isinstance(value, str) or not value.strip():
        raise InputError(field, "must be a non-empty string")
    value = value.strip()
    assets_dir = Path(assets_dir)
    assets_dir.mkdir(parents=True, exist_ok=True)
    scheme = urllib.parse.urlsplit(value).scheme.lower() if ":" in value else ""

    with _staging_file(assets_dir) as (tmp, out):
        if scheme == "data":
            source: Source = "data"
            _write_data_url(value, out, policy, field)
        elif scheme in ("http", "https"):
            source = "http"
            if not policy.fetch_urls:
                raise InputError(field, "fetching http(s) URLs is disabled on this server")
            _fetch(value, out, policy, field)
        elif scheme == "file" or (not scheme and value.startswith("/")):
            source = "file"
            _copy_local(_local_path(value, scheme, field), out, policy, field)
        else:
            raise InputError(field, "must be a data: URL, an http(s) URL, a file:// URL or an absolute path")
        out.close()
        size = tmp.stat().st_size
        if size == 0:
            raise InputError(field, "resource is empty")
        digest = file_sha256(tmp)
        ext, media_type, width, height = _validate(tmp, role, policy, field)
        rel = f"{digest[:2]}/{digest}.{ext}"
        final = assets_dir / rel
        final.parent.mkdir(parents=True, exist_ok=True)
        if final.exists() and final.stat().st_size == size:
            tmp.unlink()
        else:
            os.replace(tmp, final)
    if store is not None:
        store.put_input_asset(digest, rel, media_type, size)
    return InputAsset(
        sha256=digest,
        path=final,
        relative_path=rel,
        media_type=media_type,
        bytes=size,
        role=role,
        source=source,
        width=width,
        height=height,
    )


# -- getting the bytes --------------------------------------------------------------------------


@contextmanager
def _staging_file(assets_dir: Path) -> Iterator[tuple[Path, IO[bytes]]]:
    tmp_dir = assets_dir / ".tmp"
    tmp_dir.mkdir(parents=True, exist_ok=True)
    tmp = tmp_dir / f"{uuid.uuid4().hex}.part"
    out = tmp.open("wb")
    try:
        yield tmp, out
    finally:
        out.close()
        tmp.unlink(missing_ok=True)


class _Limited:
    """Counts bytes written and refuses past ``max_bytes``."""

    def __init__(self, out: IO[bytes], max_bytes: int, field: str):
        self.out, self.max_bytes, self.field, self.n = out, max_bytes, field, 0

    def write(self, chunk: bytes) -> None:
        self.n += len(chunk)
        if self.n > self.max_bytes:
            raise InputError(self.field, f"resource is larger than the limit of {self.max_bytes} bytes")
        self.out.write(chunk)


def _write_data_url(value: str, out: IO[bytes], policy: InputPolicy, field: str) -> None:
    header, sep, payload = value[len("data:") :].partition(",")
    if not sep:
        raise InputError(field, "malformed data: URL (no comma)")
    params = [p.strip().lower() for p in header.split(";")]
    if "base64" in params:
        compact = "".join(payload.split())
        if len(compact) * 3 // 4 > policy.max_bytes + 3:
            raise InputError(field, f"resource is larger than the limit of {policy.max_bytes} bytes")
        try:
            if "-" in compact or "_" in compact:
                data = base64.urlsafe_b64decode(compact + "=" * (-len(compact) % 4))
            else:
                data = base64.b64decode(compact, validate=True)
        except (binascii.Error, ValueError) as e:
            raise InputError(field, f"invalid base64 in data: URL ({e})") from None
    else:
        data = urllib.parse.unquote_to_bytes(payload)
    _Limited(out, policy.max_bytes, field).write(data)


def _local_path(value: str, scheme: str, field: str) -> Path:
    if scheme == "file":
        parts = urllib.parse.urlsplit(value)
        if parts.netloc not in ("", "localhost"):
            raise InputError(field, "file:// URLs must name a local path (no host)")
        raw = urllib.parse.unquote(parts.path)
    else:
        raw = value
    if "\x00" in raw or not raw.startswith("/"):
        raise InputError(field, "local paths must be absolute")
    return Path(raw)


def _copy_local(path: Path, out: IO[bytes], policy: InputPolicy, field: str) -> None:
    roots = [Path(r).resolve() for r in policy.allowed_roots if Path(r).is_absolute()]
    if not roots:
        raise InputError(field, "local paths are not allowed on this server (no allowed_roots configured)")
    try:
        real = path.resolve(strict=True)
    except (OSError, RuntimeError):
        # Say the same thing whether the file is missing or outside: don't probe the filesystem for them.
        raise InputError(field, "local path is not under an allowed root or does not exist") from None
    if not any(real.is_relative_to(root) for root in roots):
        raise InputError(field, "local path is not under an allowed root or does not exist")
    if not real.is_file():
        raise InputError(field, "local path is not a regular file")
    sink = _Limited(out, policy.max_bytes, field)
    try:
        with real.open("rb") as f:
            for chunk in iter(lambda: f.read(_CHUNK), b""):
                sink.write(chunk)
    except OSError as e:
        raise InputError(field, f"cannot read local file ({e.strerror})") from None


_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")  # RFC 6052: the IPv4 address in the low 32 bits
_IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")  # deprecated ::a.b.c.d (and :: and ::1)


def _is_public(addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Globally routable (``is_global``) and none of the special ranges; an IPv6 address that carries
    an IPv4 one (mapped, 6to4, NAT64, IPv4-compatible) is judged by that IPv4 address."""
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped
        elif addr.sixtofour is not None:
            addr = addr.sixtofour
        elif addr in _NAT64 or addr in _IPV4_COMPATIBLE:
            addr = ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    return addr.is_global and not (
        addr.is_private
        or addr.is_loopback
        or addr.is_link_local
        or addr.is_multicast
        or addr.is_reserved
        or addr.is_unspecified
        or getattr(addr, "is_site_local", False)
    )


def _deadline_error(policy: InputPolicy, field: str) -> InputError:
    return InputError(
        field,
        f"fetch took longer than {policy.fetch_timeout_seconds:g} s "
        "(api.inputs.fetch_timeout_seconds bounds the whole fetch: lookup, connect, headers and body)",
    )


def _getaddrinfo(host: str, port: int, deadline: float, policy: InputPolicy, field: str) -> list[Any]:
    """``socket.getaddrinfo`` that gives up at ``deadline`` (the lookup cannot be interrupted: it runs
    in a daemon thread, which ends with the resolver's own timeouts)."""
    result: dict[str, Any] = {}

    def lookup() -> None:
        try:
            result["infos"] = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except BaseException as e:  # handed to the caller
            result["error"] = e

    thread = threading.Thread(target=lookup, name="input-dns", daemon=True)
    thread.start()
    thread.join(max(0.0, deadline - time.monotonic()))
    if thread.is_alive():
        raise _deadline_error(policy, field)
    if "error" in result:
        raise result["error"]
    return result["infos"]


def _pick_address(host: str, port: int, policy: InputPolicy, field: str, deadline: float) -> str:
    """Resolve ``host`` by ``deadline``; refuse when any answer is non-public (unless allowed).
    Returns one address."""
    try:
        infos = _getaddrinfo(host, port, deadline, policy, field)
    except (socket.gaierror, UnicodeError) as e:
        raise InputError(field, f"cannot resolve host {host!r} ({e})") from None
    addresses = []
    for info in infos:
        ip = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        if ip not in addresses:
            addresses.append(ip)
    if not addresses:
        raise InputError(field, f"cannot resolve host {host!r}")
    if not policy.allow_private_addresses and not all(_is_public(ip) for ip in addresses):
        raise InputError(
            field,
            f"host {host!r} resolves to a private or local address (not globally routable), "
            "which is not allowed",
        )
    return str(addresses[0])


def _deadline_transport(deadline: float) -> Any:
    """An httpx transport whose every network operation (connect, TLS handshake, each read and write)
    waits at most until ``deadline``: a peer that trickles bytes cannot stretch the fetch, since no
    single read may outlast the time left."""
    import httpcore
    import httpx

    def left(timeout: float | None, expired: type[Exception]) -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise expired("the fetch's deadline passed")
        return remaining if timeout is None else min(timeout, remaining)

    class Stream(httpcore.NetworkStream):
        def __init__(self, inner: httpcore.NetworkStream):
            self.inner = inner

        def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
            return self.inner.read(max_bytes, left(timeout, httpcore.ReadTimeout))

        def write(self, buffer: bytes, timeout: float | None = None) -> None:
            self.inner.write(buffer, left(timeout, httpcore.WriteTimeout))

        def close(self) -> None:
            self.inner.close()

        def start_tls(
            self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
        ) -> httpcore.NetworkStream:
            return Stream(
                self.inner.start_tls(ssl_context, server_hostname, left(timeout, httpcore.ConnectTimeout))
            )

        def get_extra_info(self, info: str) -> Any:
            return self.inner.get_extra_info(info)

    class Backend(httpcore.SyncBackend):
        def connect_tcp(
            self,
            host: str,
            port: int,
            timeout: float | None = None,
            local_address: str | None = None,
            socket_options: Any = None,
        ) -> httpcore.NetworkStream:
            timeout = left(timeout, httpcore.ConnectTimeout)
            return Stream(super().connect_tcp(host, port, timeout, local_address, socket_options))

    transport = httpx.HTTPTransport(trust_env=False)
    # httpx has no public hook for the network backend: its transport's pool is swapped for one that
    # uses ours (same TLS context as httpx's default; tests/test_api_inputs.py's trickling server
    # fails should httpx stop reading ``_pool``).
    transport._pool = httpcore.ConnectionPool(
        ssl_context=httpx.create_ssl_context(trust_env=False), network_backend=Backend()
    )
    return transport


def _fetch(url: str, out: IO[bytes], policy: InputPolicy, field: str) -> None:
    import httpx

    deadline = time.monotonic() + policy.fetch_timeout_seconds
    timeout = httpx.Timeout(policy.fetch_timeout_seconds)
    transport = _deadline_transport(deadline)
    with httpx.Client(
        timeout=timeout, follow_redirects=False, trust_env=False, transport=transport
    ) as client:
        for _ in range(_MAX_REDIRECTS + 1):
            parts = urllib.parse.urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise InputError(field, "only absolute http(s) URLs can be fetched")
            if parts.username or parts.password:
                raise InputError(field, "URLs with credentials are not accepted")
            host = parts.hostname
            try:
                port = parts.port or (443 if parts.scheme == "https" else 80)
            except ValueError:
                raise InputError(field, "invalid port in URL") from None
            address = _pick_address(host, port, policy, field, deadline)
            ip_host = f"[{address}]" if ":" in address else address
            target = urllib.parse.urlunsplit(
                (parts.scheme, f"{ip_host}:{port}", parts.path or "/", parts.query, "")
            )
            host_header = host if parts.port is None else f"{host}:{parts.port}"
            extensions = {"sni_hostname": host} if parts.scheme == "https" else {}
            try:
                request = client.build_request(
                    "GET", target, headers={"Host": host_header}, extensions=extensions
                )
                response = client.send(request, stream=True)
            except httpx.HTTPError as e:
                if time.monotonic() >= deadline:
                    raise _deadline_error(policy, field) from None
                raise InputError(field, f"fetch failed ({type(e).__name__}: {e})") from None
            try:
                if response.is_redirect:
                    location = response.headers.get("location")
                    if not location:
                        raise InputError(field, f"fetch failed: HTTP {response.status_code} without Location")
                    url = urllib.parse.urljoin(url, location)
                    continue
                if response.status_code != 200:
                    raise InputError(field, f"fetch failed: HTTP {response.status_code}")
                declared = response.headers.get("content-length")
                if declared and declared.isdigit() and int(declared) > policy.max_bytes:
                    raise InputError(field, f"resource is larger than the limit of {policy.max_bytes} bytes")
                sink = _Limited(out, policy.max_bytes, field)
                try:
                    for chunk in response.iter_bytes(_CHUNK):
                        sink.write(chunk)
                        if time.monotonic() > deadline:
                            raise _deadline_error(policy, field)
                except httpx.HTTPError as e:
                    if time.monotonic() >= deadline:
                        raise _deadline_error(policy, field) from None
                    raise InputError(field, f"fetch failed ({type(e).__name__}: {e})") from None
                return
            finally:
                response.close()
        raise InputError(field, f"too many redirects (more than {_MAX_REDIRECTS})")


# -- validation ---------------------------------------------------------------------------------


def _validate(
    path: Path, role: Role, policy: InputPolicy, field: str
) -> tuple[str, str, int | None, int | None]:
    """Returns (extension, media type, width, height)."""
    if role == "image":
        return _validate_image(path, policy, field)
    return _validate_av(path, role, policy, field)


def _check_size(width: int, height: int, policy: InputPolicy, field: str, what: str) -> None:
    """Refuse a ``what`` (image, video) of ``width`` x ``height`` that cannot make a frame: a side
    under ``min_side`` pixels, or sides further apart than ``max_aspect_ratio`` (fitted inside a
    frame, the shorter one would vanish)."""
    if min(width, height) < policy.min_side:
        raise InputError(
            field,
            f"{what} is {width}x{height} pixels, too small to make a frame of: "
            f"each side must be at least {policy.min_side} pixels",
            MEDIA_SIZE,
        )
    if max(width, height) > policy.max_aspect_ratio * min(width, height):
        raise InputError(
            field,
            f"{what} is {width}x{height} pixels, too narrow to make a frame of: "
            f"its longer side may be at most {policy.max_aspect_ratio:g} times its shorter one",
            MEDIA_SIZE,
        )


def _why(error: BaseException, path: Path) -> str:
    """A decoder's error as a client reads it: without the server's path of the spooled file (PIL
    and FFmpeg name it), which says nothing to the client and too much about the server."""
    text = str(error)
    for shown in (str(path), repr(str(path)), path.name):
        text = text.replace(shown, "the input")
    return text


def _validate_image(path: Path, policy: InputPolicy, field: str) -> tuple[str, str, int, int]:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path, formats=list(_IMAGE_EXT)) as img:
            width, height = img.size
            if width <= 0 or height <= 0:
                raise InputError(field, "image has no pixels")
            if width * height > policy.max_pixels:
                raise InputError(
                    field, f"image is {width}x{height}, more than the limit of {policy.max_pixels} pixels"
                )
            _check_size(width, height, policy, field, "image")
            img.load()  # decode fully: a truncated or corrupt file fails here
            if img.mode != "RGB":
                img.convert("RGB")  # what every family does with it: grayscale, palette, alpha, CMYK
            fmt = img.format or ""
            media_type = Image.MIME.get(fmt, f"image/{fmt.lower() or 'unknown'}")
    except InputError:
        raise
    except UnidentifiedImageError:
        raise InputError(
            field, f"not a readable image in a format this service takes ({_IMAGE_FORMATS})"
        ) from None
    except Image.DecompressionBombError as e:
        raise InputError(field, f"not a readable image ({_why(e, path)})") from None
    except (OSError, ValueError, SyntaxError) as e:  # PIL reports corrupt data with these
        raise InputError(field, f"not a readable image ({_why(e, path)})") from None
    return _IMAGE_EXT.get(fmt, fmt.lower() or "img"), media_type, width, height


def _validate_av(
    path: Path, role: Literal["audio", "video"], policy: InputPolicy, field: str
) -> tuple[str, str, int | None, int | None]:
    import av

    width = height = None
    try:
        with av.open(str(path)) as container:
            streams = container.streams.audio if role == "audio" else container.streams.video
            if not streams:
                raise InputError(field, f"has no {role} stream")
            stream = streams[0]
            if role == "video":
                width, height = stream.codec_context.width, stream.codec_context.height
                if width and height and width * height > policy.max_pixels:
                    raise InputError(
                        field, f"video is {width}x{height}, more than the limit of {policy.max_pixels} pixels"
                    )
                if width and height:
                    _check_size(width, height, policy, field, "video")
            demuxer = (container.format.name or "").split(",")[0]
            _check_length(container, role, policy, field)  # demuxes it all: decode from a fresh open
        with av.open(str(path)) as container:
            stream = (container.streams.audio if role == "audio" else container.streams.video)[0]
            decoded = next(iter(container.decode(stream)), None)  # one frame proves the codec works
            if decoded is None:
                raise InputError(field, f"has no decodable {role} frames")
            if role == "video" and not (width and height):  # the container did not say: the frame does
                width, height = decoded.width, decoded.height
                _check_size(width, height, policy, field, "video")
    except InputError:
        raise
    except (av.FFmpegError, OSError, ValueError, StopIteration) as e:
        raise InputError(field, f"not a readable {role} file ({_why(e, path)})") from None
    table = _AUDIO_FORMATS if role == "audio" else _VIDEO_FORMATS
    ext, media_type = table.get(demuxer, (demuxer or "bin", f"{role}/{demuxer or 'octet-stream'}"))
    return ext, media_type, width, height


def _check_length(container: Any, role: Literal["audio", "video"], policy: InputPolicy, field: str) -> None:
    """Measure the input (its first ``role`` stream and, for a video, its first audio track) from its
    packets' timestamps, one demux pass without decoding, and from the container's own durations;
    refuse a file longer than the ``role``'s limit, or a video whose frames come less than
    :data:`_MIN_VIDEO_FPS` a second on average (what a merge or a guide would fill in, frame by frame)."""
    video = container.streams.video[0] if role == "video" else None
    audio = container.streams.audio[0] if container.streams.audio else None
    scanned = [s for s in (video, audio) if s is not None]
    spans = {s.index: Span() for s in scanned}
    for packet in container.demux(*scanned):
        if packet.size:  # size 0: flush packets
            ts = packet.pts if packet.pts is not None else packet.dts
            spans[packet.stream.index].add(ts, packet.duration or 0)

    def length(stream: Any) -> Fraction:
        measured = spans[stream.index].seconds(stream.time_base)
        declared = (
            Fraction(stream.duration) * Fraction(stream.time_base)
            if stream.duration and stream.time_base
            else 0
        )
        return max(measured, Fraction(declared))

    limit, key = (
        (policy.max_video_seconds, "max_video_seconds")
        if role == "video"
        else (policy.max_audio_seconds, "max_audio_seconds")
    )
    for stream, what in ((video, "video"), (audio, "audio track" if role == "video" else "audio")):
        if stream is None:
            continue
        seconds = length(stream)
        if seconds > limit:
            raise InputError(
                field,
                f"{what} lasts {float(seconds):.1f} s, longer than the limit of {limit:g} s "
                f"(api.inputs.{key})",
            )
    if video is None:
        return
    span = spans[video.index]
    seconds = span.seconds(video.time_base)
    rates = []  # frames per second: measured from the timestamps, and the container's own figure
    if span.packets > 1 and seconds > 0:
        rates.append(Fraction(span.packets) / seconds)
    if span.packets > 1 and video.average_rate:
        rates.append(Fraction(video.average_rate))
    if rates and min(rates) < _MIN_VIDEO_FPS:  # a single frame (a still) has no rate to judge
        raise InputError(
            field,
            f"video has {span.packets} frames over {float(seconds):.1f} s ({float(min(rates)):.3g} frames "
            f"per second): a video's frames must come at least {_MIN_VIDEO_FPS} frame per second on average",
        )


def copy_into_assets(
    src: Path,
    role: Role,
    policy: InputPolicy,
    assets_dir: Path,
    store: Store | None = None,
    *,
    field: str | None = None,
) -> InputAsset:
    """Store a server-side file (e.g. a frame extracted from an earlier shot) like a client resource,
    without applying ``allowed_roots`` (the server produced it)."""
    trusted = policy.model_copy(update={"allowed_roots": [Path(src).resolve().parent]})
    return resolve_resource(str(Path(src).resolve()), role, trusted, assets_dir, store, field=field)
