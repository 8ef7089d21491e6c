"""The server YAML's schema (pydantic), one home below ``api/`` and ``orchestration/``: ``server``
(what ``server.py --config`` reads: workers, storage, runtime, schedules) and ``api`` (its ``api:``
section). Imports nothing above it; no torch, no Dagster."""
