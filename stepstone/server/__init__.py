"""The HTTP API (FastAPI). ``ss.asgi(app)`` builds it for mounting in an
existing ASGI application; ``stepstone server`` and ``stepstone dev`` serve it.

Importing this package does not import FastAPI; ``asgi`` does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastapi import FastAPI

    from stepstone.app import App


def asgi(
    app: App, *, api_key: str | None = None, event_key: str | None = None, insecure_no_auth: bool = False
) -> FastAPI:
    """The Stepstone HTTP API over ``app``, as an ASGI application.

    Keys default to ``$STEPSTONE_API_KEY`` / ``$STEPSTONE_EVENT_KEY``; without an
    API key this raises ``ConfigError`` unless ``insecure_no_auth=True``. Mounted
    in another application, its lifespan does not run: background jobs still
    work, and a job whose process dies shows as ``interrupted`` once stale.
    """
    from stepstone.server.auth import AuthConfig
    from stepstone.server.factory import create_app

    return create_app(app, AuthConfig.resolve(api_key, event_key, insecure=insecure_no_auth))
