"""``GET /media/{asset_path}``: stream a stored file from below ``media_root``, with HTTP Range.

Only regular files whose real path (symlinks resolved) lies inside ``media_root`` are served. Every
refusal (missing file, directory, ``..``, percent-encoded traversal, absolute path, a symlink leading
outside) answers the same 404 body, so a client cannot tell "outside" from "missing".

Range requests are handled by Starlette's ``FileResponse`` (Starlette >= 0.39; pinned 1.10 here):
``bytes=a-b``, ``bytes=a-`` and ``bytes=-n`` answer 206 with ``Content-Range``; an unsatisfiable
range answers 416; ``Accept-Ranges: bytes`` is always sent.
"""

from __future__ import annotations

import mimetypes
import os
import urllib.parse
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, JSONResponse, Response

from shotloom.media_store import LocalMediaStore

__all__ = ["NOT_FOUND_BODY", "media_router", "resolve_media_path"]

NOT_FOUND_BODY = {"detail": "Not Found"}  # the same body as an unmatched route

_MEDIA_TYPES = {
    ".mp4": "video/mp4",
    ".m4a": "audio/mp4",
    ".wav": "audio/wav",
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".webp": "image/webp",
    ".json": "application/json",
}


def resolve_media_path(media_root: Path, asset_path: str) -> tuple[Path, os.stat_result] | None:
    """The regular file ``asset_path`` names below ``media_root`` (and its stat), or None."""
    return LocalMediaStore(media_root).served(asset_path)


def media_router(media_root: Path) -> APIRouter:
    """A router serving ``GET``/``HEAD /media/{asset_path:path}`` from the media store."""
    store = LocalMediaStore(media_root)
    router = APIRouter(tags=["media"])

    def get_media(asset_path: str, request: Request) -> Response:
        """A produced file (an MP4, a still), whole or by byte range."""
        # The raw path as sent (before the router decoded it) must not traverse either.
        raw = request.scope.get("raw_path", b"").decode("latin-1")
        if ".." in urllib.parse.unquote(urllib.parse.unquote(raw)).split("/"):
            return JSONResponse(NOT_FOUND_BODY, status_code=404)
        found = store.served(asset_path)
        if found is None:
            return JSONResponse(NOT_FOUND_BODY, status_code=404)
        path, st = found
        media_type = _MEDIA_TYPES.get(path.suffix.lower()) or mimetypes.guess_type(path.name)[0]
        return FileResponse(
            path,
            media_type=media_type or "application/octet-stream",
            stat_result=st,
        )

    for method in ("GET", "HEAD"):  # one operation each: an OpenAPI operation id names one method
        router.add_api_route(
            "/media/{asset_path:path}",
            get_media,
            methods=[method],
            operation_id=f"{method.lower()}_media",
            response_class=FileResponse,
            responses={
                200: {"content": {"video/mp4": {}}, "description": "The whole file."},
                206: {"description": "The requested byte range."},
                404: {"description": "Missing file or a path outside media_root."},
                416: {"description": "Range not satisfiable."},
            },
        )

    return router
