"""What the API's tracker makes of a run it reads: the facts a job's views show come from the run,
whatever order the worker's last writes land in."""

from __future__ import annotations

import pytest

from api.background.tracker import Tracker
from api.dagster import RunInfo


class EventsSoFar:
    """The one gateway call the tracker makes for a run's live facts: the run's events, here the
    stages a worker stamped before Dagster recorded the run's end (its last stage not yet)."""

    def __init__(self, stamped: dict[str, float]):
        from contracts import events

        self.metadata = [events.event_metadata(events.StageEvent(stage=s, at=t)) for s, t in stamped.items()]

    def engine_events(self, run_id, cursor=None):
        from api.dagster import EngineEvent

        if cursor is not None:
            return [], cursor
        read = [EngineEvent(message="stage", metadata=m) for m in self.metadata]
        return read, "end"


def run(status: str, end_time: float | None) -> RunInfo:
    return RunInfo(
        run_id="r1",
        job_name="r2v",
        status=status,
        tags={},
        creation_time=100.0,
        start_time=101.0,
        end_time=end_time,
        update_time=end_time,
        root_run_id=None,
        parent_run_id=None,
    )


@pytest.mark.parametrize(("status", "stage"), [("SUCCESS", "succeeded"), ("FAILURE", "failed")])
def test_a_run_read_ended_before_its_worker_stamped_the_end_still_says_when_it_ended(status, stage):
    # Dagster records the end, then the worker stamps the last stage: a read between the two must
    # not leave the job without its end time for good (its follow-up runs' events are not read).
    gateway = EventsSoFar({"claimed": 101.0, "inferring": 102.0, "writing": 104.0})
    tracker = Tracker(None, gateway, None, None, None, None, boot=0.0)  # type: ignore[arg-type]
    live = tracker._live(run(status, end_time=105.0), job=None)  # type: ignore[arg-type]
    assert live["stage_times"] == {"claimed": 101.0, "inferring": 102.0, "writing": 104.0, stage: 105.0}


def test_the_workers_own_stamp_of_the_end_wins_over_dagsters():
    gateway = EventsSoFar({"claimed": 101.0, "succeeded": 104.5})
    tracker = Tracker(None, gateway, None, None, None, None, boot=0.0)  # type: ignore[arg-type]
    live = tracker._live(run("SUCCESS", end_time=105.0), job=None)  # type: ignore[arg-type]
    assert live["stage_times"] == {"claimed": 101.0, "succeeded": 104.5}
