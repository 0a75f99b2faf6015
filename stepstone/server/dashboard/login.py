"""The login form (the API key in, a signed session cookie out) and logout.
Failed logins are throttled per client address (``throttle.LoginThrottle``)."""

from __future__ import annotations

from urllib.parse import parse_qs

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from stepstone.server.dashboard.web import SECURITY_HEADERS, base_path, render
from stepstone.server.sessions import COOKIE, SessionKeeper
from stepstone.server.state import ServerState
from stepstone.server.throttle import LoginThrottle

MAX_FORM = 8192


def safe_next(value: str | None) -> str:
    """Only a path on this site: never another origin (``//host``, ``/\\host``, a scheme)."""
    if not value or not value.startswith("/") or value.startswith(("//", "/\\")):
        return "/"
    return value if all(ch.isprintable() for ch in value) else "/"


async def _form(request: Request) -> dict[str, str]:
    body = await request.body()
    if len(body) > MAX_FORM:
        return {}
    parsed = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
    return {name: values[0] for name, values in parsed.items()}


def _cookie(request: Request, response: Response, token: str, sessions: SessionKeeper) -> None:
    response.set_cookie(
        COOKIE,
        token,
        max_age=int(sessions.ttl),
        path=base_path(request) or "/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


def _too_many(request: Request, target: str, wait: int) -> Response:
    response = render(
        request,
        "login.html",
        None,
        next=target,
        status_code=429,
        error=f"Too many failed attempts from your address: try again in {wait} s.",
    )
    response.headers["Retry-After"] = str(wait)
    return response


def build(state: ServerState) -> APIRouter:
    router = APIRouter(include_in_schema=False)
    sessions = state.sessions
    throttle = LoginThrottle()

    @router.get("/login")
    async def login_form(request: Request, next: str | None = None) -> Response:
        if sessions is None or not sessions.required:
            return RedirectResponse(base_path(request) + safe_next(next), status_code=303)
        return render(request, "login.html", None, next=safe_next(next), error=None)

    @router.post("/login")
    async def login(request: Request) -> Response:
        form = await _form(request)
        target = safe_next(form.get("next"))
        if sessions is None or not sessions.required:
            return RedirectResponse(base_path(request) + target, status_code=303)
        address = request.client.host if request.client else "unknown"
        wait = throttle.retry_after(address)
        if wait is not None:
            return _too_many(request, target, wait)
        token = sessions.login(form.get("api_key", ""))
        if token is None:
            throttle.failed(address)
            return render(
                request,
                "login.html",
                None,
                next=target,
                status_code=401,
                error="That key is not valid. Use the server's API key (an event key cannot sign in).",
            )
        response = RedirectResponse(base_path(request) + target, status_code=303, headers=SECURITY_HEADERS)
        _cookie(request, response, token, sessions)
        return response

    @router.post("/logout")
    async def logout(request: Request) -> Response:
        form = await _form(request)
        response = RedirectResponse(base_path(request) + "/login", status_code=303, headers=SECURITY_HEADERS)
        if sessions is None:
            return response
        session = sessions.read(request.cookies.get(COOKIE))
        if session is not None:
            if not sessions.check_csrf(session, form.get("csrf")):
                return Response("missing or invalid CSRF token", status_code=403, media_type="text/plain")
            sessions.revoke(session)
        response.delete_cookie(
            COOKIE,
            path=base_path(request) or "/",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response

    return router
