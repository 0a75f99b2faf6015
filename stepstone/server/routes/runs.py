"""Runs: list, show, trace, cancel, replay, rerun, and bulk cancel / replay."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query
from starlette.status import HTTP_202_ACCEPTED

from stepstone.expressions import compile_expression
from stepstone.inventory import require_function
from stepstone.server.errors import documented
from stepstone.server.jobs import CANCEL_MANY, REPLAY_MANY, BulkRequest
from stepstone.server.params import check_range, decode_cursor, encode_cursor, parse_moment
from stepstone.server.schemas import (
    CancelManyIn,
    JobOut,
    ReplayManyIn,
    RerunIn,
    RerunOut,
    RunOut,
    RunPage,
    RunStatus,
    RunStatusOut,
    SpanOut,
    TraceOut,
)
from stepstone.server.state import ServerState

RunId = Annotated[str, Path(description="A run id")]
TIME_HELP = "RFC 3339 date-time or epoch seconds"


def build(state: ServerState) -> APIRouter:
    router = state.router("runs")
    runs = state.app.runs

    async def known_function(function_id: str) -> None:
        await state.app.store.read(lambda tx: require_function(tx, function_id))

    @router.get("/runs", response_model=RunPage, summary="List runs, newest first")
    async def list_runs(
        function_id: Annotated[str | None, Query(description="Only this function's runs")] = None,
        status: Annotated[list[RunStatus] | None, Query(description="Any of these statuses")] = None,
        event_id: Annotated[str | None, Query(description="Runs this event triggered")] = None,
        since: Annotated[str | None, Query(description=f"Created at or after: {TIME_HELP}")] = None,
        until: Annotated[str | None, Query(description=f"Created before: {TIME_HELP}")] = None,
        limit: Annotated[int, Query(ge=1, le=500)] = 50,
        cursor: Annotated[str | None, Query(description="`next_cursor` of the previous page")] = None,
    ) -> RunPage:
        lo, hi = parse_moment(since, "since"), parse_moment(until, "until")
        check_range(lo, hi)
        before = decode_cursor(cursor)
        if function_id is not None:
            await known_function(function_id)
        found = await runs.list_async(function_id=function_id, status=status, event_id=event_id,
                                      since=lo, until=hi, limit=limit + 1, before=before)
        page = found[:limit]
        more = len(found) > limit
        return RunPage(runs=[RunOut.of(r) for r in page],
                       next_cursor=encode_cursor(page[-1].id) if more else None)

    @router.get("/runs/{run_id}", response_model=RunOut, responses=documented(404), summary="A run")
    async def get_run(run_id: RunId) -> RunOut:
        return RunOut.of(await runs.get_async(run_id))

    @router.get("/runs/{run_id}/trace", response_model=TraceOut, responses=documented(404),
                summary="Every span of a run")
    async def trace(run_id: RunId) -> TraceOut:
        spans = await runs.trace_async(run_id)
        return TraceOut(run_id=run_id, spans=[SpanOut.of(s) for s in spans])

    @router.post("/runs/{run_id}/cancel", response_model=RunStatusOut, responses=documented(404),
                 summary="Cancel a run")
    async def cancel(run_id: RunId) -> RunStatusOut:
        """An idle run is cancelled at once; a run executing a step ends after that step
        (its status stays active until then)."""
        status = await runs.cancel_async(run_id)
        return RunStatusOut(id=run_id, status=status)

    @router.post("/runs/{run_id}/replay", response_model=RunStatusOut,
                 responses=documented(404, 409), summary="Replay a failed or cancelled run")
    async def replay(run_id: RunId) -> RunStatusOut:
        await runs.replay_async(run_id)
        run = await runs.get_async(run_id)
        return RunStatusOut(id=run_id, status=run.status)

    @router.post("/runs/{run_id}/rerun", response_model=RerunOut, responses=documented(404, 413, 415),
                 summary="Fork a new run from a step")
    async def rerun(run_id: RunId, body: RerunIn) -> RerunOut:
        """A new run keeping the steps before `step_id` and re-executing from it."""
        new = await runs.rerun_from_async(run_id, body.step_id)
        return RerunOut(id=new, rerun_of=run_id, step_id=body.step_id)

    async def bulk(kind: str, body: CancelManyIn, statuses: tuple[str, ...] = ()) -> JobOut:
        lo, hi = parse_moment(body.since, "since"), parse_moment(body.until, "until")
        check_range(lo, hi)
        if body.if_ is not None:
            compile_expression(body.if_, field="if")
        await known_function(body.function_id)
        request = BulkRequest(kind, body.function_id, lo, hi, body.if_, statuses)
        return JobOut.of(await state.jobs.start(request))

    @router.post("/runs/cancel-many", response_model=JobOut, status_code=HTTP_202_ACCEPTED,
                 responses=documented(413, 415), summary="Cancel many runs (a background job)")
    async def cancel_many(body: CancelManyIn) -> JobOut:
        """Starts a job cancelling the function's active runs created in
        [since, until) whose first event satisfies `if`; follow it at /api/v1/jobs/{id}."""
        return await bulk(CANCEL_MANY, body)

    @router.post("/runs/replay-many", response_model=JobOut, status_code=HTTP_202_ACCEPTED,
                 responses=documented(413, 415), summary="Replay many runs (a background job)")
    async def replay_many(body: ReplayManyIn) -> JobOut:
        """Starts a job replaying the function's runs with the given statuses (default
        failed); follow it at /api/v1/jobs/{id}."""
        return await bulk(REPLAY_MANY, body, tuple(body.status))

    return router
