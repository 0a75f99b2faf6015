"""What every dashboard page shares: the template environment, the session
check (a page without a valid session redirects to the login form), rendering
with security headers, and small formatting filters."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape

from stepstone.inventory import human_bytes
from stepstone.server.sessions import COOKIE, Session
from stepstone.server.state import ServerState

HERE = Path(__file__).parent
STATIC_DIR = HERE / "static"
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; "
    "base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
NAV = (
    ("runs", "/", "Runs"),
    ("functions", "/functions", "Functions"),
    ("events", "/events", "Events"),
    ("bulk", "/bulk", "Bulk actions"),
    ("workers", "/workers", "Workers"),
    ("apps", "/apps", "Apps"),
    ("database", "/database", "Database"),
)


class LoginRequired(Exception):
    """Raised by ``session_of`` when a page needs a login."""


def base_path(request: Request) -> str:
    return str(request.scope.get("root_path", "")).rstrip("/")


def session_of(state: ServerState, request: Request) -> Session | None:
    """The request's session; ``LoginRequired`` if the server needs one and there
    is none. ``None`` when the server runs without keys."""
    sessions = state.sessions
    if sessions is None or not sessions.required:
        return None
    session = sessions.read(request.cookies.get(COOKIE))
    if session is None:
        raise LoginRequired
    return session


async def _to_login(request: Request, exc: Exception) -> Response:
    here = request.url.path[len(base_path(request)) :] or "/"
    if request.url.query:
        here += "?" + request.url.query
    target = f"{base_path(request)}/login?next={quote(here, safe='')}"
    return RedirectResponse(target, status_code=303, headers={"Cache-Control": "no-store"})


def install_handlers(api: FastAPI) -> None:
    api.add_exception_handler(LoginRequired, _to_login)


# -- formatting -------------------------------------------------------------------------------
def _when(value: datetime | float | None) -> str:
    if value is None:
        return "—"
    moment = value if isinstance(value, datetime) else datetime.fromtimestamp(value, UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") + " UTC"


def _iso(value: datetime | float | None) -> str:
    if value is None:
        return ""
    moment = value if isinstance(value, datetime) else datetime.fromtimestamp(value, UTC)
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def seconds(value: float | None) -> str:
    """A duration for people: 850 ms, 3.2 s, 4 m 05 s, 2 h 10 m."""
    if value is None:
        return "—"
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 60:
        return f"{value:.1f} s"
    if value < 3600:
        return f"{int(value // 60)} m {int(value % 60):02d} s"
    if value < 86400:
        return f"{int(value // 3600)} h {int(value % 3600 // 60):02d} m"
    return f"{int(value // 86400)} d {int(value % 86400 // 3600):02d} h"


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)


def _environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(when=_when, iso=_iso, seconds=seconds, pretty=_pretty, fromjson=json.loads)
    env.filters.update(filesize=human_bytes)
    return env


TEMPLATES = _environment()


def render(
    request: Request,
    template: str,
    session: Session | None,
    *,
    active: str = "",
    status_code: int = 200,
    **context: Any,
) -> HTMLResponse:
    """A page with the shared layout's context and the security headers."""
    html = TEMPLATES.get_template(template).render(
        base=base_path(request),
        csrf=session.csrf if session else "",
        signed_in=session is not None,
        nav=NAV,
        active=active,
        request=request,
        **context,
    )
    return HTMLResponse(html, status_code=status_code, headers=SECURITY_HEADERS)
