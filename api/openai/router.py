"""The OpenAI dialect's routes (``/v1``): HTTP only; the logic is in :mod:`api.openai.serving`."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse, Response
from starlette.background import BackgroundTask
from starlette.datastructures import UploadFile

from api.auth import KeyRing
from api.context import ApiContext
from api.core.errors import ServiceError
from api.core.events import SSE_RESPONSES, job_events
from api.core.records import JobRecord, UnknownVersion
from api.deps import submitter_dependency
from api.openai.errors import ErrorBody, OpenAIError
from api.openai.forms import FormError, unflatten
from api.openai.images import ImageServing, ImagesResponse, image_id
from api.openai.protocol import (
    CharacterObject,
    ModelCard,
    ModelList,
    Video,
    VideoDeleted,
    VideoList,
    version_of,
)
from api.openai.serving import VideoServing, not_found, openai_errors, sync_headers
from api.openai.uploads import guarded_body
from api.polls import PollRoutes
from shotloom.media import file_sha256

T = TypeVar("T")
SYNC_POLL_S = 0.2
VIEW_CACHE_SIZE = 10_000  # cached GET /v1/videos/{id} answers; cleared when full
POLL_HEADER = "openai-poll-after-ms"
# On a deliberate 5xx that states an outcome (a failed job), not a transient fault: the `openai`
# SDK retries every 5xx twice with backoff unless told not to, so a failed video's retrieve would
# be asked three times (and a /sync request queued three times). Never on a 503 ("try later").
NO_RETRY = {"x-should-retry": "false"}
UPLOAD_FIELDS = ("input_reference", "first_frame", "last_frame")

_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "Invalid request; `param` names the field."},
    408: {"model": ErrorBody, "description": "The body stopped arriving."},
    413: {"model": ErrorBody, "description": "The body is too large, or the job store has no room for it."},
    401: {"model": ErrorBody, "description": "A missing or unknown API key (when keys are set)."},
    404: {"model": ErrorBody, "description": "Unknown video or model."},
}
_CREATE_ERRORS: dict[int | str, dict[str, Any]] = {
    **_ERRORS,
    409: {"model": ErrorBody, "description": "An Idempotency-Key reused for another request."},
    429: {"model": ErrorBody, "description": "queue_full, with Retry-After."},
    501: {"model": ErrorBody, "description": "The H.264/AAC encoder is missing."},
    503: {
        "model": ErrorBody,
        "description": "Not ready (starting, or no worker has loaded the model), or the service's "
        "database away (store_unavailable, with Retry-After; nothing was changed).",
    },
    507: {"model": ErrorBody, "description": "insufficient_storage: a disk the service writes to is full."},
}


def request_body(json_schema: str | None, form_schema: str) -> dict[str, Any]:
    """``openapi_extra`` of a route that reads its body by hand: the JSON and multipart schemas
    (components of :mod:`api.openapi`)."""
    content = {"multipart/form-data": {"schema": {"$ref": f"#/components/schemas/{form_schema}"}}}
    if json_schema is not None:
        content = {"application/json": {"schema": {"$ref": f"#/components/schemas/{json_schema}"}}, **content}
    return {"requestBody": {"required": True, "content": content}}


_SOURCE_ERRORS: dict[int | str, dict[str, Any]] = {
    **_CREATE_ERRORS,
    404: {"model": ErrorBody, "description": "Unknown source video (or model)."},
    409: {"model": ErrorBody, "description": "not_ready: the source video has not completed; or an "
          "Idempotency-Key reused for another request."},
}  # fmt: skip
_EDIT_BODY = request_body("VideoEditRequest", "VideoEditForm")
_CHARACTER_BODY = request_body("CharacterCreateRequest", "CharacterCreateForm")
_IMAGE_ERRORS: dict[int | str, dict[str, Any]] = {
    **_CREATE_ERRORS,
    500: {"model": ErrorBody, "description": "A generation failed."},
    504: {"model": ErrorBody, "description": "Not done in time: poll the named image instead."},
}
_IMAGE_BODY = request_body("ImageRequest", "ImageRequest")
_IMAGE_EDIT_BODY = request_body(None, "ImageEditForm")
_CREATE_BODY = request_body("VideoCreateRequest", "VideoCreateForm")


def _spooled_name(index: int, filename: str | None) -> str:
    """The file name an upload is spooled under: the client's (its last part only), cut to what any
    filesystem takes, its suffix kept (what a reader may go by)."""
    name = Path(filename or "upload").name or "upload"
    suffix = Path(name).suffix if len(Path(name).suffix) <= 16 else ""
    stem = name[: len(name) - len(suffix)] if suffix else name
    return f"{index}-{stem.encode()[:100].decode(errors='ignore')}{suffix}"


async def read_request(
    request: Request, spool: Path, max_part_bytes: int
) -> tuple[dict[str, Any], dict[str, Path]]:
    """The body as the same nested object whether JSON or the SDK's multipart form, and the file
    parts spooled to disk. A form's text part may be as large as a JSON body may
    (``max_part_bytes``, the body limit), not Starlette's default 1 MiB: a data-URL reference means
    the same in either. The body's own limits (TooLarge, BodyTimeout, raised by the guarded
    receive while the form is read) go through to their 413 / 408, as on the JSON path."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind == "application/json" or kind.endswith("+json"):
        raw = await request.body()
        try:
            data = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise OpenAIError(400, f"the body is not valid JSON: {exc}", code="invalid_json") from None
        except RecursionError:
            raise OpenAIError(400, "the body's JSON nests too deeply", code="invalid_json") from None
        if not isinstance(data, dict):
            raise OpenAIError(400, "the body must be a JSON object", code="invalid_json")
        return data, {}
    if kind in ("multipart/form-data", "application/x-www-form-urlencoded"):
        try:
            form = await request.form(max_part_size=max_part_bytes)
        except ServiceError:  # the guarded body's 413 / 408: answered as the JSON path's are
            raise
        except Exception as exc:  # python-multipart's errors: a malformed body
            raise OpenAIError(400, f"malformed form body: {exc}", code="invalid_multipart") from None
        fields: list[tuple[str, Any]] = []
        uploads: dict[str, Path] = {}
        for key, value in form.multi_items():
            if isinstance(value, UploadFile):
                if key.endswith("[]"):  # a list of files (the SDK's image[] parts): image[0], image[1]...
                    key = f"{key[:-2]}[{sum(1 for k in uploads if k.startswith(key[:-2] + '['))}]"
                if key in uploads:
                    raise OpenAIError(400, f"{key}: one file per field", param=key, code="invalid_value")
                path = spool / _spooled_name(len(uploads), value.filename)
                with path.open("wb") as out:
                    await run_in_threadpool(shutil.copyfileobj, value.file, out, 1 << 20)
                uploads[key] = path
            else:
                fields.append((key, value))
        try:
            data = unflatten(fields)
        except FormError as exc:
            raise OpenAIError(400, str(exc), param=exc.field, code="invalid_multipart") from None
        for name in UPLOAD_FIELDS:
            if name in uploads and name in data:
                raise OpenAIError(
                    400, f"{name}: given as a file and as a value", param=name, code="invalid_value"
                )
        return data, uploads
    raise OpenAIError(
        400,
        f"unsupported content type {kind or '(none)'!r}: send application/json or multipart/form-data",
        code="invalid_content_type",
    )


def openai_submitter(keys: KeyRing) -> Callable[..., str]:
    """The key check with this dialect's 401 (the error envelope)."""
    return submitter_dependency(
        keys, lambda message: OpenAIError(401, message, code="invalid_api_key", type="authentication_error")
    )


def openai_router(ctx: ApiContext, serving: VideoServing, polls: PollRoutes) -> APIRouter:
    submitter = openai_submitter(ctx.keys)
    pictures = ImageServing(ctx, serving)
    router = APIRouter(prefix="/v1", tags=["openai"], dependencies=[Depends(submitter)])

    def video_response(video: Video, status: int = 200) -> Response:
        return Response(
            video.model_dump_json(),
            status_code=status,
            media_type="application/json",
            headers={POLL_HEADER: str(serving.poll_after_ms(video))},
        )

    def view(job) -> Video:
        position = ctx.store.queue_position(job.version_id) if job.status == "queued" else None
        return serving.video(job, position)

    async def with_body(request: Request, handle: Callable[[dict, dict, dict], T]) -> T:
        """Read a create-like body (JSON or multipart, files spooled under the store's limits) and
        hand it to ``handle(raw, uploads, upload_digests)`` in a thread; the spool goes after."""
        assets = ctx.jobs.assets_dir
        assets.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=assets, prefix="upload-") as tmp, openai_errors():
            async with guarded_body(request, ctx.api.openai, ctx.retention) as body:
                raw, uploads = await read_request(body, Path(tmp), ctx.api.openai.max_body_bytes)
            digests = {name: await run_in_threadpool(file_sha256, path) for name, path in uploads.items()}
            return await run_in_threadpool(handle, raw, uploads, digests)

    async def accept(
        request: Request, handle: Callable[[dict, dict, dict], tuple[JobRecord, bool]]
    ) -> JobRecord:
        job, _created = await with_body(request, handle)
        return job

    async def settle(request: Request, jobs: list[JobRecord], poll: str) -> list[JobRecord] | None:
        """Wait until every job has finished (None: the client left, and they were cancelled);
        past the configured wait, 504 naming where to poll instead."""
        deadline = time.monotonic() + ctx.api.openai.sync_timeout_seconds
        while any(j.status in ("queued", "running") for j in jobs):
            if await request.is_disconnected():  # nobody waits for them any more
                for j in jobs:
                    await run_in_threadpool(ctx.jobs.cancel, j.version_id)
                return None
            if time.monotonic() > deadline:
                raise OpenAIError(
                    504,
                    f"not finished within {ctx.api.openai.sync_timeout_seconds:g} s; poll GET {poll} instead",
                    param=None,
                    code="timeout",
                    # The job goes on: the same request again would queue another one.
                    headers={"Location": poll, **NO_RETRY},
                )
            await asyncio.sleep(SYNC_POLL_S)
            jobs = [ctx.store.get(j.version_id) for j in jobs]
        return jobs

    def creating(idempotency_key: str | None, who: str):
        return lambda raw, uploads, digests: serving.create(
            serving.parse(raw), uploads, digests, idempotency_key, who
        )

    @router.get("/models", response_model=ModelList)
    def list_models() -> ModelList:
        return ModelList(data=serving.model_cards())

    @router.get("/models/{model}", response_model=ModelCard, responses=_ERRORS)
    def get_model(model: str) -> ModelCard:
        return serving.model(model)

    @router.post("/videos", response_model=Video, responses=_CREATE_ERRORS, openapi_extra=_CREATE_BODY)
    async def create_video(
        request: Request,
        idempotency_key: Annotated[str | None, Header(max_length=255)] = None,
        who: str = Depends(submitter),  # noqa: B008 - FastAPI resolves it per request
    ) -> Response:
        """Queue a video job (JSON or multipart, as the `openai` SDK sends it); poll it by id."""
        job = await accept(request, creating(idempotency_key, who))
        return video_response(view(job))

    @router.post(
        "/videos/generations", response_model=Video, responses=_CREATE_ERRORS, openapi_extra=_CREATE_BODY
    )
    async def create_video_alias(
        request: Request,
        idempotency_key: Annotated[str | None, Header(max_length=255)] = None,
        who: str = Depends(submitter),  # noqa: B008 - FastAPI resolves it per request
    ) -> Response:
        """Alias of `POST /v1/videos` for older FastVideo clients."""
        job = await accept(request, creating(idempotency_key, who))
        return video_response(view(job))

    @router.post(
        "/videos/sync",
        responses={
            200: {"content": {"video/mp4": {}}, "description": "The MP4."},
            504: {"model": ErrorBody, "description": "Not done in time: poll the named job instead."},
            **_CREATE_ERRORS,
        },
        openapi_extra=_CREATE_BODY,
    )
    async def create_video_sync(
        request: Request,
        idempotency_key: Annotated[str | None, Header(max_length=255)] = None,
        who: str = Depends(submitter),  # noqa: B008 - FastAPI resolves it per request
    ) -> Response:
        """Generate and answer with the MP4 itself; the server keeps no copy."""
        job = await accept(request, creating(idempotency_key, who))
        vid = f"video_{job.version_id}"
        settled = await settle(request, [job], f"/v1/videos/{vid}")
        if settled is None:
            return Response(status_code=499)
        job = settled[0]
        video = serving.video(job)
        if job.status != "succeeded":
            status = video.error.status if video.error else 500
            message = video.error.message if video.error else f"{vid} was {video.status}"
            raise OpenAIError(
                status, message, code=video.error.code if video.error else video.status, headers=NO_RETRY
            )
        path = serving.content_path(vid, "video")
        return FileResponse(
            path,
            media_type="video/mp4",
            headers=sync_headers(video),
            background=BackgroundTask(serving.remove, job),  # the file goes once it is sent
        )

    # Before the /videos/{video_id} routes, which would otherwise take "characters" for an id.
    @router.post(
        "/videos/characters",
        response_model=CharacterObject,
        responses={**_SOURCE_ERRORS, 404: {"model": ErrorBody, "description": "Unknown source video."}},
        openapi_extra=_CHARACTER_BODY,
    )
    async def create_character(
        request: Request,
        who: str = Depends(submitter),  # noqa: B008 - FastAPI resolves it per request
    ) -> CharacterObject:
        """A named character from a video (an MP4 file part, or `{"id"}` of a completed video): its
        representative frame and audio track, taken once; use it as `characters: [id]`."""
        return await with_body(request, lambda raw, up, dg: serving.create_character(raw, up, dg, who))

    @router.get("/videos/characters/{character_id}", response_model=CharacterObject, responses=_ERRORS)
    def get_character(character_id: str) -> CharacterObject:
        return serving.character(character_id)

    @router.post("/videos/edits", response_model=Video, responses=_SOURCE_ERRORS, openapi_extra=_EDIT_BODY)
    async def edit_video(
        request: Request,
        idempotency_key: Annotated[str | None, Header(max_length=255)] = None,
        who: str = Depends(submitter),  # noqa: B008 - FastAPI resolves it per request
    ) -> Response:
        """A video changed by a prompt: `video` is an MP4 file part or `{"id"}` of a completed video."""
        job = await accept(request, lambda raw, up, dg: serving.edit(raw, up, dg, idempotency_key, who))
        return video_response(view(job))

    @router.post(
        "/videos/extensions", response_model=Video, responses=_SOURCE_ERRORS, openapi_extra=_EDIT_BODY
    )
    async def extend_video(
        request: Request,
        idempotency_key: Annotated[str | None, Header(max_length=255)] = None,
        who: str = Depends(submitter),  # noqa: B008 - FastAPI resolves it per request
    ) -> Response:
        """A continuation of `video` (an MP4 file part or `{"id"}`), `seconds` long, stitched after
        it: the new video is the whole (its `seconds` the total)."""
        job = await accept(request, lambda raw, up, dg: serving.extend(raw, up, dg, idempotency_key, who))
        return video_response(view(job))

    @router.post(
        "/videos/{video_id}/remix", response_model=Video, responses=_SOURCE_ERRORS, openapi_extra=_CREATE_BODY
    )
    async def remix_video(
        video_id: str,
        request: Request,
        idempotency_key: Annotated[str | None, Header(max_length=255)] = None,
        who: str = Depends(submitter),  # noqa: B008 - FastAPI resolves it per request
    ) -> Response:
        """A completed video again with a new prompt (its size, length and seed unless given)."""
        job = await accept(
            request, lambda raw, up, dg: serving.remix(video_id, raw, up, dg, idempotency_key, who)
        )
        return video_response(view(job))

    # -- images -------------------------------------------------------------------------------
    async def images(request: Request, idempotency_key: str | None, who: str, edit: bool) -> Response:
        req, jobs = await with_body(
            request, lambda raw, up, dg: pictures.accept(raw, up, dg, idempotency_key, who, edit)
        )
        settled = await settle(request, jobs, f"/v1/images/{image_id(jobs[0].version_id)}/content")
        if settled is None:
            return Response(status_code=499)
        failed = next((j for j in settled if j.status != "succeeded"), None)
        if failed is not None:
            raise OpenAIError(
                500,
                failed.error or f"the generation {failed.status}",
                code="generation_failed",
                headers=NO_RETRY,
            )
        body = await run_in_threadpool(pictures.response, req, settled)
        return Response(body.model_dump_json(exclude_none=True), media_type="application/json")

    for path in ("/images", "/images/generations"):

        @router.post(path, response_model=ImagesResponse, responses=_IMAGE_ERRORS, openapi_extra=_IMAGE_BODY)
        async def generate_images(
            request: Request,
            idempotency_key: Annotated[str | None, Header(max_length=255)] = None,
            who: str = Depends(submitter),  # noqa: B008 - FastAPI resolves it per request
        ) -> Response:
            """`n` images (one-frame generations), answered when they are done."""
            return await images(request, idempotency_key, who, edit=False)

    @router.post(
        "/images/edits",
        response_model=ImagesResponse,
        responses=_IMAGE_ERRORS,
        openapi_extra=_IMAGE_EDIT_BODY,
    )
    async def edit_images(
        request: Request,
        idempotency_key: Annotated[str | None, Header(max_length=255)] = None,
        who: str = Depends(submitter),  # noqa: B008 - FastAPI resolves it per request
    ) -> Response:
        """Images from a prompt and reference images (`image` file parts)."""
        return await images(request, idempotency_key, who, edit=True)

    @router.get(
        "/images/{image_id}/content",
        response_class=FileResponse,
        responses={
            200: {"content": {"image/png": {}}, "description": "The PNG."},
            409: {"model": ErrorBody, "description": "not_ready"},
            **_ERRORS,
        },
    )
    def get_image(image_id: str) -> Response:
        return FileResponse(pictures.content(image_id), media_type="image/png", filename=f"{image_id}.png")

    @router.get("/videos", response_model=VideoList, responses=_ERRORS)
    def list_videos(
        after: Annotated[str | None, Query(description="A video id: the page starts after it.")] = None,
        limit: Annotated[int, Query(ge=1, le=100)] = 20,
        order: Literal["asc", "desc"] = "desc",
    ) -> VideoList:
        version = None
        if after is not None:
            version = version_of(after)
            if version is None:
                raise OpenAIError(404, f"no video {after!r}", param="after", code="not_found")
        try:
            jobs, more = ctx.store.list_jobs(
                "openai", after=version, limit=limit, order=order, finished_after=ctx.retention.cutoff()
            )
        except UnknownVersion:
            raise OpenAIError(404, f"no video {after!r}", param="after", code="not_found") from None
        data = [view(j) for j in jobs]
        return VideoList(
            data=data,
            first_id=data[0].id if data else None,
            last_id=data[-1].id if data else None,
            has_more=more,
        )

    # Pollers hit this hard: cached answers, served on the event loop (no threadpool hop) and,
    # with the caller's key checked, ahead of FastAPI's routing (api.polls).
    views = serving.views(VIEW_CACHE_SIZE)

    def video_answer(video_id: str) -> Response | None:
        version = version_of(video_id)
        got = views.get(version) if version else None
        if got is None:
            return None
        headers = {POLL_HEADER: str(serving.poll_after_ms(got.video))}
        if got.status >= 500:  # a failed video: its final state, which asking again cannot change
            headers.update(NO_RETRY)
        return Response(got.body, status_code=got.status, media_type="application/json", headers=headers)

    polls.add(f"{router.prefix}/videos/{{video_id}}", video_answer)

    @router.get(
        "/videos/{video_id}",
        response_model=Video,
        responses={
            **_ERRORS,
            500: {
                "model": Video,
                "description": "A failed video: the video object, its `error` saying why, with "
                "`x-should-retry: false` (the failure is final).",
            },
        },
    )
    async def get_video(video_id: str) -> Response:
        answer = video_answer(video_id)
        if answer is None:
            raise not_found(video_id)
        return answer

    @router.get("/videos/{video_id}/events", responses={**_ERRORS, **SSE_RESPONSES})
    async def video_events(video_id: str, request: Request) -> Response:
        """Server-Sent Events: the video object (as ``GET /v1/videos/{id}`` answers it) each time it
        changes, ``event: update`` until ``event: done``; reconnect with ``Last-Event-ID`` to resume."""
        version = version_of(video_id)
        if version is None or views.get(version) is None:
            raise not_found(video_id)

        def render() -> str | None:
            got = views.get(version)
            return got.body.decode() if got is not None else None

        return job_events(request, ctx.store, version, render)

    @router.get(
        "/videos/{video_id}/content",
        response_class=FileResponse,
        responses={
            200: {"content": {"video/mp4": {}, "image/png": {}}, "description": "The file."},
            409: {"model": ErrorBody, "description": "not_ready: the job has not completed."},
            **_ERRORS,
        },
    )
    def get_content(
        video_id: str, variant: Literal["video", "thumbnail", "spritesheet"] = "video"
    ) -> Response:
        path = serving.content_path(video_id, variant)
        media_type = "video/mp4" if variant == "video" else "image/png"
        return FileResponse(path, media_type=media_type, filename=f"{video_id}{path.suffix}")

    @router.delete("/videos/{video_id}", response_model=VideoDeleted, responses=_ERRORS)
    def delete_video(video_id: str) -> VideoDeleted:
        return serving.delete(video_id)

    return router
