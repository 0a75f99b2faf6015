"""``ss.serve(app)``: an app's functions behind one HTTP endpoint, for hosts
where no long-lived worker runs (serverless functions, a web app behind a load
balancer). ``stepstone server`` calls it; it never opens a database.

Every request must be signed (``signing.py``) or it gets 401 before anything
runs. ``GET`` answers with the app's functions (``introspection.py``), which
the server registers in its catalog; ``POST`` carries one invocation of a run.
Answers are signed with the same key, so the server can trust them.

The endpoint is a plain ASGI callable (FastAPI and Starlette mount it); no web
framework is needed to serve it."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

from stepstone import limits
from stepstone.introspection import describe_app
from stepstone.signing import SIGNATURE_HEADER, SignatureError, SigningKeys, sign, verify

if TYPE_CHECKING:
    from stepstone.app import App

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

DEFAULT_MAX_DURATION = 60.0  # seconds: inside common serverless request limits
_HEADER = SIGNATURE_HEADER.lower().encode()


class _TooLarge(Exception):
    pass


async def _read_body(receive: Receive, cap: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > cap:
            raise _TooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


class Endpoint:
    """The request handling shared by the ASGI and WSGI faces: (method, signature
    header, body) in, (status, body, signature header) out."""

    def __init__(self, app: App, keys: SigningKeys, max_duration: float) -> None:
        self.app = app
        self.keys = keys
        self.max_duration = max_duration

    def _answer(self, status: int, payload: Any) -> tuple[int, bytes, str]:
        body = json.dumps(payload, separators=(",", ":")).encode()
        return status, body, sign(body, self.keys)

    def introspect(self) -> tuple[int, bytes, str]:
        document = describe_app(
            self.app.name,
            self.app.registry,
            app_version=self.app.app_version,
            max_duration=self.max_duration,
        )
        return self._answer(200, document.to_json())

    async def handle(self, method: str, signature: str | None, body: bytes) -> tuple[int, bytes, str]:
        try:
            verify(signature, body, self.keys)
        except SignatureError as exc:
            return self._answer(401, {"error": "unauthorized", "message": str(exc)})
        if method == "GET":
            return self.introspect()
        if method == "POST":
            return self._answer(
                501, {"error": "not_implemented", "message": "invocations are not served yet"}
            )
        return self._answer(405, {"error": "method_not_allowed", "message": f"{method} is not served"})


def serve(
    app: App,
    *,
    signing_key: str,
    signing_key_fallback: str | None = None,
    max_duration: float = DEFAULT_MAX_DURATION,
) -> ASGIApp:
    """An ASGI app serving ``app``'s functions to ``stepstone server`` over signed HTTP."""
    endpoint = Endpoint(app, SigningKeys.of(signing_key, signing_key_fallback), max_duration)

    async def asgi(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            return
        headers = dict(scope.get("headers") or [])
        signature = headers.get(_HEADER, b"").decode("latin-1") or None
        try:
            body = await _read_body(receive, limits.MAX_REQUEST_BYTES)
        except _TooLarge:
            status, payload, signed = endpoint._answer(
                413, {"error": "too_large", "message": "body too large"}
            )
        else:
            status, payload, signed = await endpoint.handle(scope["method"], signature, body)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
                    (_HEADER, signed.encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})

    return asgi
