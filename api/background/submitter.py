"""Submitting runs: every accepted job's first run, in accept order, and its follow-up runs (the
media work after a shot), each exactly once across restarts.

A submit that raised may have created the run anyway, and a process may die between submitting a
run and recording it: such a job is looked up by its version tag before anything is submitted
again, and a run found there is adopted.
"""

from __future__ import annotations

import logging
import threading
import time

from api.background.callbacks import Callbacks
from api.core.jobs import run_kind
from api.core.records import JobRecord
from api.dagster import DagsterGatewayError, DagsterUnavailable, Gateway, RunInfo, RunSubmission
from api.store import Store
from contracts import tags
from shotloom import stages

log = logging.getLogger("shotloom.api")
NEVER_ENQUEUED_AFTER_S = 10.0  # a NOT_STARTED run this old was created by a submit that was cut short
SUBMIT_REFUSALS = 3  # Dagster refusing a job's run this many times (while reachable) fails the job
SUBMIT_BATCH = 25  # runs per GraphQL document: a burst reaches the queue in few round trips


class LaunchInFlight(Exception):
    """A run of the step was created and is being enqueued: look again next tick."""


class Submitter:
    def __init__(
        self,
        store: Store,
        gateway: Gateway,
        callbacks: Callbacks,
        stopping: threading.Event,
        boot: float,
        more: threading.Event | None = None,
    ):
        self.store = store
        self.gateway = gateway
        self.callbacks = callbacks
        self.stopping = stopping
        self.more = more if more is not None else threading.Event()  # set: call again at once
        self.boot = boot  # when this process started: jobs accepted before it may have runs already
        self.counters = {"submitted": 0, "reconciled": 0}
        self._uncertain: set[str] = set()  # versions whose submit raised: a run may exist
        self._refused: dict[str, int] = {}  # version -> times Dagster refused its run

    # -- first runs -------------------------------------------------------------------------------
    def submit_pending(self) -> None:
        """Submit accepted jobs without a run, oldest first, a batch of one kind at a time (one
        GraphQL document each: a kind's runs enter Dagster's queue in accept order). Each call is
        one round: every kind with jobs waiting sends its oldest batch, so a merge accepted behind
        hundreds of shots waits for no batch of them, let alone all (each kind has its own queue
        in Dagster, so the order across kinds is nobody's FIFO). With more waiting, ``more`` wakes
        the loop for the next round at once, which reads the jobs again: one accepted meanwhile
        takes its turn there."""
        by_kind: dict[str, list[JobRecord]] = {}
        for job in self.store.unsubmitted(per_kind=SUBMIT_BATCH + 1):  # one more: is there more?
            by_kind.setdefault(job.kind, []).append(job)
        again = False
        # The kinds with the fewest waiting first (a merge or two before a batch of shots); their
        # order is nobody's FIFO, and a short queue's jobs then wait for no other kind's batch.
        for jobs in sorted(by_kind.values(), key=len):
            batch: list[tuple[JobRecord, RunSubmission]] = []
            for job in jobs[:SUBMIT_BATCH]:
                if self.stopping.is_set():
                    return
                submission = self._submission(job)
                if submission is not None:
                    batch.append((job, submission))
            self._submit_batch(batch)
            # At once again only after progress: a batch of runs still on their way into the queue
            # (looked at above) waits the loop's interval, not a busy loop of lookups.
            again = again or (len(jobs) > SUBMIT_BATCH and bool(batch))
        if again:
            self.more.set()

    def _submission(self, job: JobRecord) -> RunSubmission | None:
        """The run to submit for ``job``, or None when it needs none (now)."""
        # Accepted before this process started, or a submit that raised (it may have created
        # the run anyway): look for a run tagged with the version first, never submit twice.
        if job.created_at < self.boot or job.version_id in self._uncertain:
            existing = self.gateway.find_runs_by_tag(tags.VERSION_TAG, job.version_id)
            if not self._drop_never_enqueued(existing):
                return None  # a run may still be on its way into the queue: look again next tick
            existing = [r for r in existing if r.status != "NOT_STARTED"]
            roots = [r for r in existing if first_of_step(r, 0)]
            if roots:
                self.store.mark_submitted(job.version_id, roots[-1].run_id)
                self._uncertain.discard(job.version_id)
                self.counters["reconciled"] += 1
                log.info("version %s: adopted run %s", job.version_id, roots[-1].run_id)
                return None
        if job.cancel_requested_at is not None:  # cancelled before it reached Dagster
            self.store.update_status(
                job.version_id,
                status="cancelled",
                stage=stages.CANCELED,
                error=None,
                callback=self.callbacks.payload,
            )
            return None
        return RunSubmission(job.request.job_name, job.request.run_config, run_tags(job))

    def _submit_batch(self, batch: list[tuple[JobRecord, RunSubmission]]) -> None:
        if not batch:
            return
        self._uncertain.update(job.version_id for job, _ in batch)
        # DagsterUnavailable propagates: nothing submits now, the loop waits for the webserver.
        try:
            answers: list[str | DagsterGatewayError] = self.gateway.submit_many([s for _, s in batch])
        except DagsterUnavailable:
            raise
        except DagsterGatewayError as exc:
            if len(batch) > 1:  # the document as a whole was refused: find the culprit alone
                for one in batch:
                    self._submit_batch([one])
                return
            answers = [exc]
        for (job, _), answer in zip(batch, answers, strict=True):
            if isinstance(answer, DagsterUnavailable):  # its storage away: the job waits, not refused
                log.warning("version %s: not submitted yet: %s", job.version_id, answer)
                continue
            if isinstance(answer, DagsterGatewayError):
                self._refused_run(job, answer)
                continue
            self._refused.pop(job.version_id, None)
            self.store.mark_submitted(job.version_id, answer)
            self._uncertain.discard(job.version_id)
            self.counters["submitted"] += 1
            log.info("version %s: submitted run %s", job.version_id, answer)

    def _refused_run(self, job: JobRecord, exc: DagsterGatewayError) -> None:
        """Dagster answered and refused this run (its config, its job): the jobs behind it still
        go, and after a few refusals the job fails instead of waiting forever."""
        self._refused[job.version_id] = refusals = self._refused.get(job.version_id, 0) + 1
        log.warning("version %s: Dagster refused the run (%d): %s", job.version_id, refusals, exc)
        if refusals >= SUBMIT_REFUSALS:
            self.store.update_status(
                job.version_id,
                status="failed",
                stage=stages.FAILED,
                error=f"Dagster refused the run: {exc}",
                callback=self.callbacks.payload,
            )
            self._refused.pop(job.version_id, None)

    def _drop_never_enqueued(self, runs: list[RunInfo]) -> bool:
        """A submit cut short (webserver or API killed mid-request) can leave a run created but never
        enqueued: NOT_STARTED forever (monitoring fails it only after its start timeout). Such a run
        is canceled and the job submitted anew. False while one is too young to tell."""
        now = time.time()
        stuck = [r for r in runs if r.status == "NOT_STARTED"]
        if any(now - (r.create_time or now) < NEVER_ENQUEUED_AFTER_S for r in stuck):
            return False
        for r in stuck:
            try:
                self.gateway.terminate(r.run_id, force=True, wait_starting_s=0)
            except Exception as exc:  # it times out on its own; the job goes on with a new run
                log.warning("could not cancel never-enqueued run %s: %s", r.run_id, exc)
            log.info("run %s was created but never enqueued; canceled", r.run_id)
        return True

    # -- follow-up runs ---------------------------------------------------------------------------
    def submitted_follow_up(self, job: JobRecord, step: int, previous_ended_at: float) -> str | None:
        """The run of ``job``'s ``step``-th follow-up an earlier process (or a submit that raised)
        already submitted, if any (the run before it ended at ``previous_ended_at``)."""
        if previous_ended_at >= self.boot and job.version_id not in self._uncertain:
            return None  # this process saw the step before end, and submitted nothing for it
        runs = [
            r
            for r in self.gateway.find_runs_by_tag(tags.VERSION_TAG, job.version_id)
            if first_of_step(r, step)
        ]
        if not self._drop_never_enqueued(runs):
            raise LaunchInFlight(f"version {job.version_id}: a run of step {step} is being submitted")
        runs = [r for r in runs if r.status != "NOT_STARTED"]
        return runs[-1].run_id if runs else None  # the oldest: a later one was canceled unrun

    def submit_follow_up(self, job: JobRecord, step: int, job_name: str, run_config: dict) -> str | None:
        """Submit ``job``'s ``step``-th follow-up; None when Dagster refused it (counted as above)."""
        self._uncertain.add(job.version_id)  # until its run is recorded: look before resubmitting
        try:
            return self.gateway.submit(job_name, run_config, run_tags(job, step))
        except DagsterUnavailable:
            raise
        except DagsterGatewayError as exc:
            self._refused_run(job, exc)
            return None

    def recorded(self, version_id: str) -> None:
        """The job's newest run is in the store: a restart finds it there, no lookup needed."""
        self._uncertain.discard(version_id)


def run_tags(job: JobRecord, step: int = 0) -> dict[str, str]:
    """The tags every run of ``job`` carries (its ``step``-th follow-up: that too)."""
    rerender = job.request.rerender
    return tags.run_tags(
        version_id=job.version_id,
        work_id=job.work_id,
        kind=run_kind(job),
        submitter=job.submitter,
        shot_id=job.shot_id,
        priority=job.priority,
        rerender_reason=rerender.reason if rerender is not None else None,
        step=step,
    )


def first_of_step(run: RunInfo, step: int) -> bool:
    """The run a step started with (not a retry of it, not a second submission canceled unrun)."""
    return tags.starts_step(run.tags, run.root_run_id, run.run_id, step)
