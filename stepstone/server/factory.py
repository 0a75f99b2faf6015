"""The FastAPI application: routers, error handlers, body cap, lifespan."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from importlib import metadata
from typing import TYPE_CHECKING

from fastapi import FastAPI

from stepstone import limits
from stepstone.errors import StoreError
from stepstone.pusher import Pusher, PushSettings
from stepstone.server import dashboard, errors
from stepstone.server.auth import AuthConfig
from stepstone.server.body import BodyLimit
from stepstone.server.jobs import JobRunner
from stepstone.server.loopback import LoopbackOnly
from stepstone.server.routes import (
    apps,
    bulk,
    event_log,
    events,
    functions,
    health,
    jobs,
    run_actions,
    runs,
    stats,
    workers,
)
from stepstone.server.routes import metrics as metrics_route
from stepstone.server.sessions import SessionKeeper
from stepstone.server.state import ServerState
from stepstone.signing import SigningKeys

if TYPE_CHECKING:
    from stepstone.app import App

log = logging.getLogger("stepstone.server")
_ROUTERS = (
    events,
    runs,
    run_actions,
    bulk,
    jobs,
    functions,
    apps,
    workers,
    health,
    metrics_route,
    event_log,
    stats,
)


@dataclass(frozen=True)
class WorkerSettings:
    """In-process workers hosted by the server's event loop (``stepstone dev``)."""

    concurrency: int = 10
    drain_timeout: float = 10.0


def _version() -> str:
    try:
        return metadata.version("stepstone")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a checkout
        return "0"


def create_app(
    app: App,
    auth: AuthConfig,
    *,
    workers: WorkerSettings | None = None,
    max_body: int = limits.MAX_REQUEST_BYTES,
    job_heartbeat: float = 5.0,
    job_stale_after: float = 30.0,
    signing: SigningKeys | None = None,
    push: PushSettings | None = None,
) -> FastAPI:
    """The HTTP API and the dashboard over ``app`` (which needs no functions:
    events are matched through the catalog of functions registered in the database).
    ``signing`` signs requests to apps served over HTTP (``ss.serve``): with it,
    the server executes their runs (``pusher.py``, bounded by ``push``)."""
    state = ServerState(
        app,
        auth,
        JobRunner(app, heartbeat=job_heartbeat, stale_after=job_stale_after),
        SessionKeeper(auth),
        signing=signing,
    )

    @contextlib.asynccontextmanager
    async def lifespan(_api: FastAPI) -> AsyncIterator[None]:
        try:
            await state.jobs.sweep()
        except StoreError as exc:
            log.warning("could not check for interrupted jobs: %s", exc)
        if workers is not None:
            await app.start_async(concurrency=workers.concurrency)
        pusher = None
        if signing is not None:
            pusher = Pusher(
                store=app.store,
                clock=app.clock,
                catalog=lambda: app.catalog.registry(app.store),
                keys=signing,
                settings=push,
            )
            await pusher.start()
        state.pusher = pusher
        try:
            yield
        finally:
            if pusher is not None:
                await pusher.stop()
            await state.jobs.shutdown()
            if workers is not None:
                await app.stop_async(workers.drain_timeout)

    api = FastAPI(
        title="Stepstone",
        version=_version(),
        lifespan=lifespan,
        description="Send events and manage durable runs. Every endpoint but /healthz "
        "needs `Authorization: Bearer <key>`"
        + (" (this server runs without keys: every endpoint is open)." if auth.open else "."),
        docs_url=None,  # Swagger UI and ReDoc load from a CDN: dashboard.api_docs serves /docs
        redoc_url=None,
    )
    errors.install(api)
    for module in _ROUTERS:
        api.include_router(module.build(state))
    dashboard.install(api, state)
    api.add_middleware(BodyLimit, max_bytes=max_body)
    if auth.open:
        api.add_middleware(LoopbackOnly)
    api.state.stepstone = state
    return api
