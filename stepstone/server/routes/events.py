"""``POST /api/v1/events``: record one event or a list; returns their ids."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body

from stepstone.server.auth import Scope
from stepstone.server.errors import documented
from stepstone.server.schemas import EventsIn, SendResult
from stepstone.server.state import ServerState


def build(state: ServerState) -> APIRouter:
    router = state.router("events", Scope.INGEST)

    @router.post("/events", response_model=SendResult, responses=documented(413, 415), summary="Send events")
    async def send_events(events: Annotated[EventsIn, Body()]) -> SendResult:
        """Record events and start the runs they trigger (every function registered in
        the database, with its flow control). An id seen in the last 24 h starts
        nothing new. A list is all-or-nothing: one invalid event rejects the list."""
        batch = events if isinstance(events, list) else [events]
        ids = await state.app.send_async([e.to_event() for e in batch])
        return SendResult(ids=ids)

    return router
