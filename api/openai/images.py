"""``/v1/images``: one-frame generations through the same r2v runs (``num_frames: 1``), answered
when they are done with the PNG written beside every clip (its full-size still, taken from the
frames before any encoding).

A request for ``n`` images is ``n`` shots with consecutive seeds, in their own dialect
(``images``: kept out of ``/v1/videos``, bounded by the same job store). ``edits`` take the
uploaded images as reference images (memory), where the family takes references.
"""

from __future__ import annotations

import base64
import secrets
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from api.context import ApiContext
from api.core.limits import MAX_SEED
from api.core.records import JobRecord
from api.core.specs import InputRef, MemoryRef
from api.openai.errors import OpenAIError
from api.openai.protocol import (
    SIZE_PATTERN,
    LoraSelector,
    StepCacheName,
    VideoCreateRequest,
    _Strict,
)
from api.openai.serving import VideoServing, openai_errors

IMAGE_DIALECT = "images"
IMAGE_PREFIX = "img_"
# The fields of an image request that a one-frame video request takes as they are.
AS_VIDEO = {
    "prompt", "model", "size", "negative_prompt", "guidance_scale", "num_inference_steps", "step_cache",
    "lora",
}  # fmt: skip


class ImageRequest(_Strict):
    """``POST /v1/images`` / ``/v1/images/generations`` (JSON or form) and ``/v1/images/edits``
    (multipart, with ``image`` file parts)."""

    prompt: str = Field(min_length=1, max_length=20_000, pattern=r"\S")
    model: str | None = None
    n: int = Field(default=1, ge=1, description="Up to the server's images_max_n.")
    size: str | None = Field(default=None, pattern=SIZE_PATTERN, description='WxH, e.g. "64x64".')
    response_format: Literal["b64_json", "url"] = "b64_json"
    output_format: Literal["png"] = "png"
    seed: int | None = Field(default=None, ge=0, lt=MAX_SEED, description="The first image's; then +1 each.")
    negative_prompt: str | None = Field(default=None, max_length=20_000)
    guidance_scale: float | None = Field(default=None, ge=0, le=100)
    num_inference_steps: int | None = Field(
        default=None, gt=0, le=100_000, description="As on /v1/videos: within the model's limits."
    )
    step_cache: StepCacheName | None = Field(
        default=None, description='As on /v1/videos: a step cache preset this server offers, or "none".'
    )
    lora: LoraSelector | None = None
    user: str | None = Field(default=None, description="Accepted and not used.")

    @field_validator("n", "seed", "num_inference_steps", mode="before")
    @classmethod
    def _form_int(cls, v: Any) -> Any:
        return int(v) if isinstance(v, str) and v.strip().isdigit() else v


class ImageData(BaseModel):
    b64_json: str | None = None
    url: str | None = None
    revised_prompt: str | None = None


class ImagesResponse(BaseModel):
    created: int
    data: list[ImageData]
    size: str | None = None
    output_format: Literal["png"] = "png"


def image_id(version_id: str) -> str:
    return IMAGE_PREFIX + version_id


class ImageServing:
    def __init__(self, ctx: ApiContext, videos: VideoServing):
        self.ctx, self.videos = ctx, videos

    def accept(
        self,
        raw: dict[str, Any],
        uploads: dict[str, Path],
        digests: dict[str, str],
        idempotency_key: str | None,
        submitter: str | None,
        edit: bool,
    ) -> tuple[ImageRequest, list[JobRecord]]:
        """Queue the ``n`` one-frame shots a request asks for (all checked before any is queued)."""
        with openai_errors():
            req = ImageRequest.model_validate(raw)
        most = self.ctx.api.openai.images_max_n
        if req.n > most:
            raise OpenAIError(
                400, f"n: at most {most} images per request, got {req.n}", param="n", code="invalid_value"
            )
        references = self._references(uploads, edit)
        first = req.seed if req.seed is not None else secrets.randbelow(MAX_SEED - most)
        specs = []
        for i in range(req.n):
            fields = req.model_dump(
                include=AS_VIDEO,
                exclude_none=True,
            )
            video = VideoCreateRequest.model_validate(
                {**fields, "num_frames": 1, "seed": (first + i) % MAX_SEED}
            )
            key = f"{idempotency_key}:{i}" if idempotency_key else None
            spec = self.videos.spec(video, {}, {}, key, submitter)
            version = spec.version_id or ""
            client = {
                **spec.client,
                "n": req.n,
                "index": i,
                **{name: {"upload_sha256": d} for name, d in digests.items()},
            }
            specs.append(
                replace(
                    spec,
                    dialect=IMAGE_DIALECT,
                    shot_id=image_id(version),
                    job_id=f"images:{key}" if key else None,
                    memory=references,
                    memory_field="image",
                    client=client,
                    idempotency_payload={"kind": "image", **client},
                )
            )
        with openai_errors():
            self.ctx.jobs.check_queue("r2v", need=len(specs))  # all of them fit, or none is queued
            return req, [self.ctx.jobs.accept_shot(spec).job for spec in specs]

    def _references(self, uploads: dict[str, Path], edit: bool) -> tuple[MemoryRef, ...]:
        if not edit:
            if uploads:
                name = sorted(uploads)[0]
                raise OpenAIError(
                    400,
                    f"{name}: generations take no files (use /v1/images/edits)",
                    param=name,
                    code="invalid_value",
                )
            return ()
        if "mask" in uploads:
            raise OpenAIError(
                400,
                "mask: masked edits are not served; send the image alone",
                param="mask",
                code="invalid_value",
            )
        names = sorted(k for k in uploads if k == "image" or k.startswith("image["))
        if not names:
            raise OpenAIError(
                400, "image: required (one or more image file parts)", param="image", code="invalid_value"
            )
        unexpected = sorted(set(uploads) - set(names))
        if unexpected:
            raise OpenAIError(
                400, f"{unexpected[0]}: unexpected file part", param=unexpected[0], code="invalid_value"
            )
        return tuple(MemoryRef(n, image=InputRef(n, upload=uploads[n])) for n in names)

    def response(self, req: ImageRequest, jobs: list[JobRecord]) -> ImagesResponse:
        data = []
        for job in jobs:
            if req.response_format == "url":
                data.append(
                    ImageData(url=f"{self.ctx.api.base_url()}/v1/images/{image_id(job.version_id)}/content")
                )
            else:
                data.append(ImageData(b64_json=base64.b64encode(self.png(job).read_bytes()).decode()))
        width, height = self._size(jobs[0])
        return ImagesResponse(created=int(jobs[0].created_at), data=data, size=f"{width}x{height}")

    def png(self, job: JobRecord) -> Path:
        path = self.ctx.jobs.artifact_path(job.version_id, "image", "thumbnail")
        if path is None:
            raise OpenAIError(
                404,
                f"image {image_id(job.version_id)} has no file (anymore)",
                param="image_id",
                code="not_found",
            )
        return path

    def content(self, image: str) -> Path:
        version = image[len(IMAGE_PREFIX) :] if image.startswith(IMAGE_PREFIX) else None
        job = self.ctx.store.get(version) if version else None
        if job is None or job.dialect != IMAGE_DIALECT or self.ctx.retention.expired(job):
            raise OpenAIError(404, f"no image {image!r}", param="image_id", code="not_found")
        if job.status != "succeeded":
            raise OpenAIError(409, f"image {image} is {job.status}", param="image_id", code="not_ready")
        return self.png(job)

    @staticmethod
    def _size(job: JobRecord) -> tuple[int, int]:
        shot = job.request.shot
        return (shot.width or 0, shot.height or 0) if shot else (0, 0)
