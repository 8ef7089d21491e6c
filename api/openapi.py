"""The OpenAPI documents: the whole API at ``/openapi.json``, and one per dialect
(``/r2v/openapi.json``, ``/v1/openapi.json``) for clients and property-based tests.

Bodies the OpenAI routes read by hand (JSON or multipart) are declared by reference to the request
model. The constraints that depend on the loaded model (its size and frame grids, frame rates,
guidance range, step count) and on the server YAML (longest clip, largest size) are written into
the ``/v1`` document once a worker has published the model's capabilities, so that a request the
document calls valid is one the server accepts or refuses only for its content (an input that
does not decode, a full queue).
"""

from __future__ import annotations

import copy
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from api.openai.protocol import ServedModel, VideoCreateRequest

URL_PATTERN = r"^(data:|https?://|file://|/)"
_OPENAI, _R2V = "openai", "r2v"
_SHARED = {"health"}


def full_document(app: FastAPI) -> dict[str, Any]:
    doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    schema = VideoCreateRequest.model_json_schema(ref_template="#/components/schemas/{model}")
    components = doc.setdefault("components", {}).setdefault("schemas", {})
    components.update(schema.pop("$defs", {}))
    components["VideoCreateRequest"] = schema
    _loosen_seconds(components["VideoCreateRequest"])
    for name in ("VideoCreateRequest", "ReferenceObject"):
        _url_patterns(components[name])
    return doc


def dialect_document(full: dict[str, Any], dialect: str, title: str) -> dict[str, Any]:
    """Only the operations of one dialect (and the shared ones), with the components they use."""
    doc = copy.deepcopy(full)
    doc["info"]["title"] = title
    keep = {dialect, *_SHARED}
    paths = {}
    for path, item in doc["paths"].items():
        ops = {m: op for m, op in item.items() if set(op.get("tags", [])) & keep}
        if ops:
            paths[path] = ops
    doc["paths"] = paths
    return doc


def constrain(doc: dict[str, Any], model: ServedModel, max_width: int, max_height: int) -> dict[str, Any]:
    """Write the loaded model's grids and the server's limits into the /v1 request schema."""
    doc = copy.deepcopy(doc)
    schemas = doc["components"]["schemas"]
    req, params = schemas["VideoCreateRequest"]["properties"], schemas["VideoParams"]["properties"]
    caps = model.caps
    widths = list(range(caps.size_multiple, max_width + 1, caps.size_multiple))
    heights = list(range(caps.size_multiple, max_height + 1, caps.size_multiple))
    size = f"^({'|'.join(map(str, widths))})x({'|'.join(map(str, heights))})$"
    _set(req["size"], {"pattern": size})
    max_frames = min(caps.max_frames, int(model.max_seconds * max(caps.fps)) + caps.frame_multiple + 1)
    frames = list(range(1, max_frames + 1, caps.frame_multiple))
    for props in (req, params):
        _set(props["width"], {"multipleOf": caps.size_multiple, "maximum": max_width})
        _set(props["height"], {"multipleOf": caps.size_multiple, "maximum": max_height})
        _set(props["fps"], {"enum": list(caps.fps)})
        _set(props["num_frames"], {"enum": frames})
    lo, hi = caps.guidance_range
    _set(req["guidance_scale"], {"minimum": lo, "maximum": hi})
    _set(req["num_inference_steps"], {"enum": [model.steps]})
    for branch in req["seconds"]["anyOf"]:
        if branch.get("type") == "number":
            branch["maximum"] = model.max_seconds
    req["model"]["anyOf"] = [{"type": "string", "enum": [model.id]}, {"type": "null"}]
    return doc


def _set(prop: dict[str, Any], constraints: dict[str, Any]) -> None:
    """Constrain the non-null branch of an ``anyOf: [T, null]`` property (or the property)."""
    for branch in prop.get("anyOf", [prop]):
        if branch.get("type") not in (None, "null"):
            branch.update(constraints)


def _loosen_seconds(schema: dict[str, Any]) -> None:
    # The SDK sends seconds as a string ("4"); the server takes either.
    schema["properties"]["seconds"]["anyOf"] = [
        {"type": "number", "exclusiveMinimum": 0},
        {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?$"},
        {"type": "null"},
    ]


def _url_patterns(schema: dict[str, Any]) -> None:
    for name, prop in schema["properties"].items():
        if name.endswith("_url") or name in ("first_frame", "last_frame", "input_reference"):
            for branch in prop.get("anyOf", [prop]):
                if branch.get("type") == "string":
                    branch["pattern"] = URL_PATTERN
