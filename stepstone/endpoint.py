"""``ss.serve(app)``: an app's functions behind one HTTP endpoint, for hosts
where no long-lived worker runs (serverless functions, a web app behind a load
balancer). ``stepstone server`` calls it; it never opens a database.

Every request must be signed (``signing.py``) or it gets 401 before anything
runs. ``GET`` answers with the app's functions (``introspection.py``), which
the server registers in its catalog; ``POST`` carries one invocation of a run.
Answers are signed with the same key, so the server can trust them.

The endpoint is a plain ASGI callable (FastAPI and Starlette mount it), or a
WSGI one (``serve_wsgi``: Flask, Django); no web framework is needed to serve
it. An invocation is ``endpoint_invoke.py``."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from stepstone import limits
from stepstone.bodies import BodyTooLarge, read_capped
from stepstone.bridge import Portal
from stepstone.clock import SYSTEM_CLOCK
from stepstone.endpoint_invoke import EndpointEnv, invoke
from stepstone.introspection import describe_app
from stepstone.signing import SIGNATURE_HEADER, SignatureError, SigningKeys, sign, verify
from stepstone.wire import WireError, decode_request

if TYPE_CHECKING:
    from stepstone.app import App

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

log = logging.getLogger("stepstone.endpoint")
DEFAULT_MAX_DURATION = 60.0  # seconds: inside common serverless request limits
THREADS = 256
_HEADER = SIGNATURE_HEADER.lower().encode()


_TOO_LARGE = {"error": "too_large", "message": f"body over {limits.MAX_PUSH_BYTES} bytes"}


async def _chunks(receive: Receive) -> AsyncIterator[bytes]:
    """An ASGI request's body, message by message."""
    while True:
        message = await receive()
        yield message.get("body", b"")
        if not message.get("more_body", False):
            return


class Endpoint:
    """The request handling shared by the ASGI and WSGI faces: (method, signature
    header, body) in, (status, body, signature header) out."""

    def __init__(self, app: App, keys: SigningKeys, max_duration: float) -> None:
        self.app = app
        self.keys = keys
        self.max_duration = max_duration
        # Sync handlers and their sync steps run here, as in a worker: a handler's
        # thread waits for its step's, so the pool is far above the requests the
        # server keeps open to one app (``--push-concurrency``, 32); made lazily.
        self.threads = ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="stepstone-endpoint")
        self.env = EndpointEnv(app.registry, SYSTEM_CLOCK, self.threads, app.middleware)

    def _signed(self, status: int, body: bytes) -> tuple[int, bytes, str]:
        return status, body, sign(body, self.keys)

    async def invoke(self, body: bytes) -> tuple[int, bytes, str]:
        """Run one invocation (``endpoint_invoke.py``) and answer what to commit."""
        try:
            leased, request_id = decode_request(body)
        except WireError as exc:
            return self._answer(400, {"error": "bad_request", "message": str(exc)})
        try:
            answer = await invoke(leased, request_id, self.env, self.max_duration)
        except Exception as exc:
            log.exception("run %s: the invocation failed", leased.run.id)
            return self._answer(500, {"error": "internal", "message": f"{type(exc).__name__}: {exc}"})
        return self._signed(200, answer.encode())

    def _answer(self, status: int, payload: Any) -> tuple[int, bytes, str]:
        return self._signed(status, json.dumps(payload, separators=(",", ":")).encode())

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
            return await self.invoke(body)
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
            body = await read_capped(_chunks(receive), limits.MAX_PUSH_BYTES)
        except BodyTooLarge:
            status, payload, signed = endpoint._answer(413, _TOO_LARGE)
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


WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def serve_wsgi(
    app: App,
    *,
    signing_key: str,
    signing_key_fallback: str | None = None,
    max_duration: float = DEFAULT_MAX_DURATION,
) -> WSGIApp:
    """``serve`` as a WSGI app (Flask, Django): each request's invocation runs on
    one event loop of the endpoint's own (a ``Portal`` thread), sync handlers on
    its thread pool, while the WSGI server's thread waits for the answer."""
    endpoint = Endpoint(app, SigningKeys.of(signing_key, signing_key_fallback), max_duration)
    portal = Portal("stepstone-endpoint")

    def wsgi(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        if length > limits.MAX_PUSH_BYTES:
            status, payload, signed = endpoint._answer(413, _TOO_LARGE)
        else:
            body = environ["wsgi.input"].read(length) if length > 0 else b""
            signature = environ.get("HTTP_" + SIGNATURE_HEADER.upper().replace("-", "_")) or None
            status, payload, signed = portal.call(endpoint.handle(environ["REQUEST_METHOD"], signature, body))
        start_response(
            f"{status} {HTTPStatus(status).phrase}",
            [
                ("Content-Type", "application/json"),
                ("Content-Length", str(len(payload))),
                (SIGNATURE_HEADER, signed),
            ],
        )
        return [payload]

    return wsgi
