"""What an operator sees of a shot or a film in the Dagster UI: a ``preview`` markdown entry on its
materialization, with its thumbnail inline (a small JPEG as a ``data:`` URI, so the page needs no
route to the media) and links to its MP4 and spritesheet on the API's ``/media`` (behind the API
key when keys are set). A film's shows its shots' thumbnails in order."""

from __future__ import annotations

import os
from collections.abc import Sequence

from dagster import MetadataValue

from contracts.environment import API_URL_ENV
from resources.media_store import THUMBNAIL_NAME, MediaStoreResource
from shotloom.media_store import url_path

# Longest side of an inline thumbnail, in pixels: ~5-15 KB of JPEG in each materialization event.
PREVIEW_MAX_SIDE = 256
# A film's shots shown at this size, in one row.
SHOT_STRIP_MAX_SIDE = 128


def _link(label: str, relative: str) -> str:
    """A link to the file on the API's /media (plain text without the API's URL: `dagster dev`)."""
    base = os.environ.get(API_URL_ENV)
    return f"[{label}]({base.rstrip('/')}/media/{url_path(relative)})" if base else f"{label}: `{relative}`"


def _image(media: MediaStoreResource, relative: str, alt: str, max_side: int) -> str:
    uri = media.preview_data_uri(relative, max_side)
    return f"![{alt}]({uri})" if uri else f"*({alt}: no thumbnail)*"


def shot_preview(media: MediaStoreResource, video: str, thumbnail: str, spritesheet: str) -> MetadataValue:
    lines = [
        _image(media, thumbnail, "thumbnail", PREVIEW_MAX_SIDE),
        "",
        f"{_link('MP4', video)} · {_link('spritesheet', spritesheet)}",
    ]
    return MetadataValue.md("\n".join(lines))


def film_preview(
    media: MediaStoreResource,
    video: str,
    thumbnail: str,
    spritesheet: str,
    shots: Sequence[tuple[str, str]],
) -> MetadataValue:
    """``shots``: (shot id, its MP4 root-relative), in the film's order; each shot's thumbnail is
    the one its stills run wrote beside its MP4."""
    strip = " ".join(
        _image(media, f"{video_path.rsplit('/', 1)[0]}/{THUMBNAIL_NAME}", shot_id, SHOT_STRIP_MAX_SIDE)
        for shot_id, video_path in shots
    )
    lines = [
        _image(media, thumbnail, "film", PREVIEW_MAX_SIDE),
        "",
        f"{_link('MP4', video)} · {_link('spritesheet', spritesheet)}",
        "",
        "Shots, in order: " + ", ".join(f"`{shot_id}`" for shot_id, _ in shots),
        "",
        strip,
    ]
    return MetadataValue.md("\n".join(lines))
