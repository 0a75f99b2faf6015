"""What every route needs: the client ``App``, the auth policy, the job runner."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fastapi import APIRouter, Security

from stepstone.inventory import require_function
from stepstone.pusher import Pusher
from stepstone.server.auth import AuthConfig, Scope, bearer
from stepstone.server.errors import documented
from stepstone.server.jobs import JobRunner
from stepstone.server.routing import guarded
from stepstone.server.sessions import SessionKeeper
from stepstone.signing import SigningKeys

if TYPE_CHECKING:
    from stepstone.app import App

API_PREFIX = "/api/v1"


@dataclass
class ServerState:
    app: App
    auth: AuthConfig
    jobs: JobRunner
    sessions: SessionKeeper | None = None  # the dashboard's cookie also opens the API
    signing: SigningKeys | None = None  # signs requests to apps served over HTTP
    pusher: Pusher | None = None  # executes their runs (set while the server runs)

    async def require_function(self, function_id: str) -> None:
        """``ConfigError`` naming ``function_id`` unless some app registered it."""
        await self.app.store.read(lambda tx: require_function(tx, function_id))

    def router(self, tag: str, scope: Scope = Scope.API, prefix: str = API_PREFIX) -> APIRouter:
        """A router whose routes check the bearer key for ``scope`` first."""
        return APIRouter(
            prefix=prefix,
            tags=[tag],
            route_class=guarded(self.auth, scope, self.sessions),
            dependencies=[] if self.auth.open else [Security(bearer)],
            responses=documented(400, 401, 422) if not self.auth.open else documented(400, 422),
        )
