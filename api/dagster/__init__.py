"""The API's only way to Dagster: GraphQL against the webserver (DESIGN.md "Layers").

``protocol`` Gateway: what the API asks of Dagster (a Protocol; DagsterGateway answers it)
``gateway``  DagsterGateway: submit, read runs/events/materializations, terminate, queue counts
``queries``  the GraphQL documents it sends
``types``    what it answers (plain dataclasses) and its errors
"""

from api.dagster.gateway import DagsterGateway, metadata_value, own_error
from api.dagster.protocol import Gateway
from api.dagster.types import (
    FINISHED_STATUSES,
    RUN_STATUSES,
    CodeLocation,
    DaemonStatus,
    DagsterGatewayError,
    DagsterUnavailable,
    EngineEvent,
    Materialization,
    RunInfo,
    RunSubmission,
    StepFailure,
)

__all__ = [
    "FINISHED_STATUSES",
    "RUN_STATUSES",
    "CodeLocation",
    "DaemonStatus",
    "DagsterGateway",
    "DagsterGatewayError",
    "DagsterUnavailable",
    "EngineEvent",
    "Gateway",
    "Materialization",
    "RunInfo",
    "RunSubmission",
    "StepFailure",
    "metadata_value",
    "own_error",
]
