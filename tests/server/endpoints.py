"""Endpoints serving apps over signed HTTP for the server's tests: real
uvicorn servers on loopback threads running ``ss.serve`` (or a hand-made
answer), which a test can redeploy, stop and start again on the same port."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import uvicorn

import stepstone as ss
from stepstone.endpoint import Scope
from stepstone.signing import SIGNATURE_HEADER, SigningKeys, sign
from tests.server.conftest import free_port, run_asgi

KEY = "server-and-endpoint-key-0001"
OTHER = "some-other-signing-key-0002"
Asgi = Callable[..., Any]


class Endpoint:
    """A real HTTP endpoint (uvicorn on a thread) whose code can be redeployed
    (``deploy``), stopped and started again on the same port."""

    def __init__(self, asgi: Asgi) -> None:
        self.current = asgi
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/api/stepstone"
        self.server: uvicorn.Server | None = None
        self.thread: threading.Thread | None = None
        self.start()

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        await self.current(scope, receive, send)

    def deploy(self, asgi: Asgi) -> None:
        self.current = asgi

    def start(self) -> None:
        _url, self.server, self.thread = run_asgi(self, self.port)

    def stop(self) -> None:
        assert self.server is not None and self.thread is not None
        self.server.should_exit = True
        self.thread.join(timeout=30)
        assert not self.thread.is_alive()
        self.server = None


def served(*function_ids: str, name: str = "store-front", version: str = "v1") -> ss.App:
    """The code an endpoint serves: never opens its database."""
    app = ss.App(name, database_url="sqlite:///never-opened.db", app_version=version)
    for function_id in function_ids:
        app.function(id=function_id, trigger=ss.on_event(f"{function_id}/go"))(lambda ctx: None)
    return app


def serving(*function_ids: str, key: str = KEY, fallback: str | None = None, **kwargs: Any) -> Asgi:
    return ss.serve(served(*function_ids, **kwargs), signing_key=key, signing_key_fallback=fallback)


def raw_endpoint(document: dict[str, Any], *, signed: bool = True) -> Asgi:
    """An endpoint answering ``document`` whatever it is asked (signed or not)."""
    body = json.dumps(document).encode()
    headers = [(b"content-type", b"application/json")]
    if signed:
        headers.append((SIGNATURE_HEADER.lower().encode(), sign(body, SigningKeys.of(KEY)).encode()))

    async def asgi(scope: Scope, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return asgi
