"""The wire format of the operator views: run counts, function load, timelines,
bulk previews and the event log (``routes/stats.py``, ``routes/event_log.py``)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from stepstone.encryption import shown
from stepstone.server.insights import Bucket, FunctionLoad, Preview, Timeline
from stepstone.server.schemas import FunctionOut
from stepstone.store.rows import EventRow
from stepstone.store.viewrows import EventRunRow, KeyBacklogRow

BulkAction = Literal["cancel", "replay", "resume"]


def _at(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


class StatusCounts(BaseModel):
    counts: dict[str, int] = Field(description="Runs per status (every status, zeros included)")
    total: int


class KeyBacklogOut(BaseModel):
    ckey1: str | None
    ckey2: str | None
    limit1: int | None
    limit2: int | None
    due: int = Field(description="Due now and waiting for a worker")
    leased: int = Field(description="Held by a worker now")
    total: int = Field(description="Every queue item (the rest are sleeping, waiting or backing off)")

    @classmethod
    def of(cls, row: KeyBacklogRow) -> KeyBacklogOut:
        return cls(
            ckey1=row.ckey1,
            ckey2=row.ckey2,
            limit1=row.limit1,
            limit2=row.limit2,
            due=row.due,
            leased=row.leased,
            total=row.total,
        )


class FunctionLoadOut(BaseModel):
    function: FunctionOut
    active: dict[str, int] = Field(description="Runs not ended, per status")
    failed_last_hour: int = Field(description="Runs created in the last hour that failed")
    backlog: int = Field(description="Queue items due and waiting for a worker")
    keys: list[KeyBacklogOut] = Field(description="Queue items per concurrency key values")

    @classmethod
    def of(cls, load: FunctionLoad) -> FunctionLoadOut:
        return cls(
            function=FunctionOut.of(load.info),
            active=load.active,
            failed_last_hour=load.failed_last_hour,
            backlog=load.backlog,
            keys=[KeyBacklogOut.of(k) for k in load.keys],
        )


class FunctionLoadList(BaseModel):
    functions: list[FunctionLoadOut]


class BucketOut(BaseModel):
    start: datetime
    created: int
    completed: int
    failed: int
    cancelled: int
    failure_rate: float | None = Field(description="failed / (completed + failed + cancelled)")
    queue_delay_avg: float | None = Field(description="Seconds, over the runs that started")
    queue_delay_max: float | None

    @classmethod
    def of(cls, bucket: Bucket) -> BucketOut:
        return cls(
            start=_at(bucket.start),
            created=bucket.created,
            completed=bucket.completed,
            failed=bucket.failed,
            cancelled=bucket.cancelled,
            failure_rate=bucket.failure_rate,
            queue_delay_avg=bucket.delay_avg,
            queue_delay_max=bucket.delay_max,
        )


class TimelineOut(BaseModel):
    """Runs grouped by creation time: each bucket counts the runs created in it by
    their status now, and their delay from creation to first start."""

    width: int = Field(description="Seconds per bucket")
    buckets: list[BucketOut]

    @classmethod
    def of(cls, timeline: Timeline) -> TimelineOut:
        return cls(width=timeline.width, buckets=[BucketOut.of(b) for b in timeline.buckets])


class PreviewOut(BaseModel):
    action: BulkAction
    count: int = Field(description="Runs the action would act on now")
    examined: int
    complete: bool = Field(description="False when a CEL filter's scan stopped early (count is a floor)")
    sample: list[str] = Field(description="A few of the matching run ids, newest first")

    @classmethod
    def of(cls, action: BulkAction, preview: Preview) -> PreviewOut:
        return cls(
            action=action,
            count=preview.count,
            examined=preview.examined,
            complete=preview.complete,
            sample=preview.sample,
        )


class EventRunOut(BaseModel):
    id: str
    function_id: str
    status: str


class EventOut(BaseModel):
    seq: int
    id: str
    name: str
    data: Any = Field(description='Encrypted values show as "encrypted"')
    ts: int = Field(description="Milliseconds since the epoch")
    received_at: datetime
    runs: list[EventRunOut] = Field(default_factory=list)

    @classmethod
    def of(cls, row: EventRow, runs: list[EventRunRow] | None = None) -> EventOut:
        return cls(
            seq=row.seq,
            id=row.id,
            name=row.name,
            data=shown(row.data),
            ts=row.ts,
            received_at=_at(row.received_at),
            runs=[EventRunOut(id=r.run_id, function_id=r.function_id, status=r.status) for r in runs or []],
        )


class EventPage(BaseModel):
    events: list[EventOut]
    next_cursor: str | None = None
