"""Route classes: checks that run before FastAPI reads or validates a request.

``guarded(auth, scope)`` checks the bearer key first (401 whatever the body),
then refuses query parameters the route does not declare (422 naming the
parameter), so a misspelt filter never silently widens a listing.

Given a ``SessionKeeper``, a request without an ``Authorization`` header may
instead carry the dashboard's session cookie; a state-changing request made so
must also carry the session's CSRF token (403 otherwise).

Each guarded operation names its key in the OpenAPI schema (``x-stepstone-key``).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException

from stepstone.errors import ConfigError
from stepstone.server.auth import AuthConfig, Scope
from stepstone.server.sessions import COOKIE, CSRF_HEADER, SAFE_METHODS, SessionKeeper

Handler = Callable[[Request], Coroutine[Any, Any, Response]]
KEY_EXTENSION = "x-stepstone-key"  # in OpenAPI: "api" or "ingest"; absent on open operations


def _check_query(request: Request, known: frozenset[str]) -> None:
    for name in request.query_params:
        if name not in known:
            expected = ", ".join(sorted(known)) or "none"
            raise ConfigError(name, f"unknown query parameter (expected: {expected})")


def _by_session(request: Request, sessions: SessionKeeper | None) -> bool:
    """Whether the dashboard's session cookie authenticates the request (a
    bearer header, when present, always decides instead)."""
    if sessions is None or "authorization" in request.headers:
        return False
    session = sessions.read(request.cookies.get(COOKIE))
    if session is None:
        return False
    if request.method not in SAFE_METHODS and not sessions.check_csrf(
        session, request.headers.get(CSRF_HEADER)
    ):
        raise HTTPException(403, "missing or invalid CSRF token (send the X-CSRF-Token header)")
    return True


def guarded(auth: AuthConfig, scope: Scope, sessions: SessionKeeper | None = None) -> type[APIRoute]:
    """A route class whose handlers check the key (or the session), then the query
    parameter names."""

    class GuardedRoute(APIRoute):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            if not auth.open:  # the docs page says which key each operation needs
                kwargs["openapi_extra"] = {**(kwargs.get("openapi_extra") or {}), KEY_EXTENSION: scope.value}
            super().__init__(*args, **kwargs)

        def get_route_handler(self) -> Handler:
            handler = super().get_route_handler()
            known = frozenset(p.alias for p in self.dependant.query_params)

            async def checked(request: Request) -> Response:
                if not _by_session(request, sessions):
                    auth.check(request.headers.get("authorization"), scope)
                _check_query(request, known)
                return await handler(request)

            return checked

    return GuardedRoute
