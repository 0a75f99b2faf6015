"""Operator views over HTTP: the database's size (rows and bytes per table),
run counts per status, each function's load and backlog per concurrency key,
timelines, and the preview of a bulk action."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from stepstone.errors import ConfigError
from stepstone.expressions import compile_expression
from stepstone.inventory import database_stats
from stepstone.server import insights
from stepstone.server.params import check_range, parse_moment
from stepstone.server.schemas import DatabaseStatsOut, ReplayableStatus
from stepstone.server.state import ServerState
from stepstone.server.view_schemas import (
    BulkAction,
    FunctionLoadList,
    FunctionLoadOut,
    PreviewOut,
    StatusCounts,
    TimelineOut,
)
from stepstone.store.rows import ACTIVE_STATUSES, RunStatus

TIME_HELP = "RFC 3339 date-time or epoch seconds"
FunctionQ = Annotated[str | None, Query(description="Only this function's runs")]
SinceQ = Annotated[str | None, Query(description=f"Created at or after: {TIME_HELP}")]
UntilQ = Annotated[str | None, Query(description=f"Created before: {TIME_HELP}")]


MAX_WINDOW = 366 * 86400.0
MAX_EPOCH = 1e11  # about the year 5138: beyond it a bound is a mistake


def check_window(since: float, until: float) -> None:
    for name, value in (("since", since), ("until", until)):
        if abs(value) > MAX_EPOCH:
            raise ConfigError(name, "out of range for a timeline")
    if not 0 < until - since <= MAX_WINDOW:
        raise ConfigError("since", "a timeline covers more than nothing and at most 366 days")


def build(state: ServerState) -> APIRouter:
    router = state.router("stats")

    async def bounds(
        function_id: str | None, since: str | None, until: str | None
    ) -> tuple[float | None, float | None]:
        lo, hi = parse_moment(since, "since"), parse_moment(until, "until")
        check_range(lo, hi)
        if function_id is not None:
            await state.require_function(function_id)
        return lo, hi

    @router.get("/stats", response_model=DatabaseStatsOut, summary="Database size")
    async def database() -> DatabaseStatsOut:
        """Every table with its exact row count and bytes on disk (table and indexes),
        the database's size and the run that ended first: what `stepstone stats` shows.
        (Counts every table: not for a page that refreshes every few seconds.)"""
        return DatabaseStatsOut.of(await state.app.store.read(database_stats))

    @router.get("/stats/runs", response_model=StatusCounts, summary="Run counts per status")
    async def run_counts(
        function_id: FunctionQ = None, since: SinceQ = None, until: UntilQ = None
    ) -> StatusCounts:
        """Runs created in [since, until), per status."""
        lo, hi = await bounds(function_id, since, until)
        counts = await state.app.store.read(insights.status_counts_op(function_id, lo, hi))
        return StatusCounts(counts=counts, total=sum(counts.values()))

    @router.get("/stats/functions", response_model=FunctionLoadList, summary="Functions and their load")
    async def function_loads() -> FunctionLoadList:
        """Each registered function with its active runs per status, failures in the
        last hour and queue backlog per concurrency key."""
        loads = await state.app.store.read(insights.functions_op(state.app.clock.now()))
        return FunctionLoadList(functions=[FunctionLoadOut.of(load) for load in loads])

    @router.get("/stats/timeline", response_model=TimelineOut, summary="Runs over time")
    async def timeline(
        function_id: FunctionQ = None,
        since: SinceQ = None,
        until: UntilQ = None,
        buckets: Annotated[int, Query(ge=1, le=500)] = 60,
    ) -> TimelineOut:
        """Runs created in [since, until) (default: the last hour) in equal buckets: counts
        by status, failure rate and queue delay (creation to first start)."""
        lo, hi = await bounds(function_id, since, until)
        hi = state.app.clock.now() if hi is None else hi
        lo = hi - insights.HOUR if lo is None else lo
        check_window(lo, hi)
        found = await state.app.store.read(insights.timeline_op(function_id, lo, hi, buckets))
        return TimelineOut.of(found)

    @router.get("/stats/preview", response_model=PreviewOut, summary="Preview a bulk action")
    async def preview(
        action: Annotated[BulkAction, Query(description="cancel (active), replay or resume (paused)")],
        function_id: Annotated[str, Query(min_length=1)],
        since: SinceQ = None,
        until: UntilQ = None,
        status: Annotated[
            list[ReplayableStatus] | None, Query(description="For replay: failed (default) and/or cancelled")
        ] = None,
        if_: Annotated[str | None, Query(alias="if", description="CEL over `event`")] = None,
    ) -> PreviewOut:
        """How many runs `cancel-many` / `replay-many` / `resume-many` with the same filters would act on
        now (a CEL filter is evaluated over at most 5000 runs; `complete` says if it saw all)."""
        lo, hi = await bounds(function_id, since, until)
        condition = None if if_ is None else compile_expression(if_, field="if")
        fixed: dict[str, tuple[str, ...]] = {"cancel": ACTIVE_STATUSES, "resume": (RunStatus.PAUSED,)}
        statuses = fixed.get(action) or tuple(status or [RunStatus.FAILED])
        found = await state.app.store.read(insights.preview_op(function_id, statuses, lo, hi, condition))
        return PreviewOut.of(action, found)

    return router
