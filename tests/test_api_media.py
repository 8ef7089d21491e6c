"""GET /media/{asset_path}: whole files, byte ranges, and every traversal attempt answering the same 404."""

from __future__ import annotations

import numpy as np
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from api.admin.media import NOT_FOUND_BODY, media_router, resolve_media_path
from shotloom.media import write_mp4

REL = "r2v/demo/shot-002/8d1d/output.mp4"


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    base = tmp_path_factory.mktemp("media-test")
    root = base / "media"
    frames = (np.arange(6 * 32 * 32 * 3) % 251).astype(np.uint8).reshape(6, 32, 32, 3)
    write_mp4(root / REL, frames, 8, None, None, preset="ultrafast")
    (base / "secret.txt").write_text("outside the media root")
    (root / "r2v" / "escape.mp4").symlink_to(base / "secret.txt")
    (root / "r2v" / "inside-link.mp4").symlink_to(root / REL)
    (root / "r2v" / "dir-link").symlink_to(base)
    app = FastAPI()
    app.include_router(media_router(root))
    with TestClient(app) as client:
        yield client, root


def test_full_get(media):
    client, root = media
    data = (root / REL).read_bytes()
    r = client.get(f"/media/{REL}")
    assert r.status_code == 200
    assert r.content == data
    assert r.headers["content-type"] == "video/mp4"
    assert r.headers["accept-ranges"] == "bytes"
    assert int(r.headers["content-length"]) == len(data)
    head = client.head(f"/media/{REL}")
    assert (
        head.status_code == 200 and head.content == b"" and int(head.headers["content-length"]) == len(data)
    )
    # A symlink that stays inside the root is served.
    assert client.get("/media/r2v/inside-link.mp4").content == data


def test_a_file_named_from_a_clients_ids_is_served_at_the_url_the_api_gives(media):
    """Ids are the client's: '#', '?', '%' and spaces in a work or shot id reach the file through
    the URL the API hands out (each segment percent-encoded), over real HTTP: Uvicorn decodes the
    path once (Starlette's TestClient and httpx's ASGI transport decode it twice)."""
    import httpx

    from api.core.records import media_url_path

    from api_stack import served

    _, root = media
    odd = "r2v/scene #1?/take %41 100%/8d1d/output.mp4"
    (root / odd).parent.mkdir(parents=True)
    (root / odd).write_bytes(b"odd")
    url = media_url_path(odd)
    assert url == "/media/r2v/scene%20%231%3F/take%20%2541%20100%25/8d1d/output.mp4"
    app = FastAPI()
    app.include_router(media_router(root))
    with served(app) as base:
        assert httpx.get(base + url, timeout=10).content == b"odd"
        # Decoded once only: the "%41" of the id is not an "A".
        assert httpx.get(base + url.replace("%2541", "A"), timeout=10).status_code == 404


@pytest.mark.parametrize(
    ("header", "span"),
    [
        ("bytes=0-99", (0, 100)),
        ("bytes=100-", (100, None)),
        ("bytes=-50", (-50, None)),
        ("bytes=10-10", (10, 11)),
    ],
)
def test_ranges(media, header, span):
    client, root = media
    data = (root / REL).read_bytes()
    r = client.get(f"/media/{REL}", headers={"Range": header})
    assert r.status_code == 206
    start, stop = span
    expected = data[start:stop] if stop is not None else data[start:]
    assert r.content == expected
    first = start if start >= 0 else len(data) + start
    assert r.headers["content-range"] == f"bytes {first}-{first + len(expected) - 1}/{len(data)}"
    assert r.headers["accept-ranges"] == "bytes"


def test_unsatisfiable_range(media):
    client, root = media
    size = (root / REL).stat().st_size
    r = client.get(f"/media/{REL}", headers={"Range": f"bytes={size + 10}-{size + 20}"})
    assert r.status_code == 416
    assert r.headers["content-range"] == f"bytes */{size}"


@pytest.mark.parametrize(
    "path",
    [
        "/media/r2v/demo/missing.mp4",
        "/media/r2v",  # a directory
        "/media/r2v/",
        "/media/r2v/escape.mp4",  # symlink to a file outside
        "/media/r2v/dir-link/secret.txt",  # through a symlinked directory that leads outside
        "/media/..%2fsecret.txt",
        "/media/%2e%2e%2fsecret.txt",
        "/media/%2E%2E/secret.txt",
        "/media/r2v/..%2f..%2fsecret.txt",
        "/media/%252e%252e%252fsecret.txt",  # double-encoded
        "/media/..%5csecret.txt",  # backslash
        "/media/%2fetc%2fpasswd",  # absolute
        "/media//etc/passwd",
        "/media/r2v/demo/shot-002/8d1d/output.mp4%00.txt",
        "/media/",
    ],
)
def test_refusals_are_all_the_same_404(media, path):
    client, _ = media
    r = client.get(path)
    assert r.status_code == 404, path
    assert r.json() == NOT_FOUND_BODY


def test_resolve_media_path_directly(media):
    _, root = media
    assert resolve_media_path(root, REL)[0] == (root / REL).resolve()
    for bad in (
        "../secret.txt",
        "r2v/../../secret.txt",
        "/etc/passwd",
        "%2e%2e/secret.txt",
        "",
        ".",
        "r2v/escape.mp4",
    ):
        assert resolve_media_path(root, bad) is None, bad
