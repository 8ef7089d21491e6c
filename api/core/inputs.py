"""The input boundary: turn a client's resource reference into a validated, stored local asset.

Accepted (r2v spec "Input boundary", limited by :class:`settings.api.InputPolicy`):

- ``data:`` URLs (base64 or percent-encoded);
- ``http(s)://`` URLs, fetched with httpx (streamed, size- and time-limited) when ``fetch_urls`` is on;
  hosts that resolve to private/loopback/link-local/reserved addresses are refused unless
  ``allow_private_addresses``. The connection goes to the checked address (Host header and TLS SNI keep
  the name), so a second DNS answer cannot swap in another host; redirects are followed by hand and
  each hop is checked again;
- ``file://`` URLs and absolute paths, only when the path (symlinks resolved) lies under
  ``allowed_roots``.

Every accepted resource is copied to ``assets_dir/<sha[:2]>/<sha>.<ext>`` (content-addressed) before
the job is queued, so a job never depends on a URL or a caller's file staying the same. Images are
fully decoded with PIL (pixel limit checked before decoding); audio and video are probed and their
first frame decoded with PyAV. An image or video whose size cannot make a frame (a side under
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
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Literal

from settings.api import InputPolicy
from shotloom.media import file_sha256

if TYPE_CHECKING:
    from api.store import Store

Role = Literal["image", "audio", "video"]
Source = Literal["data", "http", "file"]

__all__ = ["MEDIA_SIZE", "InputAsset", "InputError", "Role", "copy_into_assets", "resolve_resource"]

# InputError.code of a readable image or video whose size cannot make a frame.
MEDIA_SIZE = "invalid_media_size"
_MAX_REDIRECTS = 5
_CHUNK = 1 << 16

# PIL format -> file extension.
_IMAGE_EXT = {"JPEG": "jpg", "PNG": "png", "WEBP": "webp", "GIF": "gif", "BMP": "bmp", "TIFF": "tiff"}
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


def _is_public(addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(addr, ipaddress.IPv6Address):
        mapped = addr.ipv4_mapped or addr.sixtofour
        if mapped is not None:
            addr = mapped
    return not (
        addr.is_private
        or addr.is_loopback
        or addr.is_link_local
        or addr.is_multicast
        or addr.is_reserved
        or addr.is_unspecified
        or getattr(addr, "is_site_local", False)
    )


def _pick_address(host: str, port: int, policy: InputPolicy, field: str) -> str:
    """Resolve ``host``; refuse when any answer is non-public (unless allowed). Returns one address."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
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
        raise InputError(field, f"host {host!r} resolves to a private or local address, which is not allowed")
    return str(addresses[0])


def _fetch(url: str, out: IO[bytes], policy: InputPolicy, field: str) -> None:
    import httpx

    deadline = time.monotonic() + policy.fetch_timeout_seconds
    timeout = httpx.Timeout(policy.fetch_timeout_seconds)
    with httpx.Client(timeout=timeout, follow_redirects=False, trust_env=False) as client:
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
            address = _pick_address(host, port, policy, field)
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
                            raise InputError(
                                field, f"fetch took longer than {policy.fetch_timeout_seconds:g} s"
                            )
                except httpx.HTTPError as e:
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


def _validate_image(path: Path, policy: InputPolicy, field: str) -> tuple[str, str, int, int]:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as img:
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
    except (UnidentifiedImageError, Image.DecompressionBombError) as e:
        raise InputError(field, f"not a readable image ({e})") from None
    except (OSError, ValueError, SyntaxError) as e:  # PIL reports corrupt data with these
        raise InputError(field, f"not a readable image ({e})") from None
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
            decoded = next(iter(container.decode(stream)), None)  # one frame proves the codec works
            if decoded is None:
                raise InputError(field, f"has no decodable {role} frames")
            if role == "video" and not (width and height):  # the container did not say: the frame does
                width, height = decoded.width, decoded.height
                _check_size(width, height, policy, field, "video")
            demuxer = (container.format.name or "").split(",")[0]
    except InputError:
        raise
    except (av.FFmpegError, OSError, ValueError, StopIteration) as e:
        raise InputError(field, f"not a readable {role} file ({e})") from None
    table = _AUDIO_FORMATS if role == "audio" else _VIDEO_FORMATS
    ext, media_type = table.get(demuxer, (demuxer or "bin", f"{role}/{demuxer or 'octet-stream'}"))
    return ext, media_type, width, height


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
