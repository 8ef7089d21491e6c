"""The records the store answers with (frozen: no ORM object escapes a session), and a job's
record typed: what it asked for (:class:`JobRequest`), what it made (:class:`JobResult`)
and what its runs report while they go (:class:`JobLive`).

They are the store's three JSON columns. The on-disk shape does not change, so every row an
earlier release wrote still reads: a record keeps what it does not know (``extra="allow"``), and
what an earlier release wrote differently is read in a property, never rewritten. A record also
reads like the JSON it is stored as (``record["key"]``, ``.get``, ``==`` a dict), for the code
and tests written against the rows.

URLs are built when a view is rendered (:meth:`JobResult.video_url`), never stored: the result
keeps the video's place under the media root.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from contracts.runs import MERGE_OP, SHOT_OP, STITCH_OP, MergeConfig, ShotConfig, StitchConfig
from shotloom.media_store import url_path

MEDIA_PREFIX = "/media/"  # where the API serves the media root


def media_url_path(relative: str) -> str:
    """The URL path of a file under the media root (:func:`shotloom.media_store.url_path`)."""
    return MEDIA_PREFIX + url_path(relative)


class _JsonRecord(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)

    def as_json(self) -> dict[str, Any]:
        """The record as stored: only what was written, under its stored keys."""
        return self.model_dump(mode="json", exclude_unset=True)

    def __getitem__(self, key: str) -> Any:
        return self.as_json()[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.as_json().get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self.as_json()

    def __iter__(self) -> Iterator[str]:  # type: ignore[override]  # a Mapping's iteration: its keys
        return iter(self.as_json())

    def items(self):
        return self.as_json().items()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return self.as_json() == dict(other)
        if isinstance(other, _JsonRecord):
            return type(self) is type(other) and self.as_json() == other.as_json()
        return NotImplemented

    def __hash__(self) -> int:
        return hash(repr(self.as_json()))

    @classmethod
    def coerce(cls, value: Any) -> Any:
        """``value`` as this record (None stays None; a record is kept as it is)."""
        if value is None or isinstance(value, cls):
            return value
        return cls.model_validate(dict(value))


C = TypeVar("C", bound=BaseModel)


def _read(config_type: type[C], config: dict[str, Any] | None) -> C | None:
    """An op's stored config, typed. A row an earlier release wrote (or one made by hand) may lack
    what the op requires now: it is read as stored rather than refused."""
    if config is None:
        return None
    try:
        return config_type.model_validate(config)
    except ValidationError:
        return config_type.model_construct(**config)


def stored(value: _JsonRecord | Mapping[str, Any] | None) -> dict[str, Any] | None:
    """What goes into the JSON column for ``value`` (a record as it is stored, a dict as given)."""
    if value is None:
        return None
    return value.as_json() if isinstance(value, _JsonRecord) else dict(value)


class FollowUp(_JsonRecord):
    """A run after the job's first one (media work on the shot it wrote): its job and op, the op's
    config so far, and which of the shot's facts complete it (see :mod:`api.core.steps`)."""

    job_name: str
    op: str
    config: dict[str, Any] = Field(default_factory=dict)
    from_shot: dict[str, str] = Field(default_factory=dict)  # config field <- the shot's fact
    append_shot: dict[str, str] = Field(default_factory=dict)  # config list field += the shot's fact


class Rerender(_JsonRecord):
    of: str  # the version re-rendered
    reason: str = ""
    seed: str | int | None = None  # "same" | "new" as asked


class Extension(_JsonRecord):
    before_frames: int = 0  # frames of the video it continues


class JobRequest(_JsonRecord):
    """What a job asked for, as accepted: the client's own fields (``client``), the inputs as stored
    (``inputs``), the first run (``job_name``, ``run_config``: what Dagster gets) and the runs after
    it (``then``)."""

    client: dict[str, Any] = Field(default_factory=dict)
    inputs: dict[str, Any] = Field(default_factory=dict)
    job_name: str = ""
    run_config: dict[str, Any] = Field(default_factory=dict)
    then: list[FollowUp] | None = None  # None: a job of a release before follow-up runs
    extension: Extension | None = None
    rerender: Rerender | None = None

    def op_config(self, op: str) -> dict[str, Any] | None:
        """One op's config in the run config, as stored (None: the job runs no such op)."""
        found = (self.run_config.get("ops") or {}).get(op)
        return None if found is None else dict(found.get("config") or {})

    @property
    def shot(self) -> ShotConfig | None:
        """The shot it asked for (None for a merge), typed."""
        return _read(ShotConfig, self.op_config(SHOT_OP))

    @property
    def merge(self) -> MergeConfig | None:
        return _read(MergeConfig, self.op_config(MERGE_OP))

    @property
    def stitch(self) -> StitchConfig | None:
        """The stitch of an extension accepted by an earlier release (one run with a stitch op)."""
        return _read(StitchConfig, self.op_config(STITCH_OP))


class JobResult(_JsonRecord):
    """What a finished job made: its run, its main video (place under the media root, artifact)
    and the facts of that video (the shot's materialization: size, frames, how it was sampled)."""

    run_id: str | None = None
    artifact_id: str | None = None
    video_path: str | None = None  # under the media root
    width: int | None = None
    height: int | None = None
    frames: int | None = None
    fps: float | int | None = None
    duration_s: float | int | None = None
    has_audio: bool | None = None
    seed: int | None = None
    video_mode: str | None = None
    peak_memory_mb: float | int | None = None
    num_inference_steps: int | None = None
    guidance_scale: float | int | None = None
    sampler: dict[str, Any] | None = None
    step_cache: str | None = None

    @property
    def media_path(self) -> str | None:
        """The main video under the media root. A release before this one stored its URL, the base
        URL baked in: the path is what follows ``/media/`` there."""
        if self.video_path is not None:
            return self.video_path
        legacy = (self.model_extra or {}).get("video_url")
        if isinstance(legacy, str) and MEDIA_PREFIX in legacy:
            return legacy.split(MEDIA_PREFIX, 1)[1]  # built unencoded then
        return None

    def video_url(self, base: str) -> str | None:
        """The main video's URL under ``base`` (the URL the API is reached at now)."""
        path = self.media_path
        return None if path is None else base + media_url_path(path)

    def rendered(self, base: str) -> dict[str, Any]:
        """The result as a client reads it: the video's URL under ``base``, not its place."""
        shown = {k: v for k, v in self.as_json().items() if k != "video_path"}
        if self.media_path is not None:
            shown["video_url"] = self.video_url(base)
        return shown


class JobLive(_JsonRecord):
    """What a job's runs reported so far, as the tracker last read it from Dagster (kept so a
    restarted API answers the same): the run's status, when it entered each stage, its progress,
    the worker running it and the runs before the current one."""

    run_status: str | None = None
    stage_times: dict[str, float] = Field(default_factory=dict)
    # {"stage", "done", "total"} (contracts.events.Progress); a bare fraction in early releases.
    progress: dict[str, Any] | float | None = None
    worker: dict[str, Any] | None = None
    runs: list[str] = Field(default_factory=list)  # earlier runs of the job (follow-ups came after)

    @property
    def first_run(self) -> str | None:
        return self.runs[0] if self.runs else None


class UnknownVersion(KeyError):
    """No job with this version id (HTTP 404)."""


@dataclass(frozen=True)
class JobRecord:
    version_id: str
    kind: str
    work_id: str
    shot_id: str | None
    job_id: str | None
    payload_hash: str
    request: JobRequest  # typed; a dict given here is read as one
    callback_url: str | None
    callback_context: dict[str, Any] | None
    status: str
    stage: str
    error: str | None
    run_id: str | None
    root_run_id: str | None
    submitted_at: float | None
    created_at: float
    updated_at: float
    finished_at: float | None
    result: JobResult | None
    live: JobLive | None = None
    dialect: str = "r2v"
    submitter: str | None = None
    cancel_requested_at: float | None = None
    priority: int = 0

    def __post_init__(self) -> None:
        # The JSON columns as typed records, however the record was made (a row, dataclasses.replace).
        object.__setattr__(self, "request", JobRequest.coerce(self.request))
        object.__setattr__(self, "result", JobResult.coerce(self.result))
        object.__setattr__(self, "live", JobLive.coerce(self.live))


@dataclass(frozen=True)
class ArtifactRecord:
    artifact_id: str
    version_id: str
    work_id: str
    shot_id: str | None
    kind: str
    role: str
    path: str
    url_path: str
    bytes: int | None
    sha256: str | None
    created_at: float
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class InputAssetRecord:
    sha256: str
    path: str
    media_type: str
    bytes: int
    created_at: float


@dataclass(frozen=True)
class CharacterRecord:
    character_id: str
    name: str
    image: InputAssetRecord
    audio: InputAssetRecord | None
    source: dict[str, Any]
    submitter: str | None
    created_at: float
