"""Re-render schedules from the server YAML: Dagster schedules in the code location, one run of the
small ``rerender`` job per tick, keyed by the tick (Dagster's run_key and the API's idempotency key)."""

from __future__ import annotations

from datetime import UTC, datetime

from dagster import DefaultScheduleStatus, build_schedule_context, validate_run_config

from orchestration.rerender import rerender, schedules_for
from settings.server import ServerConfig


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
    nightly, weekly, *offered = schedules_for(cfg)
    assert (nightly.name, nightly.cron_schedule, nightly.job_name) == ("nightly", "0 3 * * *", rerender.name)
    assert weekly.cron_schedule == "0 4 * * 1"
    assert nightly.default_status == DefaultScheduleStatus.RUNNING  # listed in the YAML: it runs
    # The offered ones the YAML does not list are defined stopped: the UI's Automation page shows
    # them and an operator switches one on there (tests/test_api_http.py does, over GraphQL).
    assert {(o.name, o.default_status) for o in offered} == {
        ("rerender_nightly", DefaultScheduleStatus.STOPPED),
        ("rerender_weekly", DefaultScheduleStatus.STOPPED),
    }
    assert [o.job_name for o in offered] == [rerender.name] * 2
    tick = datetime(2026, 12, 4, 3, 0, tzinfo=UTC)
    [request] = nightly.evaluate_tick(build_schedule_context(scheduled_execution_time=tick)).run_requests
    config = request.run_config["ops"]["rerender_op"]["config"]
    assert request.run_key == config["key"] == "nightly:2026-12-04T03:00:00+00:00"
    assert config["requested_by"] == "schedule:nightly"  # the re-render runs' "launched by"
    assert validate_run_config(rerender, request.run_config)  # what the daemon will launch
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
    # One the YAML lists by an offered one's name is that one, running; `dagster dev` alone (no
    # server YAML) still offers them, stopped.
    listed = ServerConfig.model_validate(
        {**cfg.model_dump(), "rerender": [{"name": "rerender_weekly", "cron": "5 4 * * *"}]}
    )
    assert {(s.name, s.cron_schedule, s.default_status) for s in schedules_for(listed)} == {
        ("rerender_weekly", "5 4 * * *", DefaultScheduleStatus.RUNNING),
        ("rerender_nightly", "0 3 * * *", DefaultScheduleStatus.STOPPED),
    }
    assert {s.default_status for s in schedules_for(None)} == {DefaultScheduleStatus.STOPPED}


def test_the_checkpoint_sensor_rerenders_shots_made_with_another_checkpoint(tmp_path):
    from dagster import AssetMaterialization, DagsterInstance, DefaultSensorStatus, build_sensor_context

    from ops.assets import SHOT_KEY, register_shot_partition
    from orchestration.rerender import CHECKPOINT_SENSOR, checkpoint_sensor, sensors_for

    with DagsterInstance.ephemeral() as instance:
        for work, shot, made in (
            ("film", "s1", "wan:old"),
            ("film", "s2", "wan:new"),
            ("ad", "a1", "wan:old"),
        ):
            partition = register_shot_partition(instance, work, shot)
            meta = {"work_id": work, "shot_id": shot, "checkpoint": made}
            instance.report_runless_asset_event(
                AssetMaterialization(SHOT_KEY, partition=partition, metadata=meta)
            )
        # s2 made again with the old one, then with the new one: its newest is current.
        partition = register_shot_partition(instance, "film", "s2")
        for made in ("wan:old", "wan:new"):
            meta = {"work_id": "film", "shot_id": "s2", "checkpoint": made}
            instance.report_runless_asset_event(
                AssetMaterialization(SHOT_KEY, partition=partition, metadata=meta)
            )

        sensor = checkpoint_sensor("wan:new", priority=-20)
        assert sensor.name == CHECKPOINT_SENSOR

        def ask() -> dict:
            requests = sensor.evaluate_tick(build_sensor_context(instance=instance)).run_requests
            return {r.run_config["ops"]["rerender_op"]["config"]["works"][0]: r for r in requests}

        first = ask()
        assert set(first) == {"ad", "film"}
        film = first["film"].run_config["ops"]["rerender_op"]["config"]
        assert first["film"].run_key == film["key"] and film["key"].startswith("checkpoint:wan:new:film:")
        assert (film["works"], film["shots"], film["priority"], film["reason"]) == (
            ["film"],
            ["s1"],
            -20,
            "new-checkpoint",
        )
        # The same stale shots ask with the same key (Dagster launches a run key once); a shot of
        # the work that goes stale later asks anew.
        assert {w: r.run_key for w, r in ask().items()} == {w: r.run_key for w, r in first.items()}
        partition = register_shot_partition(instance, "film", "s3")
        meta = {"work_id": "film", "shot_id": "s3", "checkpoint": "wan:old", "version_id": "v-s3"}
        instance.report_runless_asset_event(
            AssetMaterialization(SHOT_KEY, partition=partition, metadata=meta)
        )
        later = ask()
        assert later["film"].run_key != first["film"].run_key and later["ad"].run_key == first["ad"].run_key
        assert later["film"].run_config["ops"]["rerender_op"]["config"]["shots"] == ["s1", "s3"]

    base = {
        "state_dir": str(tmp_path),
        "inference": {"config": "configs/inference.wan-tiny.yaml"},
        "workers": {"devices": [{"device": "cpu"}]},
    }
    # Defined stopped unless configured (the UI switches it on); running when the YAML asks.
    [stopped] = sensors_for(ServerConfig.model_validate(base), "wan:new")
    assert (stopped.name, stopped.default_status) == (CHECKPOINT_SENSOR, DefaultSensorStatus.STOPPED)
    on = ServerConfig.model_validate({**base, "rerender_on_checkpoint_change": True, "rerender_priority": -7})
    [sensor] = sensors_for(on, "wan:new")
    assert (sensor.name, sensor.default_status) == (CHECKPOINT_SENSOR, DefaultSensorStatus.RUNNING)
    assert sensors_for(None, "wan:new") == []  # `dagster dev` alone: no loaded checkpoint to compare


def test_a_tick_that_meets_a_full_queue_asks_again_when_the_api_says(monkeypatch):
    """The API answers a full queue 429 with Retry-After: the tick's op waits that long and asks
    again with the same key (a Dagster op retry), rather than failing the run."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    import pytest
    from dagster import RetryRequested, build_op_context

    from orchestration.rerender import API_URL_ENV, RerenderConfig, rerender_op

    asked: list[dict] = []

    class Full(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's naming
            asked.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            body = json.dumps({"error": "the r2v queue is full (1 queued, limit 1)"}).encode()
            self.send_response(429)
            self.send_header("Retry-After", "7")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Full)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv(API_URL_ENV, f"http://127.0.0.1:{server.server_port}")
    try:
        with pytest.raises(RetryRequested) as retry:
            rerender_op(build_op_context(), RerenderConfig(works=["w"], key="nightly:2026-12-06"))
    finally:
        server.shutdown()
    assert retry.value.seconds_to_wait == 7 and retry.value.max_retries > 0
    assert asked == [{**asked[0], "works": ["w"], "key": "nightly:2026-12-06"}]
