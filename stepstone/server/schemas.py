"""The wire format of the HTTP API: Pydantic models for requests and responses.

The server renders domain objects (``Run``, ``Span``, ``JobRow``...) through
these models and the Python ``Client`` parses responses back through them, so
the OpenAPI spec, the server and the client share one definition.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeAlias

from pydantic import BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Tag

from stepstone import limits
from stepstone.encryption import mask
from stepstone.errors import ErrorInfo
from stepstone.events import Event
from stepstone.inventory import DatabaseStats, EndedRun, FunctionInfo
from stepstone.runs import Run, Span, StepRecord
from stepstone.store import rows, viewrows
from stepstone.store.viewrows import AppRow, JobRow, TableSize, WorkerRow

# Requests are checked against Literals of the engine's enums (plain strings, so
# the OpenAPI spec lists their values); responses say ``str`` for run statuses so
# a status added to the engine never breaks a response.
if TYPE_CHECKING:
    RunStatus: TypeAlias = str
    ReplayableStatus: TypeAlias = str
    JobStatus: TypeAlias = str
else:
    RunStatus = Literal[tuple(s.value for s in rows.RUN_STATUSES)]
    ReplayableStatus = Literal[rows.RunStatus.FAILED.value, rows.RunStatus.CANCELLED.value]
    JobStatus = Literal[tuple(s.value for s in viewrows.JobStatus)]
_STATUS_HELP = ", ".join(rows.RUN_STATUSES[:-1]) + " or " + rows.RUN_STATUSES[-1]
JobKind = Literal["cancel_many", "replay_many", "resume_many"]
MAX_TS_MS = 2**53  # milliseconds; far beyond any real date, within every integer column
Moment = Annotated[
    str | float, Field(description="RFC 3339 date-time (a naive one is UTC) or seconds since the epoch")
]


def _at(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


def _dt(ts: float | None) -> datetime | None:
    return None if ts is None else _at(ts)


def _utc(moment: datetime | None) -> datetime | None:
    """Parsed date-times carry pydantic's own tzinfo; results use ``datetime.UTC``."""
    return None if moment is None else moment.astimezone(UTC)


# -- errors ------------------------------------------------------------------------------------
class ErrorDetail(BaseModel):
    type: str = Field(description="Error class, e.g. NotFoundError, ConfigError, AuthenticationError")
    message: str
    field: str | None = Field(None, description="The request field at fault, when there is one")


class ErrorBody(BaseModel):
    error: ErrorDetail


# -- events --------------------------------------------------------------------------------------
def _integral(value: Any) -> Any:
    """JSON has one number type: ``1700000000000.0`` is an integer too."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


class EventIn(BaseModel):
    """An event to record. Unknown fields are refused (422 naming the field)."""

    model_config = ConfigDict(strict=True, extra="forbid")

    name: Annotated[
        str,
        Field(
            min_length=1,
            max_length=limits.MAX_EVENT_NAME_CHARS,
            pattern=r"\S",
            description="Names starting with 'stepstone/' are reserved",
        ),
    ]
    data: dict[str, Any] = Field(
        default_factory=dict, description=f"A JSON object, at most {limits.MAX_EVENT_BYTES} bytes"
    )
    id: Annotated[str, Field(min_length=1)] | None = Field(
        None, description="Deduplicates for 24 h; generated when omitted"
    )
    ts: Annotated[int, BeforeValidator(_integral), Field(ge=0, le=MAX_TS_MS)] | None = Field(
        None, description="Milliseconds since the epoch; the time of receipt when omitted"
    )

    def to_event(self) -> Event:
        return Event(self.name, self.data, self.id, self.ts)


def _shape(value: Any) -> str:
    return "(list)" if isinstance(value, list) else "(one)"


# One event or a list. The callable discriminator validates against the shape
# actually sent, so errors name fields (``[2].name``) instead of both union arms;
# parenthesised tags are dropped from error locations.
EventsIn = Annotated[
    Annotated[EventIn, Tag("(one)")] | Annotated[list[EventIn], Tag("(list)")],
    Discriminator(_shape),
]


class SendResult(BaseModel):
    ids: list[str] = Field(description="The event ids, in the order sent")


# -- runs ------------------------------------------------------------------------------------------
class ErrorInfoOut(BaseModel):
    type: str
    message: str
    traceback: str | None = None

    @classmethod
    def of(cls, info: ErrorInfo | None) -> ErrorInfoOut | None:
        return None if info is None else cls(type=info.type, message=info.message, traceback=info.traceback)

    def to_info(self) -> ErrorInfo:
        return ErrorInfo(self.type, self.message, self.traceback)


def _info(error: ErrorInfoOut | None) -> ErrorInfo | None:
    return None if error is None else error.to_info()


class StepOut(BaseModel):
    id: str
    status: str
    attempts: int
    output: Any = None
    error: ErrorInfoOut | None = None
    kind: str = "run"
    started_at: datetime | None = None
    ended_at: datetime | None = None

    @classmethod
    def of(cls, step: StepRecord) -> StepOut:
        return cls(
            id=step.id,
            status=step.status,
            attempts=step.attempts,
            output=mask(step.output),
            error=ErrorInfoOut.of(step.error),
            kind=step.kind,
            started_at=step.started_at,
            ended_at=step.ended_at,
        )

    def to_step(self) -> StepRecord:
        return StepRecord(
            self.id,
            self.status,
            self.attempts,
            self.output,
            _info(self.error),
            self.kind,
            _utc(self.started_at),
            _utc(self.ended_at),
        )


class RunOut(BaseModel):
    id: str
    function_id: str
    status: str = Field(description=_STATUS_HELP)
    output: Any = None
    error: ErrorInfoOut | None = None
    event_ids: list[str]
    created_at: datetime
    started_at: datetime | None = None
    ended_at: datetime | None = None
    attempt: int = 0
    meta: dict[str, Any] = Field(default_factory=dict)
    steps: list[StepOut] = Field(default_factory=list)
    app_version: str | None = Field(None, description="The version of the app that last ran it")

    @classmethod
    def of(cls, run: Run) -> RunOut:
        return cls(
            id=run.id,
            function_id=run.function_id,
            status=run.status,
            output=mask(run.output),
            error=ErrorInfoOut.of(run.error),
            event_ids=run.event_ids,
            created_at=run.created_at,
            started_at=run.started_at,
            ended_at=run.ended_at,
            attempt=run.attempt,
            meta=run.meta,
            steps=[StepOut.of(s) for s in run.steps],
            app_version=run.app_version,
        )

    def to_run(self) -> Run:
        return Run(
            id=self.id,
            function_id=self.function_id,
            status=self.status,
            output=self.output,
            error=_info(self.error),
            event_ids=self.event_ids,
            created_at=self.created_at.astimezone(UTC),
            started_at=_utc(self.started_at),
            ended_at=_utc(self.ended_at),
            steps=[s.to_step() for s in self.steps],
            attempt=self.attempt,
            meta=self.meta,
            app_version=self.app_version,
        )


class RunPage(BaseModel):
    runs: list[RunOut]
    next_cursor: str | None = Field(None, description="Pass as `cursor` for the next page; null at the end")


class SpanOut(BaseModel):
    kind: str = Field(description="queued, step, sleep, invocation, warning, replay, rerun, ...")
    name: str
    status: str
    attempt: int
    started_at: datetime
    ended_at: datetime | None = None
    duration: float | None = Field(None, description="Seconds")
    error: ErrorInfoOut | None = None
    detail: Any = None

    @classmethod
    def of(cls, span: Span) -> SpanOut:
        return cls(
            kind=span.kind,
            name=span.name,
            status=span.status,
            attempt=span.attempt,
            started_at=span.started_at,
            ended_at=span.ended_at,
            duration=span.duration,
            error=ErrorInfoOut.of(span.error),
            detail=span.detail,
        )

    def to_span(self) -> Span:
        return Span(
            self.kind,
            self.name,
            self.status,
            self.attempt,
            self.started_at.astimezone(UTC),
            _utc(self.ended_at),
            _info(self.error),
            self.detail,
        )


class TraceOut(BaseModel):
    run_id: str
    spans: list[SpanOut]


class RunStatusOut(BaseModel):
    id: str
    status: str = Field(description=_STATUS_HELP)


class RerunIn(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    step_id: Annotated[str, Field(min_length=1, description="Re-execute from this step")]
    event_data: dict[str, Any] | None = Field(
        default=None,
        description="Start the new run with this event data (a new event; the original is unchanged)",
    )


class RerunOut(BaseModel):
    id: str = Field(description="The new run")
    rerun_of: str
    step_id: str


class SignalIn(BaseModel):
    """A signal to an active run, received by its ``wait_for_signal(name)``."""

    model_config = ConfigDict(strict=True)

    name: Annotated[str, Field(min_length=1, max_length=limits.MAX_EVENT_NAME_CHARS, pattern=r"\S")]
    data: Any = Field(None, description=f"Any JSON value, at most {limits.MAX_EVENT_BYTES} bytes")


class SignalOut(BaseModel):
    id: str = Field(description="The signal's id")
    run_id: str
    name: str


# -- bulk jobs ---------------------------------------------------------------------------------------
class CancelManyIn(BaseModel):
    """Cancel the active runs of a function, optionally limited in time and by a
    CEL condition over the run's first event (``event``)."""

    model_config = ConfigDict(strict=True, populate_by_name=True, extra="forbid")

    function_id: Annotated[str, Field(min_length=1)]
    since: Moment | None = None
    until: Moment | None = None
    if_: str | None = Field(None, alias="if", description="CEL over `event`")


def _failed_only() -> list[ReplayableStatus]:
    return [rows.RunStatus.FAILED.value]


class ReplayManyIn(CancelManyIn):
    """Replay the failed (or cancelled) runs of a function."""

    status: list[ReplayableStatus] = Field(default_factory=_failed_only, min_length=1)


class ResumeManyIn(CancelManyIn):
    """Resume the paused runs of a function (the same filters as a bulk cancel)."""


class JobOut(BaseModel):
    id: str
    kind: JobKind
    status: JobStatus
    params: dict[str, Any]
    done: int = Field(description="Runs acted on so far")
    examined: int = Field(description="Runs matched by the filters so far")
    error: str | None = None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None = None

    @classmethod
    def of(cls, job: JobRow) -> JobOut:
        return cls(
            id=job.id,
            kind=job.kind,  # type: ignore[arg-type]
            status=job.status,
            params=json.loads(job.params),
            done=job.done,
            examined=job.examined,
            error=job.error,
            created_at=_at(job.created_at),
            updated_at=_at(job.updated_at),
            finished_at=_dt(job.finished_at),
        )

    @property
    def finished(self) -> bool:
        return self.status not in viewrows.JOB_ACTIVE_STATUSES


class JobList(BaseModel):
    jobs: list[JobOut]


# -- functions and workers ---------------------------------------------------------------------------
class TriggerOut(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    event: str | None = None
    if_: str | None = Field(None, alias="if")
    cron: str | None = None
    jitter: float | None = None


class FunctionOut(BaseModel):
    id: str
    app: str
    triggers: list[TriggerOut]
    retries: int
    failure_of: str | None = Field(None, description="For an on_failure handler: the function it serves")
    config: dict[str, Any] = Field(description="Flow control, back-off and timeouts as registered")
    retired: bool = Field(
        False,
        description="Its app's current deploy no longer registers it: events "
        "start no runs of it; its queued runs can be cancelled",
    )
    retired_at: datetime | None = None

    @classmethod
    def of(cls, info: FunctionInfo) -> FunctionOut:
        return cls(
            id=info.id,
            app=info.app,
            retries=info.retries,
            failure_of=info.failure_of,
            triggers=[TriggerOut.model_validate(t) for t in info.triggers],
            config=info.config,
            retired=info.retired_at is not None,
            retired_at=_dt(info.retired_at),
        )

    def to_info(self) -> FunctionInfo:
        triggers = [t.model_dump(by_alias=True, exclude_none=True) for t in self.triggers]
        retired_at = None if self.retired_at is None else self.retired_at.timestamp()
        return FunctionInfo(
            self.id, self.app, triggers, self.retries, self.failure_of, self.config, retired_at
        )


class InvokeIn(BaseModel):
    """The data of the run to start (its event is ``stepstone/function.invoked``)."""

    model_config = ConfigDict(strict=True, extra="forbid")

    data: dict[str, Any] = Field(
        default_factory=dict, description=f"A JSON object, at most {limits.MAX_EVENT_BYTES} bytes"
    )


class InvokeOut(BaseModel):
    event_id: str
    run_id: str | None = Field(
        description="The run started, or joined (debounce, batch); null when flow control skipped it"
    )


class FunctionList(BaseModel):
    functions: list[FunctionOut]


class WorkerOut(BaseModel):
    id: str
    app: str
    app_version: str | None = None
    concurrency: int
    started_at: datetime
    heartbeat_at: datetime
    functions: list[str]

    @classmethod
    def of(cls, row: WorkerRow) -> WorkerOut:
        return cls(
            id=row.id,
            app=row.app,
            app_version=row.app_version,
            concurrency=row.concurrency,
            started_at=_at(row.started_at),
            heartbeat_at=_at(row.heartbeat_at),
            functions=row.functions,
        )

    def to_row(self) -> WorkerRow:
        return WorkerRow(
            id=self.id,
            app=self.app,
            app_version=self.app_version,
            concurrency=self.concurrency,
            started_at=self.started_at.timestamp(),
            heartbeat_at=self.heartbeat_at.timestamp(),
            functions=self.functions,
        )


class WorkerList(BaseModel):
    workers: list[WorkerOut]


# -- apps served over HTTP -----------------------------------------------------------------------
class AppIn(BaseModel):
    """An endpoint serving an app (``ss.serve``) to register or sync."""

    model_config = ConfigDict(strict=True, extra="forbid")

    url: str = Field(description="The endpoint's absolute http(s) URL, as the server reaches it")


class AppOut(BaseModel):
    url: str
    app: str
    app_version: str | None = None
    max_duration: float = Field(description="Seconds the endpoint may spend on one invocation")
    functions: list[str] = Field(description="The function ids its last good sync registered")
    created_at: datetime
    synced_at: datetime = Field(description="The last good sync")
    error: str | None = Field(None, description="Why the last sync failed, if it did (since synced_at)")
    error_at: datetime | None = None

    @classmethod
    def of(cls, row: AppRow) -> AppOut:
        return cls(
            url=row.url,
            app=row.app,
            app_version=row.app_version,
            max_duration=row.max_duration,
            functions=list(row.function_ids),
            created_at=_at(row.created_at),
            synced_at=_at(row.synced_at),
            error=row.error,
            error_at=_dt(row.error_at),
        )

    def to_row(self) -> AppRow:
        return AppRow(
            url=self.url,
            app=self.app,
            app_version=self.app_version,
            max_duration=self.max_duration,
            function_ids=tuple(self.functions),
            created_at=self.created_at.timestamp(),
            synced_at=self.synced_at.timestamp(),
            error=self.error,
            error_at=None if self.error_at is None else self.error_at.timestamp(),
        )


class AppList(BaseModel):
    apps: list[AppOut]


class TableSizeOut(BaseModel):
    name: str
    rows: int = Field(description="Exact row count")
    bytes: int | None = Field(description="The table and its indexes on disk; null where not measurable")


class EndedRunOut(BaseModel):
    id: str
    function_id: str
    status: RunStatus
    ended_at: datetime


class DatabaseStatsOut(BaseModel):
    """`stepstone stats` over HTTP: what the database holds."""

    tables: list[TableSizeOut]
    total_bytes: int = Field(description="The whole database on disk")
    oldest_ended: EndedRunOut | None = Field(description="The run that ended first; null if none has")

    @classmethod
    def of(cls, stats: DatabaseStats) -> DatabaseStatsOut:
        return cls.model_validate(stats, from_attributes=True)  # (an epoch float becomes a date-time)

    def to_stats(self) -> DatabaseStats:
        run = self.oldest_ended
        return DatabaseStats(
            tables=[TableSize(**t.model_dump()) for t in self.tables],
            total_bytes=self.total_bytes,
            oldest_ended=None
            if run is None
            else EndedRun(
                **{
                    **run.model_dump(),
                    "status": rows.RunStatus(run.status),
                    "ended_at": run.ended_at.timestamp(),
                }
            ),
        )


class Health(BaseModel):
    status: Literal["ok", "unavailable"]
    database: str
    error: str | None = None
