"""The web dashboard: server-rendered pages (Jinja2) with a little hand-written
JavaScript for live refresh, confirmations and actions.

Pages read the store through the same operations as the JSON API; actions
(replay, cancel, rerun, bulk jobs) are the JSON API itself, called by the
page's script with the session cookie and the session's CSRF token.

``install(api, state)`` adds the pages, the login form, the API reference
(``/docs``, rendered offline from the OpenAPI schema) and ``/static``.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from stepstone.server.dashboard import api_docs, login, overview_pages, run_pages
from stepstone.server.dashboard.web import STATIC_DIR, install_handlers
from stepstone.server.state import ServerState


def install(api: FastAPI, state: ServerState) -> None:
    install_handlers(api)
    api.include_router(login.build(state))
    api.include_router(api_docs.build())
    api.include_router(run_pages.build(state))
    api.include_router(overview_pages.build(state))
    api.mount("/static", StaticFiles(directory=STATIC_DIR), name="dashboard-static")
