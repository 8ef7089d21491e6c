"""The API's part of the server YAML (embedded as ``ServerConfig.api``): below both ``api`` and
``orchestration`` so that neither imports up.

Pure pydantic: no Dagster, no torch. Relative paths are resolved by the caller (the server config).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

MiB = 1024 * 1024


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class InputPolicy(_Strict):
    """What the input boundary accepts for image/audio/video resources (r2v spec "Input boundary")."""

    allowed_roots: list[Path] = Field(
        default_factory=list,
        description="Absolute local paths and file:// URLs are accepted only below these directories "
        "(after resolving symlinks). Empty: no local paths at all.",
    )
    fetch_urls: bool = Field(default=True, description="Fetch http(s) URLs; off: refuse them.")
    allow_private_addresses: bool = Field(
        default=False,
        description="Allow URLs whose host resolves to an address that is not globally routable "
        "(private, loopback, link-local, carrier-grade NAT 100.64.0.0/10, reserved, ...).",
    )
    max_bytes: int = Field(default=50 * MiB, gt=0, description="Largest accepted resource (decoded).")
    max_pixels: int = Field(default=4096 * 4096, gt=0, description="Largest accepted image (width x height).")
    # Measured on the tiny checkpoints: Wan VACE floors a reference image to the VAE's 8 px grid
    # (a side under 8 becomes 0 and PIL fails), LTX-2 fails on 1x1, and a frame taken from a video
    # becomes such a reference; a reference fitted inside the frame vanishes when its sides differ
    # more than the frame's side in pixels. 16: twice what breaks, one latent pixel of Wan 2.2's 16x VAE.
    min_side: int = Field(
        default=16,
        ge=1,
        description="Smallest accepted width and height of an image or video, in pixels: anything "
        "smaller cannot make a frame (refused with 400/422 naming the field, before anything is queued).",
    )
    max_aspect_ratio: float = Field(
        default=32.0,
        ge=1.0,
        description="Largest accepted ratio of an image's or video's longer side to its shorter one.",
    )
    fetch_timeout_seconds: float = Field(
        default=20.0,
        gt=0,
        description="Deadline of a whole http(s) fetch, however slowly the peer answers: host lookups, "
        "connects, TLS, headers and body of every redirect hop.",
    )
    max_video_seconds: float = Field(
        default=600.0,
        gt=0,
        description="Longest accepted video input (its frames and any audio track), in seconds, measured "
        "from its packets' timestamps and the container's durations; longer, or frames less than 1 a "
        "second on average: refused (400/422 naming the field) before anything is queued.",
    )
    max_audio_seconds: float = Field(
        default=600.0, gt=0, description="Longest accepted audio input, in seconds, measured the same way."
    )

    def resolved(self, base: Path) -> InputPolicy:
        """Relative ``allowed_roots`` made absolute against ``base`` (the input boundary ignores
        relative roots)."""
        roots = [r if r.is_absolute() else (Path(base) / r).resolve() for r in self.allowed_roots]
        return self.model_copy(update={"allowed_roots": roots})


class OpenAIConfig(_Strict):
    """The OpenAI-compatible dialect (``/v1``)."""

    served_model_name: str | None = Field(
        default=None, description="The public model id; default: the checkpoint folder's name."
    )
    default_work: str = Field(
        default="openai",
        min_length=1,
        description="The work (lineage, memory by shot_id, merges) /v1 videos belong to unless "
        "extra_params.work_id names another.",
    )
    max_seconds: float = Field(
        default=15.0, gt=0, description="Longest clip a request may ask for (/r2v's num_frames too)."
    )
    max_width: int = Field(default=1280, gt=0, description="Widest frame a request may ask for (/r2v too).")
    images_max_n: int = Field(
        default=4, ge=1, le=16, description="Most images one /v1/images request may ask for."
    )
    max_height: int = Field(default=1280, gt=0, description="Tallest frame a request may ask for (/r2v too).")
    default_request: dict[str, Any] = Field(
        default_factory=dict,
        description="Operator defaults for /v1/videos fields (same names as the request); a field the "
        "client sets wins, these win over the model's preset.",
    )
    unknown_fields: Literal["reject", "warn"] = Field(
        default="reject", description="Unknown top-level request fields: 400, or a logged warning."
    )
    sync_timeout_seconds: float = Field(
        default=600.0, gt=0, description="POST /v1/videos/sync answers 504 (naming the job) past this."
    )
    job_ttl_s: float = Field(
        default=86_400.0,
        gt=0,
        description="A finished /v1 job and its files read as 404 this long after it ends.",
    )
    store_max_bytes: int = Field(
        default=10 * 1024 * MiB,
        gt=0,
        description="Finished /v1 outputs past this are evicted, oldest first; uploads hold room in it.",
    )
    max_body_bytes: int = Field(
        default=256 * MiB, gt=0, description="Largest /v1 request body (413 before it is read)."
    )
    body_idle_timeout_s: float = Field(
        default=60.0, gt=0, description="A body that sends nothing for this long is 408 (its room freed)."
    )
    sweep_interval_s: float = Field(default=30.0, gt=0, description="How often expiry and eviction run.")


class SamplingLimits(_Strict):
    """What a request may ask of the sampler (``num_inference_steps``, ``guidance_scale``,
    ``step_cache``, both dialects). A ``native`` sampler takes any step count from 1 to
    ``max_steps``; a ``dmd`` one its own count only, whatever this says. Guidance: within
    ``guidance_scale`` and the model family's own range. Step caches: the model's presets (its
    ``performance.step_caches``) that ``step_caches`` lets through."""

    max_steps: int = Field(
        default=100,
        ge=1,
        le=10_000,
        description="Most denoising steps a request may ask of a native sampler.",
    )
    guidance_scale: tuple[float, float] = Field(
        default=(1.0, 20.0), description="[min, max] guidance_scale a request may ask for."
    )

    step_caches: list[str] | None = Field(
        default=None,
        description="The model's step cache presets (performance.step_caches) a request may ask for by "
        "name; None: every one it declares. 'none' and the model's default are always allowed.",
    )

    @field_validator("guidance_scale")
    @classmethod
    def _ordered(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not 0 <= v[0] <= v[1]:
            raise ValueError(f"must be [min, max] with 0 <= min <= max, got {list(v)}")
        return v


class AuthConfig(_Strict):
    """Optional API keys. When any key is set, every route but ``/health`` needs
    ``Authorization: Bearer <key>``; runs record the key's name (never the key) as their submitter."""

    keys_env: str = Field(
        default="SHOTLOOM_API_KEYS",
        description="Env var with comma-separated keys, each 'name:key' (or a bare key, named key-<n>).",
    )
    key_file: Path | None = Field(
        default=None, description="YAML mapping of key name -> key (relative: to the repository root)."
    )

    def resolved(self, base: Path) -> AuthConfig:
        if self.key_file is None or self.key_file.is_absolute():
            return self
        return self.model_copy(update={"key_file": (Path(base) / self.key_file).resolve()})


class ApiConfig(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(default=8221, ge=1, le=65535)
    public_url: str | None = Field(
        default=None, description="Base of status_url/video_url; default http://<host>:<port>."
    )
    database_url: str | None = Field(
        default=None, description="SQLAlchemy URL of the service store; default sqlite under the state dir."
    )
    max_body_bytes: int = Field(
        default=256 * MiB,
        gt=0,
        description="Largest request body outside /v1 (413; refused from its Content-Length before it "
        "is read). /v1 has its own, api.openai.max_body_bytes.",
    )
    body_idle_timeout_s: float = Field(
        default=60.0, gt=0, description="A body outside /v1 that sends nothing for this long is 408."
    )
    callback_max_attempts: int = Field(default=8, ge=0, description="0 = retry forever.")
    callback_backoff_seconds: float = Field(default=2.0, ge=0)
    callback_timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        description="The whole of one delivery attempt (connect, send, the receiver's answer): past it "
        "the attempt failed and is retried with backoff, however slowly the receiver trickles bytes.",
    )
    callback_concurrency: int = Field(
        default=16, ge=1, description="Deliveries in flight at once (per API process)."
    )
    callback_concurrency_per_host: int = Field(
        default=4,
        ge=1,
        description="Of those, at most this many to one receiver host: a receiver that hangs holds "
        "this many slots, never the others' callbacks.",
    )
    callback_secret_env: str = Field(
        default="SHOTLOOM_CALLBACK_SECRET",
        description="Env var holding a shared secret sent as X-Nanobot-Director-Secret (the Echo "
        "Director's channel refuses callbacks without it when its secret is set); unset: none.",
    )
    callback_secret_urls: list[str] = Field(
        default_factory=list,
        description="The receivers that get that secret, as URL prefixes (scheme, host and port equal, "
        "the path under the prefix's), e.g. the Director's http://127.0.0.1:18791/api/director/; a "
        "client names any callback URL, so the secret goes to no other.",
    )
    access_log: bool = Field(
        default=False,
        description="Log every request (uvicorn's access log). Off by default: under 50 pollers it was "
        "14% of the API process's CPU (bench/api.py); errors and the service's own events are logged.",
    )
    opentelemetry: bool = Field(
        default=False,
        description="FastAPI's own OpenTelemetry spans and metrics for every request, sent to the "
        "providers this process has configured (opentelemetry-sdk, OTEL_* variables). Off by default: "
        "FastAPI then looks for a configured provider at every request (5 us each, a tenth of a poll's "
        "own cost), and the service's figures are on GET /metrics.",
    )
    follow_interval_seconds: float = Field(
        default=0.5,
        gt=0,
        description="How often the API reads the status of unfinished runs (one GraphQL query for all, "
        "plus the new events of running ones): how fresh a running job's stage and progress are. A "
        "worker that ended a run tells the API, which then reads at once (else within this).",
    )
    workers_refresh_seconds: float = Field(
        default=1.0,
        gt=0,
        description="How often the API asks each worker for its /status (device, weights, resources "
        "shown on running jobs and /health); apart from the run follow, which is more frequent.",
    )
    media_task_timeout_seconds: float = Field(
        default=60.0,
        gt=0,
        description="How long a request waits for media work it needs at once (a character's or "
        "memory slot's frame and sound, taken on a media worker) before it answers 503.",
    )
    max_queue: int = Field(
        default=100, ge=1, description="Queued jobs (per kind) past which POST answers 503."
    )
    min_free_mb: int = Field(
        default=256,
        ge=0,
        description="Free space the media root's and the state directory's disks keep: below it, new "
        "work is refused (507, both dialects) and /health is 503 until space is freed (0: never).",
    )
    store_retry_after_seconds: int = Field(
        default=5,
        ge=1,
        description="Retry-After of the 503 a request gets while the service's database is away "
        "(PostgreSQL restarting or unreachable, SQLite's disk full): nothing was changed, try again.",
    )
    inputs: InputPolicy = Field(default_factory=InputPolicy)
    sampling: SamplingLimits = Field(default_factory=SamplingLimits)
    openai: OpenAIConfig = Field(default_factory=OpenAIConfig)
    auth: AuthConfig = Field(default_factory=AuthConfig)

    def base_url(self) -> str:
        """Public base URL without a trailing slash."""
        if self.public_url:
            return self.public_url.rstrip("/")
        return self.local_url()

    def local_url(self) -> str:
        """Where this host's processes reach the API (the workers tell it when a run ended)."""
        host = self.host
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    def resolved_database_url(self, state_dir: Path) -> str:
        """The configured URL, or ``sqlite:///<state_dir>/api/service.sqlite``."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(Path(state_dir) / 'api' / 'service.sqlite').as_posix()}"

    def assets_dir(self, state_dir: Path) -> Path:
        """Where accepted input resources are stored, content-addressed."""
        return Path(state_dir) / "api" / "inputs"
