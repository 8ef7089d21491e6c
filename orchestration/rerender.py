"""Scheduled and manual re-renders, through the API's intake (the service store keeps one writer,
and every re-render is a new version of its shot with callbacks and idempotency intact).

The ``rerender`` job is one small op that asks ``POST /queue/rerender`` for new versions of the
matching shots; it never touches a device (no gpu tag: the stock launcher runs it). Schedules
listed in the server YAML (``rerender``) run it on their cron, one run per tick (``run_key``: the
schedule and the tick's time; the same key is the API's idempotency key, so a tick never queues a
shot twice). An operator runs it from the Launchpad with the same config.
"""

import os

import httpx
from dagster import (
    Config,
    DefaultScheduleStatus,
    OpExecutionContext,
    RunRequest,
    ScheduleEvaluationContext,
    job,
    op,
    schedule,
)
from pydantic import Field

from orchestration.server_config import RerenderSchedule, ServerConfig

API_URL_ENV = "SHOTLOOM_API_URL"  # set by server.py for every process it starts
API_KEY_ENV = "SHOTLOOM_RERENDER_API_KEY"  # an API key for re-renders, when the API requires keys


class RerenderConfig(Config):
    works: list[str] | None = Field(default=None, description="Works to re-render (default: all).")
    shots: list[str] | None = Field(default=None, description="Shot ids (default: every shot).")
    seed: str = Field(default="keep", description="keep | new")
    priority: int = Field(default=-10, description="Below interactive requests (0).")
    reason: str = Field(default="launchpad", description="Tagged on the re-render runs.")
    key: str = Field(description="Idempotency key: the same key never queues a shot twice.")


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
    answer.raise_for_status()
    accepted = answer.json()["accepted"]
    for a in accepted:
        context.log.info(
            f"re-render of {a['work_id']}/{a['shot_id']} ({a['rerender_of']}): {a['version_id']}"
        )


@job(description="Re-render shots through the API (new versions, below interactive work).")
def rerender():
    rerender_op()


def schedules_for(cfg: ServerConfig | None) -> list:
    """One Dagster schedule per ``rerender`` entry of the server YAML."""
    return [_schedule(entry) for entry in (cfg.rerender if cfg is not None else [])]


def _schedule(entry: RerenderSchedule):
    @schedule(
        name=entry.name,
        cron_schedule=entry.cron,
        job=rerender,
        execution_timezone=entry.timezone,
        default_status=DefaultScheduleStatus.RUNNING,  # listed in the YAML: meant to run
    )
    def tick(context: ScheduleEvaluationContext) -> RunRequest:
        key = f"{entry.name}:{context.scheduled_execution_time.isoformat()}"
        config = {
            "works": entry.works,
            "shots": entry.shots,
            "seed": entry.seed,
            "priority": entry.priority,
            "reason": entry.name,
            "key": key,
        }
        return RunRequest(run_key=key, run_config={"ops": {"rerender_op": {"config": config}}})

    return tick
