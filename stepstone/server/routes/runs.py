"""Reading runs: list (filters, cursor pages), one run, its trace, its history."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query

from stepstone.expressions import compile_expression
from stepstone.server.errors import documented
from stepstone.server.params import check_range, decode_cursor, encode_cursor, parse_moment
from stepstone.server.schemas import RunOut, RunPage, RunStatus, SpanOut, TraceOut
from stepstone.server.search import EventQuery, search_op
from stepstone.server.state import ServerState
from stepstone.store.rows import RunFilter

RunId = Annotated[str, Path(description="A run id")]
TIME_HELP = "RFC 3339 date-time or epoch seconds"


def build(state: ServerState) -> APIRouter:
    router = state.router("runs")
    runs = state.app.runs

    @router.get("/runs", response_model=RunPage, summary="List runs, newest first")
    async def list_runs(
        function_id: Annotated[str | None, Query(description="Only this function's runs")] = None,
        status: Annotated[list[RunStatus] | None, Query(description="Any of these statuses")] = None,
        event_id: Annotated[str | None, Query(description="Runs this event triggered")] = None,
        since: Annotated[str | None, Query(description=f"Created at or after: {TIME_HELP}")] = None,
        until: Annotated[str | None, Query(description=f"Created before: {TIME_HELP}")] = None,
        limit: Annotated[int, Query(ge=1, le=500)] = 50,
        cursor: Annotated[str | None, Query(description="`next_cursor` of the previous page")] = None,
        q: Annotated[
            str | None,
            Query(description="Text in the run id or its event's id, name or data (case-insensitive)"),
        ] = None,
        if_: Annotated[str | None, Query(alias="if", description="CEL over the run's `event`")] = None,
        app_version: Annotated[
            str | None, Query(description="Runs last run by this version of the app")
        ] = None,
    ) -> RunPage:
        """With `q` or `if`, at most 2000 runs are examined per page: a page may hold
        fewer runs than `limit` and still have a `next_cursor` to search on."""
        lo, hi = parse_moment(since, "since"), parse_moment(until, "until")
        check_range(lo, hi)
        before = decode_cursor(cursor)
        if function_id is not None:
            await state.require_function(function_id)
        event_query = EventQuery(q, None if if_ is None else compile_expression(if_, field="if"))
        if event_query.active:
            where = RunFilter(
                function_id=function_id,
                statuses=tuple(status or ()),
                event_id=event_id,
                since=lo,
                until=hi,
                before_id=before,
                app_version=app_version,
            )
            hits = await state.app.store.read(search_op(where, event_query, limit))
            return RunPage(
                runs=[RunOut.of(r) for r in hits.runs],
                next_cursor=encode_cursor(hits.cursor) if hits.cursor else None,
            )
        found = await runs.list_async(
            function_id=function_id,
            status=status,
            event_id=event_id,
            since=lo,
            until=hi,
            limit=limit + 1,
            before=before,
            app_version=app_version,
        )
        page, more = found[:limit], len(found) > limit
        return RunPage(
            runs=[RunOut.of(r) for r in page], next_cursor=encode_cursor(page[-1].id) if more else None
        )

    @router.get("/runs/{run_id}", response_model=RunOut, responses=documented(404), summary="A run")
    async def get_run(run_id: RunId) -> RunOut:
        return RunOut.of(await runs.get_async(run_id))

    @router.get(
        "/runs/{run_id}/trace",
        response_model=TraceOut,
        responses=documented(404),
        summary="Every span of a run",
    )
    async def trace(run_id: RunId) -> TraceOut:
        spans = await runs.trace_async(run_id)
        return TraceOut(run_id=run_id, spans=[SpanOut.of(s) for s in spans])

    @router.get(
        "/runs/{run_id}/history",
        responses=documented(404),
        summary="A run's history, as app.check(histories=[...]) replays it",
    )
    async def history(run_id: RunId) -> dict[str, Any]:
        """The document `app.runs.export` returns: events and steps as stored
        (encrypted values stay encrypted); see docs/versioning.md."""
        return await runs.export_async(run_id)

    return router
