"""The OpenAPI documents: the whole API at ``/openapi.json``, and one per dialect
(``/r2v/openapi.json``, ``/v1/openapi.json``) for clients and property-based tests.

Bodies the OpenAI routes read by hand (JSON or multipart) are declared by reference to the request
model. The constraints that depend on the loaded model (its size and frame grids, frame rates,
guidance range, step count, step cache presets) and on the server YAML (longest clip, largest
size, the step caches it offers) are written into the ``/v1`` document once a worker has
published the model's capabilities, so that a request the document calls valid is one the
server accepts or refuses only for its content (an input that does not decode, a full queue).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Depends, FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse

from api.openai.images import ImageRequest
from api.openai.protocol import CharacterCreateRequest, ServedModel, VideoCreateRequest, snap_frames

URL_PATTERN = r"^(data:|https?://|file://|/)"
_SHARED = {"health"}
# Fields of the JSON body that a multipart form carries under bracketed keys, and file parts.
_NESTED = ("video_params", "image_reference", "lora", "extra_params", "characters", "guides")
_FILES = ("input_reference", "first_frame", "last_frame")
# The documented names of guides' file parts, guide_0, guide_1... (the server takes any name
# that guides lists, but for the keyframe fields).
GUIDE_PART = r"^guide_[0-9]{1,3}$"
_BY_ID = {  # {"id": ...} of a completed video
    "type": "object",
    "properties": {"id": {"type": "string", "pattern": "^video_[0-9a-f]{32}$"}},
    "required": ["id"],
    "additionalProperties": False,
}


def full_document(app: FastAPI) -> dict[str, Any]:
    """The whole API, with the ``/v1`` request bodies (read by hand) declared as components."""
    doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    schema = VideoCreateRequest.model_json_schema(ref_template="#/components/schemas/{model}")
    components = doc.setdefault("components", {}).setdefault("schemas", {})
    components.update(schema.pop("$defs", {}))
    _loosen_seconds(schema)
    schema["properties"]["prompt"]["pattern"] = r"\S"  # not blank
    components["VideoCreateRequest"] = schema
    for name in ("VideoCreateRequest", "ReferenceObject"):
        _url_patterns(components[name])
    components["VideoCreateForm"] = form = _form_schema(schema)
    components["VideoEditRequest"], components["VideoEditForm"] = _edit_schemas(schema, form)
    character = CharacterCreateRequest.model_json_schema(ref_template="#/components/schemas/{model}")
    character["properties"]["video"] = {**_BY_ID, "description": "A completed video of this server."}
    character["required"] = ["name", "video"]
    components["CharacterCreateRequest"] = character
    image = ImageRequest.model_json_schema(ref_template="#/components/schemas/{model}")
    components.update(image.pop("$defs", {}))
    components["ImageRequest"] = image
    image_form = copy.deepcopy(image)
    image_form["title"] = "ImageEditForm"
    image_form["properties"]["image"] = {
        "type": "string",
        "format": "binary",
        "description": "A reference image.",
    }
    image_form["properties"].pop("lora", None)
    image_form["patternProperties"] = {
        r"^image\[\]$": {"type": "string", "format": "binary"},
        r"^lora\[": {"type": "string"},
    }
    image_form["required"] = ["prompt", "image"]
    components["ImageEditForm"] = image_form
    components["CharacterCreateForm"] = {
        "title": "CharacterCreateForm",
        "type": "object",
        "description": 'The source is a file part "video" (an MP4), or a field "video[id]".',
        "properties": {
            "name": character["properties"]["name"],
            "video": {"type": "string", "format": "binary"},
        },
        "patternProperties": {r"^video\[id\]$": {"type": "string"}},
        "required": ["name"],
        "additionalProperties": False,
    }
    return doc


def _edit_schemas(request: dict[str, Any], form: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """POST /v1/videos/edits: a create body plus ``video`` (``{"id"}``, or a file part)."""
    by_id = _BY_ID
    edit_request = copy.deepcopy(request)
    edit_request["title"] = "VideoEditRequest"
    edit_request["properties"]["video"] = {**by_id, "description": "A completed video of this server."}
    edit_request["required"] = [*edit_request.get("required", []), "video"]
    edit_form = copy.deepcopy(form)
    edit_form["title"] = "VideoEditForm"
    edit_form["properties"]["video"] = {"type": "string", "format": "binary", "description": "An MP4."}
    edit_form["patternProperties"][r"^video\[id\]$"] = {"type": "string"}
    edit_form["description"] += ' The source is a file part "video", or a field "video[id]".'
    return edit_request, edit_form


def _form_schema(json_schema: dict[str, Any]) -> dict[str, Any]:
    """The multipart spelling of the request, as the ``openai`` SDK sends it."""
    form = copy.deepcopy(json_schema)
    form["title"] = "VideoCreateForm"
    form["description"] = (
        "POST /v1/videos as multipart/form-data, as the openai SDK sends it: the JSON body's fields "
        "as form fields, every value a string; nested objects and lists under bracketed keys "
        "(video_params[fps], image_reference[][image_url], extra_params[work_id]); input_reference, "
        "first_frame and last_frame may be file parts. It means what the same JSON body means. "
        "Guides are multipart only: file parts (guide_0, ...) listed in the guides field as JSON."
    )
    props = form["properties"]
    for name in _NESTED:
        props.pop(name, None)
    for prop in props.values():  # a form field is absent or a value, never null
        if "anyOf" in prop:
            prop["anyOf"] = [b for b in prop["anyOf"] if b.get("type") != "null"]
        prop.pop("default", None)
    for name in _FILES:
        url = {"type": "string", "pattern": URL_PATTERN}
        props[name] = {"anyOf": [{"type": "string", "format": "binary"}, url], "title": props[name]["title"]}
    props["guides"] = {
        "type": "string",
        "title": "Guides",
        "description": 'A JSON list of {"file": a file part\'s name, "frame": the clip frame it starts at '
        '(below 0 from the end), "kind": "video" (an image, or a video with its sound) or "audio" '
        "(a sound alone)}. Refused where the model cannot condition on frames (or sounds).",
    }
    form["patternProperties"] = {
        rf"^({'|'.join(_NESTED)})\[": {"type": "string"},
        GUIDE_PART: {"type": "string", "format": "binary", "description": "A guide's file, named in guides."},
    }
    form["additionalProperties"] = False
    return form


def dialect_document(full: dict[str, Any], tags: tuple[str, ...], title: str) -> dict[str, Any]:
    """Only the operations of one dialect (its tags, and the shared ones)."""
    doc = copy.deepcopy(full)
    doc["info"]["title"] = title
    keep = {*tags, *_SHARED}
    paths = {}
    for path, item in doc["paths"].items():
        ops = {m: op for m, op in item.items() if set(op.get("tags", [])) & keep}
        if ops:
            paths[path] = ops
    doc["paths"] = paths
    return doc


def constrain(doc: dict[str, Any], model: ServedModel) -> dict[str, Any]:
    """Write the loaded model's grids and the server's limits into the /v1 request schema."""
    doc = copy.deepcopy(doc)
    schemas = doc["components"]["schemas"]
    params = schemas["VideoParams"]["properties"]
    bodies = [schemas[n]["properties"] for n in ("VideoCreateRequest", "VideoEditRequest")]
    bodies += [schemas[n]["properties"] for n in ("VideoCreateForm", "VideoEditForm")]
    caps, max_width, max_height = model.caps, model.max_width, model.max_height
    widths = list(range(caps.size_multiple, max_width + 1, caps.size_multiple))
    heights = list(range(caps.size_multiple, max_height + 1, caps.size_multiple))
    size = f"^({'|'.join(map(str, widths))})x({'|'.join(map(str, heights))})$"
    for props in bodies:
        _set(props["size"], {"pattern": size})
    most = min(caps.max_frames, snap_frames(model.max_seconds, min(caps.fps), caps.frame_multiple))
    frames = list(range(1, most + 1, caps.frame_multiple))
    for props in (*bodies, params):
        _set(props["width"], {"multipleOf": caps.size_multiple, "maximum": max_width})
        _set(props["height"], {"multipleOf": caps.size_multiple, "maximum": max_height})
        _set(props["fps"], {"enum": list(caps.fps)})
        _set(props["num_frames"], {"enum": frames})
    # Steps: what the model's sampler or any adapter's own takes (native: 1 to max_steps; dmd: its
    # count); guidance: the server's range within the family's (the same for every sampler).
    rules = [model.sampling, *model.adapter_sampling.values()]
    lo, hi = model.sampling.guidance_range
    if any(r.step_range[0] != r.step_range[1] for r in rules):
        steps = {"minimum": 1, "maximum": max(r.step_range[1] for r in rules)}
    else:
        steps = {"enum": sorted({r.steps for r in rules})}
    # Step caches: the model's (every adapter's too) that the server offers, and "none".
    caches = {"enum": list(model.sampling.step_caches)}
    for props in bodies:
        _set(props["guidance_scale"], {"minimum": lo, "maximum": hi})
        _set(props["num_inference_steps"], steps)
        _set(props["step_cache"], caches)
        for branch in props["seconds"]["anyOf"]:
            if branch.get("type") == "number":
                branch["maximum"] = model.max_seconds
        props["model"]["anyOf"] = [{"type": "string", "enum": [model.id]}, {"type": "null"}]
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


def docs_router(
    app: FastAPI,
    served: Callable[[], ServedModel | None],
    r2v_key: Callable[..., Any],
    openai_key: Callable[..., Any],
    browsable: bool,
) -> APIRouter:
    """``/openapi.json`` (the whole API), ``/r2v/openapi.json`` and ``/v1/openapi.json``; the
    latter carries the loaded model's grids once a worker has published them (before that, the
    model-independent constraints only). Each needs the API key when keys are set (``*_key``:
    the dialect's key dependency, so a refusal has that dialect's 401 shape). ``/docs`` (Swagger
    UI) only when ``browsable``: a browser page cannot send a key."""
    router = APIRouter(include_in_schema=False)

    if browsable:

        @router.get("/docs")
        def swagger() -> HTMLResponse:
            return get_swagger_ui_html(openapi_url="/openapi.json", title=f"{app.title} API")

    @router.get("/openapi.json", dependencies=[Depends(r2v_key)])
    def whole_document() -> dict[str, Any]:
        return app.openapi()

    @router.get("/r2v/openapi.json", dependencies=[Depends(r2v_key)])
    def r2v_document() -> dict[str, Any]:
        return dialect_document(app.openapi(), ("r2v", "media"), f"{app.title}: the R2V scheduler API")

    @router.get("/v1/openapi.json", dependencies=[Depends(openai_key)])
    def openai_document() -> dict[str, Any]:
        doc = dialect_document(app.openapi(), ("openai",), f"{app.title}: the OpenAI-compatible video API")
        model = served()
        return constrain(doc, model) if model is not None else doc

    return router


def install(
    app: FastAPI,
    served: Callable[[], ServedModel | None],
    r2v_key: Callable[..., Any],
    openai_key: Callable[..., Any],
    *,
    browsable: bool,
) -> None:
    """Serve :func:`full_document` as the app's ``/openapi.json`` (the app is made with
    ``openapi_url=None``, so that route is ours and keyed) and add the dialect documents."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = full_document(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    app.include_router(docs_router(app, served, r2v_key, openai_key, browsable))
