"""Route classes: checks that run before FastAPI reads or validates a request.

``guarded(auth, scope)`` checks the bearer key first (401 whatever the body),
then refuses query parameters the route does not declare (422 naming the
parameter), so a misspelt filter never silently widens a listing.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from stepstone.errors import ConfigError
from stepstone.server.auth import AuthConfig, Scope

Handler = Callable[[Request], Coroutine[Any, Any, Response]]


def _check_query(request: Request, known: frozenset[str]) -> None:
    for name in request.query_params:
        if name not in known:
            expected = ", ".join(sorted(known)) or "none"
            raise ConfigError(name, f"unknown query parameter (expected: {expected})")


def guarded(auth: AuthConfig, scope: Scope) -> type[APIRoute]:
    """A route class whose handlers check the key, then the query parameter names."""

    class GuardedRoute(APIRoute):
        def get_route_handler(self) -> Handler:
            handler = super().get_route_handler()
            known = frozenset(p.alias for p in self.dependant.query_params)

            async def checked(request: Request) -> Response:
                auth.check(request.headers.get("authorization"), scope)
                _check_query(request, known)
                return await handler(request)

            return checked

    return GuardedRoute
