"""A cap on request bodies, enforced as the body is read.

Nothing is read here: the receive channel is wrapped so that a declared
``Content-Length`` over the limit, or a body that grows over it, fails the first
read that would pass the limit with 413. Routes check the key before they read
(``routing.guarded``), so a request without a key gets 401 whatever it
declares, even if its body never arrives.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        await self.app(scope, self._capped(_content_length(scope), receive), send)

    def _capped(self, declared: int | None, receive: Receive) -> Receive:
        size = 0

        async def capped() -> Message:
            nonlocal size
            if declared is not None and declared > self.max_bytes:
                raise self._over()
            message = await receive()
            if message["type"] == "http.request":
                size += len(message.get("body", b""))
                if size > self.max_bytes:
                    raise self._over()
            return message

        return capped

    def _over(self) -> HTTPException:
        return HTTPException(413, f"request body over the limit of {self.max_bytes} bytes")


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
