"""``GET /healthz``: liveness and a database check; open (no key needed)."""

from __future__ import annotations

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse

from stepstone.errors import StoreError
from stepstone.server.schemas import Health
from stepstone.server.state import ServerState
from stepstone.store.base import RunsTx


def _ping(tx: RunsTx) -> None:
    tx.get_run("")  # one indexed read: the database answers


def build(state: ServerState) -> APIRouter:
    router = APIRouter(tags=["health"])

    @router.get(
        "/healthz",
        response_model=Health,
        responses={503: {"model": Health}},
        summary="Liveness and database check (no key needed)",
    )
    async def healthz() -> Response:
        dialect = state.app.database_url.split(":", 1)[0]
        try:
            await state.app.store.read(_ping)
        except StoreError as exc:
            body = Health(status="unavailable", database=dialect, error=str(exc))
            return JSONResponse(body.model_dump(), status_code=503)
        return JSONResponse(Health(status="ok", database=dialect).model_dump())

    return router
