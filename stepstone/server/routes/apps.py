"""``/api/v1/apps``: apps served over HTTP (``ss.serve``), registered by URL.
``POST`` syncs one (the server fetches its signed function list and registers
its functions), ``GET`` lists them with their last sync and error, ``DELETE``
unregisters one (its functions are retired)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Query

from stepstone.appsync import sync_app, unregister_app
from stepstone.server.errors import documented
from stepstone.server.schemas import AppIn, AppList, AppOut
from stepstone.server.state import ServerState


def build(state: ServerState) -> APIRouter:
    router = state.router("apps")

    @router.post(
        "/apps", response_model=AppOut, responses=documented(409, 502), summary="Register or sync an app"
    )
    async def sync(body: Annotated[AppIn, Body()]) -> AppOut:
        """Fetch the signed list of functions the endpoint at `url` serves and
        register them (re-syncing retires those it no longer serves). 502 if the
        endpoint cannot be reached, refuses the server's signature or answers
        unsigned or invalid; 409 if a function id or the app's name belongs to
        another app (or this server has no signing key). Nothing is registered
        on failure; an app registered before keeps the failure as its `error`."""
        app = state.app
        row = await sync_app(app.store, state.signing, app.clock, body.url)
        app.catalog.invalidate()
        return AppOut.of(row)

    @router.get("/apps", response_model=AppList, summary="Apps served over HTTP")
    async def apps() -> AppList:
        """Each app registered by URL: its functions, last good sync and last error."""
        rows = await state.app.store.read(lambda tx: tx.list_apps())
        return AppList(apps=[AppOut.of(row) for row in rows])

    @router.delete("/apps", response_model=AppOut, responses=documented(404), summary="Unregister an app")
    async def unregister(
        url: Annotated[str, Query(min_length=1, description="The URL the app was registered with")],
    ) -> AppOut:
        """Forget the app and retire its functions: events start no new runs of
        them. Runs already started drain: the server keeps calling the URL until
        each ends (an endpoint that no longer serves the function fails it)."""
        app = state.app
        row = await unregister_app(app.store, app.clock, url)
        app.catalog.invalidate()
        return AppOut.of(row)

    return router
