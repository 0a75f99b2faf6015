"""The functions page (triggers, flow control, live load, backlog per
concurrency key), the events page (each event and the runs it started), the
workers page, the apps page (apps served over HTTP: their functions, last sync
and error; the script syncs one or adds a URL), the database page (rows and bytes per table, the oldest ended
run) and the bulk actions page (filters, a server-side preview of the
count, recent jobs; the script starts the job and follows it)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from stepstone.errors import ConfigError
from stepstone.inventory import database_stats, list_functions
from stepstone.server import insights
from stepstone.server.dashboard import filters
from stepstone.server.dashboard.web import render, session_of
from stepstone.server.params import encode_cursor
from stepstone.server.routes.event_log import event_seq, with_runs
from stepstone.server.state import ServerState
from stepstone.server.view_schemas import EventOut
from stepstone.store.base import ViewsTx
from stepstone.store.rows import ACTIVE_STATUSES, RunStatus

EVENTS_PAGE = 50
WORKERS_WITHIN = 86400.0
STALE_AFTER = 60.0
BULK_ACTIONS = (
    ("replay-failed", "Replay failed runs"),
    ("replay-cancelled", "Replay cancelled runs"),
    ("cancel", "Cancel active runs"),
    ("resume", "Resume paused runs"),
)


def build(state: ServerState) -> APIRouter:
    router = APIRouter(include_in_schema=False)
    store = state.app.store

    @router.get("/functions")
    async def functions_page(request: Request) -> Response:
        session = session_of(state, request)
        loads = await store.read(insights.functions_op(state.app.clock.now()))
        return render(request, "functions.html", session, active="functions", loads=loads)

    @router.get("/events")
    async def events_page(request: Request) -> Response:
        session = session_of(state, request)
        name = request.query_params.get("name", "").strip()
        try:
            before = event_seq(request.query_params.get("cursor") or None)
        except ConfigError:
            before = None

        def op(tx: ViewsTx) -> tuple[list[EventOut], bool]:
            rows = tx.list_events(name or None, None, before, EVENTS_PAGE + 1)
            return with_runs(tx, rows[:EVENTS_PAGE]), len(rows) > EVENTS_PAGE

        events, more = await store.read(op)
        cursor = encode_cursor(str(events[-1].seq)) if more and events else None
        return render(
            request, "events.html", session, active="events", events=events, name=name, next_cursor=cursor
        )

    @router.get("/workers")
    async def workers_page(request: Request) -> Response:
        session = session_of(state, request)
        now = state.app.clock.now()
        rows = await store.read(lambda tx: tx.list_workers(now - WORKERS_WITHIN))
        return render(
            request, "workers.html", session, active="workers", workers=rows, now=now, stale_after=STALE_AFTER
        )

    @router.get("/apps")
    async def apps_page(request: Request) -> Response:
        session = session_of(state, request)
        rows = await store.read(lambda tx: tx.list_apps())
        return render(
            request, "apps.html", session, active="apps", apps=rows, signing=state.signing is not None
        )

    @router.get("/database")
    async def database_page(request: Request) -> Response:
        session = session_of(state, request)
        stats = await store.read(database_stats)
        tables = sorted(stats.tables, key=lambda t: -(t.bytes or 0))
        return render(request, "database.html", session, active="database", stats=stats, tables=tables)

    @router.get("/bulk")
    async def bulk_page(request: Request) -> Response:
        session = session_of(state, request)
        now = state.app.clock.now()
        functions = [f.id for f in await store.read(list_functions)]
        query = filters.parse(request, now, set(functions))
        action = request.query_params.get("action", "replay-failed")
        action = action if action in dict(BULK_ACTIONS) else "replay-failed"
        preview = None
        if query.function_id and not query.errors:
            statuses = {
                "cancel": ACTIVE_STATUSES,
                "replay-failed": (RunStatus.FAILED,),
                "replay-cancelled": (RunStatus.CANCELLED,),
                "resume": (RunStatus.PAUSED,),
            }[action]
            preview = await store.read(
                insights.preview_op(query.function_id, statuses, query.since, query.until, query.condition)
            )
        jobs = await state.jobs.list(10)
        return render(
            request,
            "bulk.html",
            session,
            active="bulk",
            query=query,
            functions=functions,
            ranges=filters.RANGES,
            actions=BULK_ACTIONS,
            action=action,
            preview=preview,
            jobs=jobs,
        )

    return router
