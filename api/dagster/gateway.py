"""The API's only way to Dagster: GraphQL against the webserver (DESIGN.md "Layers").

``DagsterGateway`` wraps ``dagster_graphql.DagsterGraphQLClient``: its helpers where it has one
(``submit_job_execution``) and raw queries through its ``_execute`` elsewhere. Results are plain
dataclasses; nothing here imports torch or builds a Dagster instance.

Errors: every failure is a :class:`DagsterGatewayError`; :class:`DagsterUnavailable` (a subclass) means
"try again later" (webserver down, timed out, 5xx, code location not loaded), anything else is a
definite answer (unknown job, invalid run config, bad query).

Threads: gql's client holds one HTTP session while a query is in flight and refuses a second one
(``TransportAlreadyConnected``), so a shared client fails under concurrency. The gateway keeps one
``DagsterGraphQLClient`` per thread (construction costs ~5 us; one query opens one local TCP
connection either way). A lock around one client measured the same throughput for small queries but
would queue every status poll behind a slow ``submit``.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from dagster_graphql import DagsterGraphQLClient, DagsterGraphQLClientError

from api.dagster.queries import (
    DAEMON_QUERY,
    FAILURE_EVENTS,
    LAUNCH_RESULT,
    MATERIALIZATIONS_QUERY,
    RUN_EVENTS_QUERY,
    RUNS_QUERY,
    STATUS_QUERY,
    TERMINATE_MUTATION,
)
from api.dagster.types import (
    RUN_STATUSES,
    CodeLocation,
    DaemonStatus,
    DagsterGatewayError,
    DagsterUnavailable,
    EngineEvent,
    Materialization,
    RunFailure,
    RunInfo,
    RunSubmission,
    StepFailure,
)
from contracts.tags import DUPLICATE_OF_TAG, PARENT_RUN_ID_TAG, ROOT_RUN_ID_TAG

_PAGE = 500  # runs per page for tag queries
_EVENT_PAGE = 1000  # events per page when reading a failed run's log
_FAILURE_CACHE_SIZE = 2048


def _retryable(exc: BaseException) -> bool:
    import requests
    from gql.transport.exceptions import TransportConnectionFailed, TransportServerError

    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, TransportConnectionFailed | requests.exceptions.RequestException | TimeoutError):
            return True
        if isinstance(cur, TransportServerError) and (cur.code is None or cur.code >= 500):
            return True
        cur = cur.__cause__ or cur.__context__
    return False


def _translate(exc: DagsterGraphQLClientError, what: str) -> DagsterGatewayError:
    if _retryable(exc):
        return DagsterUnavailable(f"{what}: Dagster webserver unreachable ({_root_message(exc)})")
    args = exc.args
    if len(args) >= 2 and isinstance(args[0], str) and " " not in args[0]:
        # the client's own errors: (GraphQL type name, message or errors)
        return DagsterGatewayError(f"{what}: {args[0]}: {args[1]}", kind=args[0])
    return DagsterGatewayError(f"{what}: {_root_message(exc)}")


def _root_message(exc: BaseException) -> str:
    """The innermost cause: ``_execute`` hides gql's errors (query errors, timeouts) behind a generic
    'Exception occured during execution of query ...' message."""
    cur: BaseException = exc
    while cur.__cause__ is not None:
        cur = cur.__cause__
    return f"{type(cur).__name__}: {cur}"


def _check_typename(obj: Mapping[str, Any], expected: str, what: str) -> None:
    typename = obj.get("__typename")
    if typename != expected:
        message = obj.get("message") or typename
        raise DagsterGatewayError(f"{what}: {typename}: {message}", kind=typename)


# --------------------------------------------------------------------------------------------------
# Conversions


def _tags(entries: Iterable[Mapping[str, Any]] | None) -> dict[str, str]:
    return {e["key"]: e["value"] for e in entries or ()}


def _run_info(node: Mapping[str, Any]) -> RunInfo:
    tags = _tags(node.get("tags"))
    return RunInfo(
        run_id=node["runId"],
        job_name=node.get("jobName") or "",
        status=node["status"],
        tags=tags,
        creation_time=float(node.get("creationTime") or 0.0),
        start_time=node.get("startTime"),
        end_time=node.get("endTime"),
        update_time=node.get("updateTime"),
        root_run_id=node.get("rootRunId") or tags.get(ROOT_RUN_ID_TAG),
        parent_run_id=node.get("parentRunId") or tags.get(PARENT_RUN_ID_TAG),
    )


def metadata_value(entry: Mapping[str, Any]) -> Any:
    """A GraphQL ``MetadataEntry`` as a python value. Ints beyond 32 bits and non-finite floats come
    back with a null value and only a string repr: parse the repr."""
    kind = entry.get("__typename")
    if kind == "TextMetadataEntry":
        return entry["text"]
    if kind == "IntMetadataEntry":
        return int(entry["intRepr"]) if entry.get("intRepr") is not None else entry.get("intValue")
    if kind == "FloatMetadataEntry":
        if entry.get("floatValue") is not None:
            return float(entry["floatValue"])
        return float(entry["floatRepr"])  # "nan", "inf", "-inf"
    if kind == "BoolMetadataEntry":
        return entry.get("boolValue")
    if kind == "JsonMetadataEntry":
        return json.loads(entry["jsonString"])
    if kind in ("PathMetadataEntry", "NotebookMetadataEntry"):
        return entry["path"]
    if kind == "UrlMetadataEntry":
        return entry["url"]
    if kind == "MarkdownMetadataEntry":
        return entry["mdStr"]
    if kind == "TimestampMetadataEntry":
        return float(entry["timestamp"])
    if kind == "PipelineRunMetadataEntry":
        return entry["runId"]
    if kind == "AssetMetadataEntry":
        return "/".join(entry["assetKey"]["path"])
    if kind == "JobMetadataEntry":
        return entry["jobName"]
    if kind == "PoolMetadataEntry":
        return entry["pool"]
    return None  # NullMetadataEntry; table/schema/code-reference entries are not carried


def _materialization(node: Mapping[str, Any]) -> Materialization:
    metadata = {e["label"]: metadata_value(e) for e in node.get("metadataEntries") or ()}
    try:
        timestamp = float(node.get("timestamp") or 0) / 1000.0  # milliseconds, as a string
    except ValueError:
        timestamp = math.nan
    return Materialization(
        asset_key=tuple((node.get("assetKey") or {}).get("path") or ()),
        partition=node.get("partition"),
        metadata=metadata,
        step_key=node.get("stepKey"),
        timestamp=timestamp,
        description=node.get("description"),
        tags=_tags(node.get("tags")),
    )


# --------------------------------------------------------------------------------------------------
# The gateway


class DagsterGateway:
    """Typed GraphQL access to one Dagster webserver and one code location/repository."""

    def __init__(
        self,
        host: str,
        port: int,
        location_name: str | None = None,
        repository_name: str = "__repository__",
        timeout_s: float = 10,
    ):
        self.host = host
        self.port = int(port)
        self.timeout_s = timeout_s
        self._location_name = location_name
        self._repository_name = repository_name
        self._local = threading.local()
        self._lock = threading.Lock()
        self._location: CodeLocation | None = None
        self._failures: OrderedDict[str, RunFailure] = OrderedDict()

    # -- plumbing ----------------------------------------------------------------------------------

    @property
    def client(self) -> DagsterGraphQLClient:
        """This thread's client."""
        client = getattr(self._local, "client", None)
        if client is None:
            client = DagsterGraphQLClient(self.host, port_number=self.port, timeout=self.timeout_s)
            self._local.client = client
        return client

    def execute(self, query: str, variables: Mapping[str, Any] | None = None, what: str = "query") -> dict:
        """A raw GraphQL query/mutation; client errors become gateway errors."""
        try:
            return self.client._execute(query, dict(variables) if variables is not None else None)
        except DagsterGraphQLClientError as exc:
            raise _translate(exc, what) from exc

    # -- health and location -----------------------------------------------------------------------

    def _status(self) -> dict:
        return self.execute(STATUS_QUERY, what="status")

    def _pick_location(self, data: Mapping[str, Any]) -> CodeLocation:
        workspace = data["workspaceOrError"]
        _check_typename(workspace, "Workspace", "workspace")
        candidates: list[CodeLocation] = []
        problems: list[str] = []
        for entry in workspace["locationEntries"]:
            if self._location_name is not None and entry["name"] != self._location_name:
                continue
            loc = entry.get("locationOrLoadError") or {}
            if entry.get("loadStatus") != "LOADED" or loc.get("__typename") != "RepositoryLocation":
                error = loc.get("message") or ""
                problems.append(f"{entry['name']}: {entry.get('loadStatus')} {error}".strip())
                continue
            for repo in loc.get("repositories") or ():
                if repo["name"] == self._repository_name:
                    jobs = tuple(p["name"] for p in repo.get("pipelines") or ())
                    candidates.append(CodeLocation(entry["name"], repo["name"], jobs))
        if len(candidates) == 1:
            return candidates[0]
        if not candidates:
            wanted = f"location {self._location_name!r}" if self._location_name else "any location"
            detail = "; ".join(problems) if problems else "not in the workspace"
            # a location that is loading or failed to load may come good after a reload
            raise DagsterUnavailable(f"repository {self._repository_name!r} in {wanted}: {detail}")
        names = ", ".join(c.location_name for c in candidates)
        raise DagsterGatewayError(
            f"repository {self._repository_name!r} is in several code locations ({names}): "
            "configure location_name",
            kind="AmbiguousLocation",
        )

    def location(self, refresh: bool = False) -> CodeLocation:
        """The code location and repository runs are submitted to (discovered once, then cached)."""
        with self._lock:
            cached = self._location
        if cached is not None and not refresh:
            return cached
        found = self._pick_location(self._status())
        with self._lock:
            self._location = found
        return found

    def ping(self) -> bool:
        """The webserver answers and the code location is loaded."""
        try:
            data = self._status()
            if not data.get("version"):
                return False
            found = self._pick_location(data)
        except DagsterGatewayError:
            return False
        with self._lock:
            self._location = found  # refresh the cache while we have it (jobs may have changed)
        return True

    def daemon_statuses(self) -> list[DaemonStatus]:
        data = self.execute(DAEMON_QUERY, what="daemon health")
        return [
            DaemonStatus(d["daemonType"], bool(d["required"]), d.get("healthy"))
            for d in data["instance"]["daemonHealth"]["allDaemonStatuses"]
        ]

    def daemon_healthy(self, daemon_types: Iterable[str] | None = None) -> bool | None:
        """True when every required daemon (of ``daemon_types``, default all) has a fresh heartbeat,
        False when one does not, None when the webserver cannot tell (unreachable, nothing required)."""
        try:
            statuses = self.daemon_statuses()
        except DagsterGatewayError:
            return None
        wanted = set(daemon_types) if daemon_types is not None else None
        required = [s for s in statuses if s.required and (wanted is None or s.daemon_type in wanted)]
        if not required:
            return None
        return all(s.healthy is True for s in required)

    # -- runs --------------------------------------------------------------------------------------

    def submit(self, job_name: str, run_config: Mapping[str, Any], tags: Mapping[str, str]) -> str:
        """Submit (queue or launch, per the instance's run coordinator) one run; returns its run id.
        A step of a job (its version and step tags) submitted again answers the run that has it."""
        (answer,) = self.submit_many([RunSubmission(job_name, run_config, tags)])
        if isinstance(answer, DagsterGatewayError):
            raise answer
        return answer

    def submit_many(self, submissions: Sequence[RunSubmission]) -> list[str | DagsterGatewayError]:
        """Submit runs in ONE GraphQL document: aliased ``launchRun`` mutations, which GraphQL
        executes serially in document order, so the runs enter Dagster's queue in the order given,
        at a fraction of the per-request cost. Answers a run id or the refusal, per submission.

        After a timeout the runs may still exist, or land later: look them up by tag
        (:meth:`find_runs_by_tag`) before submitting again. A job's step that lands twice anyway is
        canceled unrun by the run queue the second time (``orchestration.coordinator``), and its
        answer is the first run. Raises
        :class:`DagsterUnavailable` when the webserver cannot answer.
        """
        if not submissions:
            return []
        loc = self.location()
        declared, fields, variables = [], [], {}
        for n, sub in enumerate(submissions):
            declared.append(f"$p{n}: ExecutionParams!")
            fields.append(f"r{n}: launchRun(executionParams: $p{n}) {{ ...LaunchResult }}")
            variables[f"p{n}"] = {
                "selector": {
                    "repositoryLocationName": loc.location_name,
                    "repositoryName": loc.repository_name,
                    "jobName": sub.job_name,
                },
                "runConfigData": dict(sub.run_config),
                "executionMetadata": {
                    "tags": [{"key": str(k), "value": str(v)} for k, v in sub.tags.items()]
                },
            }
        query = f"mutation GatewaySubmit({', '.join(declared)}) {{ {' '.join(fields)} }}" + LAUNCH_RESULT
        data = self.execute(query, variables, what=f"submit {len(submissions)} runs")
        answers: list[str | DagsterGatewayError] = []
        for n, sub in enumerate(submissions):
            result = data.get(f"r{n}") or {}
            kind = result.get("__typename")
            if kind == "LaunchRunSuccess":
                # A second submission of a step is canceled by the run queue, which names the run
                # that has the step: that run is the answer (submitting a step is idempotent).
                run = result["run"]
                answers.append(_tags(run.get("tags")).get(DUPLICATE_OF_TAG) or run["runId"])
                continue
            errors = result.get("errors")
            detail = "; ".join(e["message"] for e in errors) if errors else result.get("message") or kind
            error_type = DagsterUnavailable if storage_away(kind, detail) else DagsterGatewayError
            answers.append(error_type(f"submit {sub.job_name}: {kind}: {detail}", kind=kind))
            if kind in ("PipelineNotFoundError", "RepositoryLocationNotFound", "PythonError"):
                with self._lock:
                    self._location = None  # the workspace may have been reloaded or renamed
        return answers

    def _runs_where(self, run_filter: Mapping[str, Any], limit: int | None = None) -> list[RunInfo]:
        """All runs matching ``run_filter`` (paged: the server may cap pages), newest first."""
        out: list[RunInfo] = []
        cursor = None
        while True:
            page = _PAGE if limit is None else min(_PAGE, limit - len(out))
            data = self.execute(
                RUNS_QUERY, {"filter": dict(run_filter), "cursor": cursor, "limit": page}, what="runs"
            )
            result = data["runsOrError"]
            _check_typename(result, "Runs", "runs")
            nodes = result["results"]
            out.extend(_run_info(n) for n in nodes)
            if len(nodes) < page or (limit is not None and len(out) >= limit):
                return out
            cursor = nodes[-1]["runId"]

    def find_runs_by_tag(self, key: str, value: str, limit: int | None = None) -> list[RunInfo]:
        """Runs carrying tag ``key=value``, newest first. Re-executions copy their parent's tags, so
        a version tag finds the original run and its retries."""
        return self._runs_where({"tags": [{"key": key, "value": value}]}, limit=limit)

    def retries_of(self, root_run_id: str) -> list[RunInfo]:
        """Re-executions of ``root_run_id`` (tag dagster/root_run_id), oldest first; the root itself
        is not included. The newest retry is the last one."""
        runs = self._runs_where({"tags": [{"key": ROOT_RUN_ID_TAG, "value": root_run_id}]})
        return sorted(runs, key=lambda r: (r.creation_time, r.retry_number))

    def run(self, run_id: str) -> RunInfo | None:
        return self.runs([run_id]).get(run_id)

    def runs(
        self, run_ids: Iterable[str], failures: bool = True, statuses: Iterable[str] | None = None
    ) -> dict[str, RunInfo]:
        """The runs among ``run_ids`` that exist (in one of ``statuses``, when given), in one query
        (plus one for failed runs whose failure details are not cached yet, when ``failures``)."""
        ids = list(dict.fromkeys(run_ids))
        if not ids:
            return {}
        run_filter: dict[str, Any] = {"runIds": ids}
        if statuses is not None:
            run_filter["statuses"] = list(statuses)
        variables = {"filter": run_filter, "cursor": None, "limit": None}
        data = self.execute(RUNS_QUERY, variables, what="runs")
        result = data["runsOrError"]
        _check_typename(result, "Runs", "runs")
        found = {info.run_id: info for info in map(_run_info, result["results"])}
        if failures:
            failed = [rid for rid, info in found.items() if info.status == "FAILURE"]
            details = self._failure_details(failed)
            for rid, (message, error, steps) in details.items():
                found[rid] = replace(
                    found[rid], failure_message=message, failure_error=error, step_failures=steps
                )
        return found

    def _failure_details(self, run_ids: list[str]) -> dict[str, RunFailure]:
        """RUN_FAILURE message (and own error) and step failures of FAILURE runs. GraphQL cannot
        filter a run's events by type, so the log is read in pages (other events come back as bare
        ``__typename``); a failed run's log no longer changes, so the answer is cached."""
        out: dict[str, RunFailure] = {}
        todo: list[str] = []
        with self._lock:
            for rid in run_ids:
                if rid in self._failures:
                    self._failures.move_to_end(rid)
                    out[rid] = self._failures[rid]
                else:
                    todo.append(rid)
        if not todo:
            return out
        cursors: dict[str, str | None] = dict.fromkeys(todo)
        messages: dict[str, str | None] = dict.fromkeys(todo)
        errors: dict[str, str | None] = dict.fromkeys(todo)
        steps: dict[str, list[StepFailure]] = {rid: [] for rid in todo}
        pending = list(todo)
        while pending:
            var_defs = ", ".join(f"$r{i}: ID!, $c{i}: String" for i in range(len(pending)))
            body = "\n".join(
                f"  r{i}: runOrError(runId: $r{i}) {{ __typename ... on Run {{ "
                f"eventConnection(afterCursor: $c{i}, limit: {_EVENT_PAGE}) {{ ...FailureEvents }} }} }}"
                for i in range(len(pending))
            )
            variables: dict[str, Any] = {}
            for i, rid in enumerate(pending):
                variables[f"r{i}"] = rid
                variables[f"c{i}"] = cursors[rid]
            data = self.execute(
                f"query GatewayFailures({var_defs}) {{\n{body}\n}}\n{FAILURE_EVENTS}",
                variables,
                what="run failures",
            )
            still: list[str] = []
            for i, rid in enumerate(pending):
                node = data[f"r{i}"]
                if node.get("__typename") != "Run":
                    continue
                conn = node["eventConnection"]
                for event in conn["events"]:
                    kind = event.get("__typename")
                    if kind == "RunFailureEvent":
                        messages[rid] = event.get("message")
                        errors[rid] = own_error(event.get("error"))
                    elif kind == "ExecutionStepFailureEvent":
                        error = event.get("error") or {}
                        steps[rid].append(
                            StepFailure(
                                step_key=event.get("stepKey"),
                                message=(error.get("message") or "").strip(),
                                class_name=error.get("className"),
                                description=(event.get("failureMetadata") or {}).get("description"),
                                error_source=event.get("errorSource"),
                                cause=own_error(error),
                            )
                        )
                if conn.get("hasMore") and conn.get("cursor") and conn["cursor"] != cursors[rid]:
                    cursors[rid] = conn["cursor"]
                    still.append(rid)
            pending = still
        with self._lock:
            for rid in todo:
                out[rid] = self._failures[rid] = (messages[rid], errors[rid], tuple(steps[rid]))
            while len(self._failures) > _FAILURE_CACHE_SIZE:
                self._failures.popitem(last=False)
        return out

    def materializations(self, run_id: str) -> list[Materialization]:
        """Asset materializations the run recorded, in order."""
        data = self.execute(MATERIALIZATIONS_QUERY, {"runId": run_id}, what="materializations")
        result = data["runOrError"]
        if result.get("__typename") == "RunNotFoundError":
            raise DagsterGatewayError(f"run {run_id} not found", kind="RunNotFoundError")
        _check_typename(result, "Run", "materializations")
        return [_materialization(m) for m in result["assetMaterializations"]]

    def engine_events(self, run_id: str, cursor: str | None = None) -> tuple[list[EngineEvent], str | None]:
        """The run's engine events after ``cursor`` (oldest first), and the cursor to read on from:
        how a client follows what a run reports without scanning it again."""
        out: list[EngineEvent] = []
        while True:
            data = self.execute(
                RUN_EVENTS_QUERY, {"runId": run_id, "cursor": cursor, "limit": _PAGE}, what="run events"
            )
            conn = data["logsForRun"]
            _check_typename(conn, "EventConnection", "run events")
            for event in conn["events"]:
                if event.get("__typename") != "EngineEvent":
                    continue
                metadata = {e["label"]: metadata_value(e) for e in event.get("metadataEntries") or ()}
                out.append(EngineEvent(event.get("message") or "", metadata))
            cursor = conn.get("cursor") or cursor
            if not conn.get("hasMore"):
                return out, cursor

    def terminate(self, run_id: str, force: bool = False, wait_starting_s: float = 5.0) -> bool:
        """Ask Dagster to cancel a run: a queued run is canceled at once, a started one goes to
        CANCELING and the run launcher interrupts it (CANCELED follows).

        Dagster only terminates QUEUED and STARTED runs (``CANCELABLE_RUN_STATUSES``); a run still
        STARTING (launched, worker not yet reporting) is refused, so this polls for up to
        ``wait_starting_s`` until it leaves STARTING and asks again. ``force`` marks the run CANCELED
        at once (MARK_AS_CANCELED_IMMEDIATELY) without interrupting a STARTING/STARTED worker: the
        worker may keep computing. False when the run is unknown, finished, or still not cancelable.
        """
        policy = "MARK_AS_CANCELED_IMMEDIATELY" if force else "SAFE_TERMINATE"
        deadline = time.monotonic() + max(0.0, wait_starting_s)
        retried_cancelable = False
        while True:
            data = self.execute(TERMINATE_MUTATION, {"runId": run_id, "policy": policy}, what="terminate")
            result = data["terminateRun"]
            kind = result.get("__typename")
            if kind == "TerminateRunSuccess":
                return True
            if kind == "RunNotFoundError":
                return False
            if kind != "TerminateRunFailure":
                raise DagsterGatewayError(f"terminate {run_id}: {kind}: {result.get('message')}", kind=kind)
            info = self.runs([run_id], failures=False).get(run_id)
            if info is None or info.finished:
                return False
            if info.status in ("STARTED", "QUEUED") and not retried_cancelable:
                retried_cancelable = True  # it moved on between the mutation and the read: ask again
                continue
            if info.status not in ("STARTING", "NOT_STARTED") or time.monotonic() >= deadline:
                return False
            time.sleep(0.2)

    def queue_counts(
        self, tags: Mapping[str, str] | None = None, statuses: Iterable[str] = RUN_STATUSES
    ) -> dict[str, int]:
        """Number of runs per status (runs carrying all ``tags``), in one query of COUNTs."""
        statuses = [s for s in statuses if s in RUN_STATUSES]
        if not statuses:
            return {}
        tag_list = [{"key": k, "value": v} for k, v in (tags or {}).items()]
        body = "\n".join(
            f"  {s}: runsOrError(filter: {{statuses: [{s}], tags: $tags}}) "
            "{ __typename ... on Runs { count } ... on PythonError { message } }"
            for s in statuses
        )
        data = self.execute(f"query GatewayCounts($tags: [ExecutionTag!]) {{\n{body}\n}}", {"tags": tag_list})
        counts: dict[str, int] = {}
        for s in statuses:
            _check_typename(data[s], "Runs", "counts")
            counts[s] = int(data[s]["count"])
        return counts


def own_error(error: Mapping[str, Any] | None) -> str | None:
    """The error an op (or the run) raised itself, from a GraphQL ``PythonError`` with its
    ``causes`` (explicit ``raise ... from`` links, outermost first): Dagster wraps an op's exception
    in its own (``DagsterExecutionStepExecutionError: Error occurred while executing op ...``), so
    the first error that is not Dagster's is what went wrong. Answered as Python prints it, without
    the module path: ``ValueError: height and width must be > 0``. None without an error."""
    if not error:
        return None
    chain = [error, *(error.get("causes") or ())]
    own = next((e for e in chain if not str(e.get("className") or "").startswith("Dagster")), chain[-1])
    message = str(own.get("message") or "").strip()
    name = own.get("className")
    head, sep, rest = message.partition(": ")
    if name and head.rsplit(".", 1)[-1] == name:  # "module.Class: text" or "Class: text" (or "Class")
        message = f"{name}: {rest}" if sep else name
    return message or name


# What Dagster's storage says when its database is away (psycopg2 through SQLAlchemy, or
# dagster_postgres giving up its connection retries): the launch may be tried again.
_STORAGE_AWAY = ("OperationalError", "DagsterPostgresException", "too many retries for DB connection")


def storage_away(kind: str | None, detail: str) -> bool:
    """Whether a GraphQL error is Dagster's storage being unreachable (transient), not a refusal."""
    return kind == "PythonError" and any(marker in detail for marker in _STORAGE_AWAY)
