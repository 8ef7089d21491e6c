"""A job after it was accepted: read, cancel, reprioritize, delete."""

from __future__ import annotations

from api.core.errors import Conflict, NotFound
from api.core.records import JobRecord, UnknownVersion
from api.core.shared import SharedSteps
from api.store import FINISHED


class Lifecycle(SharedSteps):
    def get(self, version_id: str) -> JobRecord:
        job = self.store.get(version_id)
        if job is None:
            raise NotFound(f"unknown job {version_id!r}")
        return job

    def cancel(self, version_id: str) -> JobRecord:
        """Stop a queued or running job. A queued one is cancelled at once (its run canceled in
        Dagster); a running one stops at its next denoise step or decoded piece, and the follower
        records ``cancelled`` when its run reports CANCELED. A finished job is returned as is."""
        job = self.get(version_id)
        if job.status in FINISHED:
            return job
        job = self.store.request_cancel(version_id)
        if job.run_id is None:  # never handed to Dagster: the submitter skips it from now on
            return self._cancelled(version_id)
        stopped = False
        if self.terminate is not None:
            try:
                stopped = self.terminate(job.run_id)
            except Exception:  # the follower asks again: cancel requests are durable
                stopped = False
        fresh = self.get(version_id)
        if stopped and fresh.status == "queued" and fresh.stage == "queued":
            # Dagster cancels a queued run on the spot: it never reached a worker.
            return self._cancelled(version_id)
        return fresh

    def _cancelled(self, version_id: str) -> JobRecord:
        """Record a queued job cancelled, its callback queued with it (the client hears of it as
        of any other end: the tracker will see nothing more of a job that never ran)."""
        return self.store.update_status(
            version_id, status="cancelled", stage="canceled", error=None, callback=self.callback_payload
        )

    def set_priority(self, version_id: str, priority: int, by: str) -> JobRecord:
        """Move a queued job in the queue (higher first). Submitted runs get the change at the
        daemon's next dequeue (an event on the run says who); not queued: Conflict."""
        try:
            job = self.store.set_priority(version_id, priority)
        except UnknownVersion:
            raise NotFound(f"unknown version {version_id!r}") from None
        except ValueError as exc:
            raise Conflict(str(exc), "version_id") from None
        if job.run_id is not None:
            self.queue.request_priority(job.run_id, priority, by)
        return job

    def cancel_work(self, work_id: str, by: str) -> list[JobRecord]:
        """Cancel every queued job of a work (running ones go on); each run says who and why."""
        out = []
        for job in self.store.queued_of_work(work_id):
            if job.run_id is not None:
                self.queue.note(job.run_id, f"Cancelled by {by} with every queued job of work {work_id}")
            out.append(self.cancel(job.version_id))
        return out

    def delete(self, version_id: str) -> JobRecord:
        """Remove a finished job, its artifacts and files. Unfinished jobs: Conflict."""
        job = self.get(version_id)
        if job.status not in FINISHED:
            raise Conflict(f"job {version_id} is {job.status}; cancel it first")
        for path in self.store.delete_job(version_id):
            self._remove_media(path)
        return job

    def _remove_media(self, relative: str) -> None:
        self.media.remove(relative)
