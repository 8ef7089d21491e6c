"""Re-render schedules from the server YAML: Dagster schedules in the code location, one run of the
small ``rerender`` job per tick, keyed by the tick (Dagster's run_key and the API's idempotency key)."""

from __future__ import annotations

from datetime import UTC, datetime

from dagster import DefaultScheduleStatus, build_schedule_context

from orchestration.rerender import rerender, schedules_for
from orchestration.server_config import ServerConfig


def test_each_schedule_ticks_one_keyed_rerender_run(tmp_path):
    cfg = ServerConfig.model_validate(
        {
            "state_dir": str(tmp_path),
            "inference": {"config": "configs/inference.wan-tiny.yaml"},
            "workers": {"devices": [{"device": "cpu"}]},
            "rerender": [
                {"name": "nightly", "cron": "0 3 * * *", "works": ["film"], "seed": "new"},
                {"name": "weekly_all", "cron": "0 4 * * 1"},
            ],
        }
    )
    nightly, weekly = schedules_for(cfg)
    assert (nightly.name, nightly.cron_schedule, nightly.job_name) == ("nightly", "0 3 * * *", rerender.name)
    assert weekly.cron_schedule == "0 4 * * 1"
    assert nightly.default_status == DefaultScheduleStatus.RUNNING  # listed in the YAML: it runs
    tick = datetime(2026, 12, 4, 3, 0, tzinfo=UTC)
    [request] = nightly.evaluate_tick(build_schedule_context(scheduled_execution_time=tick)).run_requests
    config = request.run_config["ops"]["rerender_op"]["config"]
    assert request.run_key == config["key"] == "nightly:2026-12-04T03:00:00+00:00"
    assert (config["works"], config["shots"], config["seed"], config["priority"], config["reason"]) == (
        ["film"],
        None,
        "new",
        -10,
        "nightly",
    )
    # The same tick evaluated again (a daemon restart) asks for the same key: nothing twice.
    [again] = nightly.evaluate_tick(build_schedule_context(scheduled_execution_time=tick)).run_requests
    assert again.run_key == request.run_key
    assert schedules_for(None) == []
