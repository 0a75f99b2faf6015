"""``GET /api/v1/functions``: every function registered in the database;
``POST /api/v1/functions/{id}/invoke``: start a run of one function directly."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Path

from stepstone.errors import NotFoundError
from stepstone.inventory import list_functions
from stepstone.runtime import prepare_invoke, start_invoked
from stepstone.server.errors import documented
from stepstone.server.schemas import FunctionList, FunctionOut, InvokeIn, InvokeOut
from stepstone.server.state import ServerState
from stepstone.store.base import Tx


def build(state: ServerState) -> APIRouter:
    router = state.router("functions")

    @router.get("/functions", response_model=FunctionList, summary="Registered functions")
    async def functions() -> FunctionList:
        """Each function with its triggers and configuration (flow control, retries,
        back-off, timeouts), as the app that registered it declared them."""
        infos = await state.app.store.read(list_functions)
        return FunctionList(functions=[FunctionOut.of(info) for info in infos])

    @router.post(
        "/functions/{function_id}/invoke",
        response_model=InvokeOut,
        responses=documented(404, 413),
        summary="Invoke a function",
    )
    async def invoke(
        function_id: Annotated[str, Path(description="A registered function")],
        body: Annotated[InvokeIn, Body()],
    ) -> InvokeOut:
        """Start a run of this function alone, whatever its triggers, with `data` as
        its event's data (the event is `stepstone/function.invoked`), through its
        flow control, as `step.invoke` does."""
        app = state.app
        registry = app.catalog.registry(app.store)
        fn = registry.get(function_id)
        if fn is None:
            raise NotFoundError(f"no function {function_id!r} (or it is retired)")
        now = app.clock.now()
        event = prepare_invoke(body.data, now, "data")

        def op(tx: Tx) -> str | None:
            return start_invoked(tx, fn, event, now, registry)

        return InvokeOut(event_id=event.id, run_id=await app.store.transact(op))

    return router
