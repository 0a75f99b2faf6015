"""``GET /api/v1/functions``: every function registered in the database."""

from __future__ import annotations

from fastapi import APIRouter

from stepstone.inventory import list_functions
from stepstone.server.schemas import FunctionList, FunctionOut
from stepstone.server.state import ServerState


def build(state: ServerState) -> APIRouter:
    router = state.router("functions")

    @router.get("/functions", response_model=FunctionList, summary="Registered functions")
    async def functions() -> FunctionList:
        """Each function with its triggers and configuration (flow control, retries,
        back-off, timeouts), as the app that registered it declared them."""
        infos = await state.app.store.read(list_functions)
        return FunctionList(functions=[FunctionOut.of(info) for info in infos])

    return router
