"""The runs page (filters, counts per status, charts, a live list with cursor
pages) and the run page (header, actions, the starting event, the trace
waterfall)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from fastapi import APIRouter, Request
from fastapi.responses import Response

from stepstone.encryption import mask, shown
from stepstone.errors import ConfigError, NotFoundError
from stepstone.inventory import list_functions
from stepstone.runs import Run, Span
from stepstone.server import insights
from stepstone.server.dashboard import charts, filters, waterfall
from stepstone.server.dashboard.web import render, session_of
from stepstone.server.insights import Timeline
from stepstone.server.params import encode_cursor
from stepstone.server.routes.stats import check_window
from stepstone.server.search import EventQuery, search_op
from stepstone.server.state import ServerState
from stepstone.store.base import RunsTx
from stepstone.store.rows import ACTIVE_STATUSES, RUN_STATUSES, EventRow, RunFilter, RunStatus

PAGE = 50


@dataclass(frozen=True)
class RunView:
    run: Run
    spans: list[Span]
    events: list[EventRow]


async def _view(state: ServerState, run_id: str) -> RunView:
    run = await state.app.runs.get_async(run_id)
    spans = await state.app.runs.trace_async(run_id)

    def events(tx: RunsTx) -> list[EventRow]:
        return tx.get_events(run_id)

    return RunView(run, spans, await state.app.store.read(events))


def _divergence(view: RunView) -> dict[str, object] | None:
    """Why a paused run stopped: the latest ``paused`` warning of its trace."""
    if view.run.status != RunStatus.PAUSED:
        return None
    found = [s.detail for s in view.spans if s.kind == "warning" and s.name == "paused"]
    return found[-1] if found and isinstance(found[-1], dict) else None


async def _timeline(state: ServerState, query: filters.RunQuery, now: float) -> Timeline | None:
    """The charts' data for the filters (the last day when unbounded); ``None``
    when the range cannot be charted (empty, over 366 days, absurd bounds)."""
    until = query.until if query.until is not None else now
    since = query.since if query.since is not None else until - insights.HOUR * 24
    try:
        check_window(since, until)
    except ConfigError:
        return None
    return await state.app.store.read(insights.timeline_op(query.function_id or None, since, until, 48))


def build(state: ServerState) -> APIRouter:
    router = APIRouter(include_in_schema=False)
    store = state.app.store

    @router.get("/")
    async def runs_page(request: Request) -> Response:
        session = session_of(state, request)
        now = state.app.clock.now()
        functions = [f.id for f in await store.read(list_functions)]
        query = filters.parse(request, now, set(functions))
        where = RunFilter(
            function_id=query.function_id or None,
            statuses=(query.status,) if query.status else (),
            since=query.since,
            until=query.until,
            before_id=query.before,
            app_version=query.app_version or None,
        )
        found = await store.read(search_op(where, EventQuery(query.q or None, query.condition), PAGE))
        counts = await store.read(
            insights.status_counts_op(query.function_id or None, query.since, query.until)
        )
        timeline = await _timeline(state, query, now)
        return render(
            request,
            "runs.html",
            session,
            active="runs",
            query=query,
            runs=found.runs,
            next_cursor=encode_cursor(found.cursor) if found.cursor else None,
            examined=found.examined,
            counts=counts,
            functions=functions,
            statuses=RUN_STATUSES,
            ranges=filters.RANGES,
            charts=charts.all_charts(timeline) if timeline else [],
            charts_have_data=timeline is not None and charts.has_data(timeline.buckets),
            now=now,
        )

    @router.get("/runs/{run_id}")
    async def run_page(request: Request, run_id: str) -> Response:
        session = session_of(state, request)
        try:
            view = await _view(state, run_id)
        except NotFoundError:
            return render(
                request, "missing.html", session, status_code=404, what=f"There is no run {run_id!r}."
            )
        now = datetime.fromtimestamp(state.app.clock.now(), UTC)
        events = [(e, shown(e.data)) for e in view.events]
        trace = waterfall.layout(view.run, view.spans, now, events[0][1] if events else None)
        return render(
            request,
            "run.html",
            session,
            active="runs",
            run=view.run,
            trace=trace,
            events=events,
            live=view.run.status in ACTIVE_STATUSES,
            replayable=view.run.status in (RunStatus.FAILED, RunStatus.CANCELLED),
            cancellable=view.run.status in ACTIVE_STATUSES,
            resumable=view.run.status == RunStatus.PAUSED,
            divergence=_divergence(view),
            steps=[s.id for s in view.run.steps],
            output=mask(view.run.output),
        )

    return router
