"""Guards for a server without keys (``--insecure-no-auth``).

Without a key, the only protection left is that the server listens on a
loopback address. Two browser attacks get around that, and both are refused
here with 403 before any route runs:

- DNS rebinding: a page on ``evil.example`` re-points its name at 127.0.0.1
  and then reads the API as same-origin. Its requests still carry
  ``Host: evil.example``, so only loopback hosts are accepted (``localhost``,
  ``*.localhost``, 127.0.0.0/8, ``::1``).
- Cross-site requests: any page may POST to ``http://127.0.0.1:8288``. A
  state-changing request whose ``Origin`` is not this server, or whose
  ``Sec-Fetch-Site`` is not ``same-origin``/``none``, is refused. Clients
  that send neither header (curl, the CLI) are not browsers and pass.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from stepstone.server.errors import error_response
from stepstone.server.sessions import SAFE_METHODS


class LoopbackOnly:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            problem = refusal(scope["method"], _headers(scope))
            if problem is not None:
                await error_response(403, "Forbidden", problem)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def refusal(method: str, headers: dict[str, str]) -> str | None:
    """Why a request to a keyless server is refused, or ``None`` if it may pass."""
    host = headers.get("host", "")
    if not is_loopback(_hostname(host)):
        return f"Host {host!r} is not a loopback name; a server without keys answers only localhost"
    if method in SAFE_METHODS:
        return None
    origin = headers.get("origin")
    if origin is not None and urlsplit(origin).netloc != host:
        return f"cross-site request refused: Origin {origin!r} is not this server"
    fetch_site = headers.get("sec-fetch-site")
    if fetch_site is not None and fetch_site not in ("same-origin", "none"):
        return f"cross-site request refused (Sec-Fetch-Site: {fetch_site})"
    return None


def is_loopback(hostname: str) -> bool:
    name = hostname.lower().rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _hostname(host: str) -> str:
    if host.startswith("["):  # [::1]:8288
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if host.count(":") == 1 else host


def _headers(scope: Scope) -> dict[str, str]:
    return {name.decode("latin-1"): value.decode("latin-1") for name, value in scope.get("headers", ())}
