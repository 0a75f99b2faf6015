"""The rows of what operators look at and run, crossing the ``Tx`` interface
beside ``rows.py``'s run rows: workers, backlogs, counts and timelines of the
views, bulk jobs, table sizes and retention's targets, apps served over HTTP
(frozen, keyword-only dataclasses, each read from a database row by its
``from_row``; times epoch seconds)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from stepstone.store.rows import Row, RunStatus


@dataclass(frozen=True, kw_only=True)
class WorkerRow:
    id: str
    app: str
    app_version: str | None
    concurrency: int
    started_at: float
    heartbeat_at: float
    functions: list[str] = field(default_factory=list)

    @classmethod
    def from_row(cls, row: Row) -> WorkerRow:
        return cls(
            id=row["id"],
            app=row["app"],
            app_version=row["app_version"],
            concurrency=row["concurrency"],
            started_at=row["started_at"],
            heartbeat_at=row["heartbeat_at"],
            functions=json.loads(row["functions"]),
        )


@dataclass(frozen=True, kw_only=True)
class BacklogRow:
    """Queue items of one function that are due and not leased."""

    function_id: str
    due: int
    oldest_due_at: float

    @classmethod
    def from_row(cls, row: Row) -> BacklogRow:
        return cls(function_id=row["function_id"], due=int(row["due"]), oldest_due_at=float(row["oldest"]))


@dataclass(frozen=True, kw_only=True)
class RunCountRow:
    function_id: str
    status: RunStatus
    count: int

    @classmethod
    def from_row(cls, row: Row) -> RunCountRow:
        return cls(function_id=row["function_id"], status=RunStatus(row["status"]), count=int(row["n"]))


@dataclass(frozen=True, kw_only=True)
class KeyBacklogRow:
    """Queue items of one function under one pair of concurrency key values
    (``None``: no such key): due now, held by a live lease, and in all (the rest
    are parked: sleeping, waiting, backing off or scheduled later)."""

    function_id: str
    ckey1: str | None
    ckey2: str | None
    limit1: int | None
    limit2: int | None
    due: int
    leased: int
    total: int

    @classmethod
    def from_row(cls, row: Row) -> KeyBacklogRow:
        return cls(
            function_id=row["function_id"],
            ckey1=row["ckey1"],
            ckey2=row["ckey2"],
            limit1=row["limit1"],
            limit2=row["limit2"],
            due=int(row["due"]),
            leased=int(row["leased"]),
            total=int(row["total"]),
        )


@dataclass(frozen=True, kw_only=True)
class TimelineRow:
    """Runs created in one time bucket with one status: how many, how many have
    started, and their queue delays (first start minus creation) in seconds."""

    bucket: int
    status: RunStatus
    count: int
    started: int
    delay_sum: float
    delay_max: float | None

    @classmethod
    def from_row(cls, row: Row) -> TimelineRow:
        return cls(
            bucket=int(row["bucket"]),
            status=RunStatus(row["status"]),
            count=int(row["n"]),
            started=int(row["started"]),
            delay_sum=float(row["delay_sum"] or 0.0),
            delay_max=None if row["delay_max"] is None else float(row["delay_max"]),
        )


@dataclass(frozen=True, kw_only=True)
class EventRunRow:
    """A run an event started (or joined, for batches and debounces)."""

    event_seq: int
    run_id: str
    function_id: str
    status: RunStatus

    @classmethod
    def from_row(cls, row: Row) -> EventRunRow:
        return cls(
            event_seq=int(row["event_seq"]),
            run_id=row["id"],
            function_id=row["function_id"],
            status=RunStatus(row["status"]),
        )


class JobStatus(StrEnum):
    """Where a background operator job is: active while queued or running."""

    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    INTERRUPTED = "interrupted"  #: its server stopped (or died) before it finished


JOB_ACTIVE_STATUSES = (JobStatus.QUEUED, JobStatus.RUNNING)
JOB_STATUSES = tuple(JobStatus)


@dataclass(frozen=True, kw_only=True)
class JobRow:
    """A background operator job (bulk cancel / replay); ``params`` is JSON."""

    id: str
    kind: str
    status: JobStatus
    params: str
    created_at: float
    updated_at: float
    done: int = 0
    examined: int = 0
    error: str | None = None
    owner: str | None = None
    finished_at: float | None = None

    @classmethod
    def from_row(cls, row: Row) -> JobRow:
        return cls(
            id=row["id"],
            kind=row["kind"],
            status=JobStatus(row["status"]),
            params=row["params"],
            created_at=row["created_at"],
            updated_at=row["updated_at"],
            done=row["done"],
            examined=row["examined"],
            error=row["error"],
            owner=row["owner"],
            finished_at=row["finished_at"],
        )


# -- database size and retention (issue 17) --------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class TableSize:
    """One table: its rows and the bytes it and its indexes take (``None``
    where the database cannot say, e.g. SQLite built without ``dbstat``)."""

    name: str
    rows: int
    bytes: int | None


class PruneTarget(StrEnum):
    """A table retention prunes by its own rule, not with a run (a run's steps,
    spans, links, waits, queue row and signals go with it)."""

    EVENTS = "events"  #: received before the cutoff, linked to no run
    JOBS = "jobs"  #: finished before the cutoff
    CRONS = "crons"  #: overdue since the cutoff, of a function retired since then or of none
    FUNCTIONS = "functions"  #: retired since before the cutoff, with no run left
    BATCHES = "batches"  #: whose run is gone (a pending batch's run exists)
    DEBOUNCES = "debounces"  #: whose run is gone
    DEDUPE = "dedupe"  #: expired
    GCRA = "gcra"  #: idle: its theoretical arrival time is past


@dataclass(frozen=True, kw_only=True)
class Pruned:
    """Rows one pruning transaction deleted, by table."""

    counts: Mapping[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def __add__(self, other: Pruned) -> Pruned:
        merged = dict(self.counts)
        for table, n in other.counts.items():
            merged[table] = merged.get(table, 0) + n
        return Pruned(counts=merged)


# -- apps served over HTTP (issue 16) ------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class AppRow:
    """An app the server serves by URL: what its last good sync found
    (``synced_at``), and the last failed sync's reason (``error`` at
    ``error_at``; ``None`` once a sync succeeds)."""

    url: str
    app: str
    app_version: str | None
    max_duration: float
    function_ids: tuple[str, ...]
    created_at: float
    synced_at: float
    error: str | None = None
    error_at: float | None = None

    @classmethod
    def from_row(cls, row: Row) -> AppRow:
        return cls(
            url=row["url"],
            app=row["app"],
            app_version=row["app_version"],
            max_duration=float(row["max_duration"]),
            function_ids=tuple(json.loads(row["function_ids"])),
            created_at=float(row["created_at"]),
            synced_at=float(row["synced_at"]),
            error=row["error"],
            error_at=None if row["error_at"] is None else float(row["error_at"]),
        )
