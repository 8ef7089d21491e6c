"""The GraphQL documents the gateway sends (the webserver's schema, as of the pinned Dagster)."""

LAUNCH_RESULT = """
fragment LaunchResult on LaunchRunResult {
  __typename
  ... on LaunchRunSuccess { run { runId tags { key value } } }
  ... on RunConfigValidationInvalid { errors { message } }
  ... on Error { message }
}
"""


_METADATA_FRAGMENT = """
fragment Meta on MetadataEntry {
  __typename
  label
  ... on TextMetadataEntry { text }
  ... on IntMetadataEntry { intValue intRepr }
  ... on FloatMetadataEntry { floatValue floatRepr }
  ... on BoolMetadataEntry { boolValue }
  ... on JsonMetadataEntry { jsonString }
  ... on PathMetadataEntry { path }
  ... on NotebookMetadataEntry { path }
  ... on UrlMetadataEntry { url }
  ... on MarkdownMetadataEntry { mdStr }
  ... on TimestampMetadataEntry { timestamp }
  ... on PipelineRunMetadataEntry { runId }
  ... on AssetMetadataEntry { assetKey { path } }
  ... on JobMetadataEntry { jobName }
  ... on PoolMetadataEntry { pool }
}
"""

_RUN_FIELDS = """
fragment RunFields on Run {
  runId
  jobName
  status
  tags { key value }
  creationTime
  startTime
  endTime
  updateTime
  rootRunId
  parentRunId
}
"""

STATUS_QUERY = """
query GatewayStatus {
  version
  workspaceOrError {
    __typename
    ... on Workspace {
      locationEntries {
        name
        loadStatus
        locationOrLoadError {
          __typename
          ... on RepositoryLocation { name repositories { name pipelines { name } } }
          ... on PythonError { message }
        }
      }
    }
    ... on PythonError { message }
  }
}
"""

DAEMON_QUERY = """
query GatewayDaemons {
  instance { daemonHealth { allDaemonStatuses { daemonType required healthy } } }
}
"""

RUNS_QUERY = (
    """
query GatewayRuns($filter: RunsFilter, $cursor: String, $limit: Int) {
  runsOrError(filter: $filter, cursor: $cursor, limit: $limit) {
    __typename
    ... on Runs { results { ...RunFields } }
    ... on InvalidPipelineRunsFilterError { message }
    ... on PythonError { message }
  }
}
"""
    + _RUN_FIELDS
)

FAILURE_EVENTS = """
fragment FailureEvents on EventConnection {
  cursor
  hasMore
  events {
    __typename
    ... on RunFailureEvent { message error { ...ErrorChain } }
    ... on ExecutionStepFailureEvent {
      stepKey
      errorSource
      error { ...ErrorChain }
      failureMetadata { description }
    }
  }
}

fragment ErrorChain on PythonError {
  message
  className
  causes { message className }
}
"""

MATERIALIZATIONS_QUERY = (
    """
query GatewayMaterializations($runId: ID!) {
  runOrError(runId: $runId) {
    __typename
    ... on Run {
      assetMaterializations {
        stepKey
        timestamp
        partition
        description
        assetKey { path }
        tags { key value }
        metadataEntries { ...Meta }
      }
    }
    ... on RunNotFoundError { message }
    ... on PythonError { message }
  }
}
"""
    + _METADATA_FRAGMENT
)

RUN_EVENTS_QUERY = (
    """
query GatewayRunEvents($runId: ID!, $cursor: String, $limit: Int) {
  logsForRun(runId: $runId, afterCursor: $cursor, limit: $limit) {
    __typename
    ... on EventConnection {
      cursor
      hasMore
      events { __typename ... on EngineEvent { message timestamp metadataEntries { ...Meta } } }
    }
    ... on RunNotFoundError { message }
    ... on PythonError { message }
  }
}
"""
    + _METADATA_FRAGMENT
)

TERMINATE_MUTATION = """
mutation GatewayTerminate($runId: String!, $policy: TerminateRunPolicy) {
  terminateRun(runId: $runId, terminatePolicy: $policy) {
    __typename
    ... on TerminateRunSuccess { run { runId status } }
    ... on TerminateRunFailure { message }
    ... on RunNotFoundError { message }
    ... on UnauthorizedError { message }
    ... on PythonError { message }
  }
}
"""
