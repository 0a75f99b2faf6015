"""``GET /api/v1/workers``: live workers."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from stepstone.server.schemas import WorkerList, WorkerOut
from stepstone.server.state import ServerState


def build(state: ServerState) -> APIRouter:
    router = state.router("workers")

    @router.get("/workers", response_model=WorkerList, summary="Live workers")
    async def workers(
        alive_within: Annotated[
            float, Query(gt=0, le=86400, description="Seconds since the last heartbeat")
        ] = 60.0,
    ) -> WorkerList:
        since = state.app.clock.now() - alive_within
        rows = await state.app.store.read(lambda tx: tx.list_workers(since))
        return WorkerList(workers=[WorkerOut.of(row) for row in rows])

    return router
