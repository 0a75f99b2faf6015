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


def start_server(app: ss.App, *, auth: AuthConfig | None = None, workers: bool = False,
                 **options: Any) -> Live:
    port = free_port()
    api = create_app(app, auth or AuthConfig((API_KEY,), (EVENT_KEY,)),
                     workers=WorkerSettings(concurrency=4, drain_timeout=5) if workers else None,
                     **options)
    config = uvicorn.Config(api, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive(), "server thread died"
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.01)
    url = f"http://127.0.0.1:{port}"
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
