"""Reading the event log: events newest first with the runs each started, and
the events of one run."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from stepstone.errors import ConfigError, NotFoundError
from stepstone.server.errors import documented
from stepstone.server.params import decode_cursor, encode_cursor
from stepstone.server.routes.runs import RunId
from stepstone.server.state import ServerState
from stepstone.server.view_schemas import EventOut, EventPage
from stepstone.store.base import Tx, ViewsTx
from stepstone.store.rows import EventRow


def event_seq(cursor: str | None) -> int | None:
    before = decode_cursor(cursor)
    if before is None:
        return None
    if not before.isdigit() or len(before) > 18:
        raise ConfigError("cursor", "malformed cursor; pass a previous page's next_cursor unchanged")
    return int(before)


def with_runs(tx: ViewsTx, rows: list[EventRow]) -> list[EventOut]:
    links = tx.event_runs([r.seq for r in rows])
    return [EventOut.of(row, [link for link in links if link.event_seq == row.seq]) for row in rows]


def build(state: ServerState) -> APIRouter:
    router = state.router("events")

    @router.get("/events", response_model=EventPage, summary="The event log, newest first")
    async def list_events(
        name: Annotated[str | None, Query(description="Only events with this name")] = None,
        event_id: Annotated[str | None, Query(description="Only events with this id")] = None,
        limit: Annotated[int, Query(ge=1, le=500)] = 50,
        cursor: Annotated[str | None, Query(description="`next_cursor` of the previous page")] = None,
    ) -> EventPage:
        """Each event with the runs it started (or joined: batches, debounces)."""
        before = event_seq(cursor)

        def op(tx: ViewsTx) -> EventPage:
            rows = tx.list_events(name, event_id, before, limit + 1)
            page = rows[:limit]
            more = len(rows) > limit
            return EventPage(
                events=with_runs(tx, page), next_cursor=encode_cursor(str(page[-1].seq)) if more else None
            )

        return await state.app.store.read(op)

    @router.get(
        "/runs/{run_id}/events",
        response_model=EventPage,
        responses=documented(404),
        summary="The events of a run",
    )
    async def run_events(run_id: RunId) -> EventPage:
        """The event(s) a run was started with, first one first."""

        def op(tx: Tx) -> EventPage:
            if tx.get_run(run_id) is None:
                raise NotFoundError(f"no run {run_id!r}")
            return EventPage(events=with_runs(tx, tx.get_events(run_id)))

        return await state.app.store.read(op)

    return router
