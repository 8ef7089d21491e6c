"""The API's background work, one duty per module, each idempotent so a restart simply runs it again:

- ``submitter``  every accepted job without a run is submitted over GraphQL (and a job's follow-up
  runs), unless a run tagged with its version id already exists (the process died between
  submitting and recording it);
- ``tracker``    unfinished jobs read their run's status (one query for all of them) and the stage
  and progress events the run reported since the last look, follow Dagster's retries, and on
  success index the run's materializations as artifacts;
- ``callbacks``  due callbacks from the durable outbox are POSTed, with exponential backoff;
- ``workers``    the device and media workers' own ``/status``, refreshed for ``/health`` and views;
- ``service``    the threads that run them (``Background``).
"""

from api.background.service import Background

__all__ = ["Background"]
