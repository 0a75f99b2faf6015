"""A live HTTP server (uvicorn on a loopback port, in a background thread) over a
real SQLite store, and an httpx client that speaks to it."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import uvicorn

import stepstone as ss
from stepstone.server.auth import AuthConfig
from stepstone.server.factory import WorkerSettings, create_app

API_KEY = "test-api-key"
EVENT_KEY = "test-event-key"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Live:
    """A running server: its URL, the app it serves, a client with the API key."""

    url: str
    app: ss.App
    http: httpx.Client
    server: uvicorn.Server
    thread: threading.Thread

    def stop(self) -> None:
        self.http.close()
        self.server.should_exit = True
        self.thread.join(timeout=30)
        assert not self.thread.is_alive(), "server did not stop"


def run_asgi(api: Any, port: int | None = None) -> tuple[str, uvicorn.Server, threading.Thread]:
    """Serve an ASGI app with uvicorn on a loopback port, in a background thread,
    once it accepts connections: its URL, the server and the thread."""
    port = port or free_port()
    config = uvicorn.Config(api, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive(), "server thread died"
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.01)
    return f"http://127.0.0.1:{port}", server, thread


def start_server(
    app: ss.App, *, auth: AuthConfig | None = None, workers: bool = False, **options: Any
) -> Live:
    api = create_app(
        app,
        auth or AuthConfig((API_KEY,), (EVENT_KEY,)),
        workers=WorkerSettings(concurrency=4, drain_timeout=5) if workers else None,
        **options,
    )
    url, server, thread = run_asgi(api)
    http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30)
    return Live(url, app, http, server, thread)


@pytest.fixture
def serve() -> Iterator[Callable[..., Live]]:
    """Start servers over given apps; all are stopped at the end of the test."""
    started: list[Live] = []

    def start(app: ss.App, **kwargs: Any) -> Live:
        live = start_server(app, **kwargs)
        started.append(live)
        return live

    yield start
    for live in started:
        live.stop()


def poll(predicate: Callable[[], Any], timeout: float = 15.0, what: str = "condition") -> Any:
    """Poll ``predicate`` until truthy, with a deadline (no fixed sleeps)."""
    deadline = time.monotonic() + timeout
    interval = 0.005
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(interval)
        interval = min(interval * 2, 0.1)


# -- a served app with functions and in-process workers ------------------------------------------
@dataclass
class Shop:
    """``shop`` (greet, flaky) served with workers; ``parked`` registered by another
    app that runs no workers, so its runs stay queued."""

    live: Live
    app: ss.App
    other: ss.App
    switches: dict[str, bool]

    @property
    def http(self) -> httpx.Client:
        return self.live.http

    def send(self, name: str, data: dict[str, Any] | None = None, **fields: Any) -> str:
        response = self.http.post("/api/v1/events", json={"name": name, "data": data or {}, **fields})
        assert response.status_code == 200, response.text
        [event_id] = response.json()["ids"]
        return str(event_id)

    def run_of(self, event_id: str) -> dict[str, Any]:
        runs = self.http.get("/api/v1/runs", params={"event_id": event_id}).json()["runs"]
        assert len(runs) == 1, runs
        return dict(runs[0])

    def wait(self, run_id: str, statuses: tuple[str, ...] = ("completed", "failed", "cancelled")) -> Any:
        def ended() -> Any:
            run = self.http.get(f"/api/v1/runs/{run_id}").json()
            return run if run["status"] in statuses else None

        return poll(ended, what=f"run {run_id} to end")


def shop_app(url: str, switches: dict[str, bool]) -> ss.App:
    app = ss.App("shop", database_url=url)

    @app.function(id="greet", trigger=ss.on_event("hello"))
    async def greet(ctx: ss.Context) -> str:
        await ctx.step.run("first", lambda: 1)
        name = await ctx.step.run("second", lambda: ctx.event.data.get("name", "?"))
        return f"hi {name}"

    def fragile() -> str:
        if switches["broken"]:
            raise ss.NonRetriableError("kaboom")
        return "fixed"

    @app.function(id="flaky", trigger=ss.on_event("boom"), retries=0)
    async def flaky(ctx: ss.Context) -> str:
        await ctx.step.run("before", lambda: "ok")
        return str(await ctx.step.run("fragile", fragile))

    return app


@pytest.fixture
def shop(serve: Callable[..., Live], db_url: str) -> Iterator[Shop]:
    switches = {"broken": True}
    app = shop_app(db_url, switches)
    other = ss.App("elsewhere", database_url=db_url)
    other.function(id="parked", trigger=ss.on_event("park"), concurrency=ss.Concurrency(limit=2))(
        lambda ctx: None
    )
    other.store  # noqa: B018 - registers "parked" in the database
    live = serve(app, workers=True)
    yield Shop(live, app, other, switches)
    live.stop()  # its workers use the app's store: stop them before closing it
    app.close()
    other.close()


# -- endpoints serving apps over signed HTTP (tests/server/endpoints.py) --------------------------
@pytest.fixture
def endpoint() -> Iterator[Callable[..., Any]]:
    """Start real endpoints (``endpoints.Endpoint``); all are stopped at the end."""
    from tests.server.endpoints import Endpoint

    started: list[Endpoint] = []

    def start(asgi: Any) -> Endpoint:
        started.append(Endpoint(asgi))
        return started[-1]

    yield start
    for one in started:
        if one.server is not None:
            one.stop()
