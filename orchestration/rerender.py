"""Scheduled and manual re-renders, through the API's intake (the service store keeps one writer,
and every re-render is a new version of its shot with callbacks and idempotency intact).

The ``rerender`` job is one small op that asks ``POST /queue/rerender`` for new versions of the
matching shots; it never touches a device (no gpu tag: the stock launcher runs it). Schedules
listed in the server YAML (``rerender``) run it on their cron, one run per tick (``run_key``: the
schedule and the tick's time; the same key is the API's idempotency key, so a tick never queues a
shot twice). An operator runs it from the Launchpad with the same config.
"""

import hashlib
import os

import httpx
from dagster import (
    Config,
    DefaultScheduleStatus,
    DefaultSensorStatus,
    OpExecutionContext,
    RetryRequested,
    RunRequest,
    ScheduleEvaluationContext,
    SensorEvaluationContext,
    job,
    op,
    schedule,
    sensor,
)
from pydantic import Field

from contracts.environment import API_URL_ENV
from ops.assets import SHOT_KEY
from settings.server import RerenderSchedule, ServerConfig, offered_rerenders

API_KEY_ENV = "SHOTLOOM_RERENDER_API_KEY"  # an API key for re-renders, when the API requires keys


class RerenderConfig(Config):
    works: list[str] | None = Field(default=None, description="Works to re-render (default: all).")
    shots: list[str] | None = Field(default=None, description="Shot ids (default: every shot).")
    match: dict[str, str] | None = Field(
        default=None, description="Only shots whose runs carry these tags (shotloom/kind, user)."
    )
    seed: str = Field(default="keep", description="keep | new")
    priority: int = Field(default=-10, description="Below interactive requests (0).")
    reason: str = Field(default="launchpad", description="Tagged on the re-render runs.")
    key: str = Field(description="Idempotency key: the same key never queues a shot twice.")
    requested_by: str = Field(default="launchpad", description='The runs\' "launched by".')


FULL_QUEUE_RETRIES = 30  # a full queue drains in minutes; a tick that cannot get in gives up then
FULL_QUEUE_WAIT_S = 60  # when the API gives no Retry-After


@op
def rerender_op(context: OpExecutionContext, config: RerenderConfig) -> None:
    """Ask the API for the re-renders (each new version is logged on this run). No output: the
    runs it queues are the API's, followed there."""
    url = os.environ.get(API_URL_ENV)
    if not url:
        raise RuntimeError(f"{API_URL_ENV} is not set: start the service with server.py")
    key = os.environ.get(API_KEY_ENV)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    answer = httpx.post(f"{url}/queue/rerender", json=config.model_dump(), headers=headers, timeout=60)
    if answer.status_code == 429:
        # The r2v queue is full: ask again when the API says (the same key queues nothing twice,
        # so the shots already queued by this tick stay as they are).
        wait = int(answer.headers.get("Retry-After", FULL_QUEUE_WAIT_S))
        context.log.info(f"the queue is full; asking again in {wait} s: {answer.json().get('error')}")
        raise RetryRequested(max_retries=FULL_QUEUE_RETRIES, seconds_to_wait=wait)
    answer.raise_for_status()
    accepted = answer.json()["accepted"]
    for a in accepted:
        context.log.info(
            f"re-render of {a['work_id']}/{a['shot_id']} ({a['rerender_of']}): {a['version_id']}"
        )


@job(description="Re-render shots through the API (new versions, below interactive work).")
def rerender():
    rerender_op()


CHECKPOINT_SENSOR = "rerender_on_new_checkpoint"


def checkpoint_id(family: str, checkpoint: str) -> str:
    """How a shot's materialization names its checkpoint (``ModelRuntime.checkpoint_id``)."""
    return f"{family}:{checkpoint.rstrip('/').rsplit('/', 1)[-1]}"


def _value(v):
    return getattr(v, "value", v)  # a MetadataValue, or a plain value


def stale_shots(instance, loaded: str, limit: int = 10_000) -> dict[str, dict[str, str]]:
    """{work: {shot: version}} of the shots whose newest materialization was made with another
    checkpoint (the version is the service version that materialization is)."""
    newest: dict[str, tuple[str, str, str, str]] = {}
    for record in instance.fetch_materializations(SHOT_KEY, limit=limit).records:  # newest first
        mat = record.asset_materialization
        if mat is None or mat.partition is None or mat.partition in newest:
            continue
        meta = mat.metadata
        newest[mat.partition] = tuple(
            _value(meta.get(k)) or "" for k in ("work_id", "shot_id", "checkpoint", "version_id")
        )
    out: dict[str, dict[str, str]] = {}
    for work, shot, made, version in newest.values():
        if made and made != loaded and work and shot:
            out.setdefault(work, {})[shot] = version
    return {w: dict(sorted(s.items())) for w, s in sorted(out.items())}


def checkpoint_sensor(
    loaded: str,
    priority: int,
    interval_s: int = 60,
    status: DefaultSensorStatus = DefaultSensorStatus.RUNNING,
):
    """Re-render the shots made with another checkpoint than the loaded one, through the same job
    as the schedules. Evaluated in the code server. The run key names the work, the checkpoint and
    the stale shots' versions: a shot that goes stale later asks again, while a re-render that
    failed (its shot still stale at the same version) is not asked over and over."""

    @sensor(
        name=CHECKPOINT_SENSOR,
        job=rerender,
        minimum_interval_seconds=interval_s,
        default_status=status,
    )
    def on_new_checkpoint(context: SensorEvaluationContext):
        for work, shots in stale_shots(context.instance, loaded).items():
            made = ",".join(f"{shot}={version}" for shot, version in shots.items())
            key = f"checkpoint:{loaded}:{work}:{hashlib.sha256(made.encode()).hexdigest()[:16]}"
            config = {
                "works": [work],
                "shots": list(shots),
                "seed": "keep",
                "priority": priority,
                "reason": "new-checkpoint",
                "key": key,
                "requested_by": f"sensor:{CHECKPOINT_SENSOR}",
            }
            yield RunRequest(run_key=key, run_config={"ops": {"rerender_op": {"config": config}}})

    return on_new_checkpoint


def sensors_for(cfg: ServerConfig | None, loaded: str | None) -> list:
    """The checkpoint sensor, running when the server YAML asks for it, else defined stopped (the
    UI's Automation page lists it; an operator switches it on there). None without the checkpoint
    the workers load (``dagster dev`` alone)."""
    if cfg is None or loaded is None:
        return []
    status = DefaultSensorStatus.RUNNING if cfg.rerender_on_checkpoint_change else DefaultSensorStatus.STOPPED
    return [checkpoint_sensor(loaded, cfg.rerender_priority, cfg.rerender_sensor_interval_s, status)]


def schedules_for(cfg: ServerConfig | None) -> list:
    """One Dagster schedule per ``rerender`` entry of the server YAML (running), and one per offered
    schedule it does not name (stopped: the UI's Automation page switches it on)."""
    listed = cfg.rerender if cfg is not None else []
    offered = cfg.rerender_offered if cfg is not None else offered_rerenders()
    names = {entry.name for entry in listed}
    return [
        *(_schedule(entry, DefaultScheduleStatus.RUNNING) for entry in listed),
        *(_schedule(entry, DefaultScheduleStatus.STOPPED) for entry in offered if entry.name not in names),
    ]


def _schedule(entry: RerenderSchedule, status: DefaultScheduleStatus):
    @schedule(
        name=entry.name,
        cron_schedule=entry.cron,
        job=rerender,
        execution_timezone=entry.timezone,
        default_status=status,
    )
    def tick(context: ScheduleEvaluationContext) -> RunRequest:
        key = f"{entry.name}:{context.scheduled_execution_time.isoformat()}"
        config = {
            "works": entry.works,
            "shots": entry.shots,
            "match": entry.match,
            "seed": entry.seed,
            "priority": entry.priority,
            "reason": entry.name,
            "key": key,
            "requested_by": f"schedule:{entry.name}",
        }
        return RunRequest(run_key=key, run_config={"ops": {"rerender_op": {"config": config}}})

    return tick
