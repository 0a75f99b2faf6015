"""Dashboard sessions: signed cookies instead of the API key, and CSRF tokens.

Logging in with the API key sets a cookie holding ``<expiry>.<nonce>.<mac>``,
an HMAC-SHA256 over expiry and nonce with a secret derived from the API key
(never the key itself). Every server holding the same key accepts the same
sessions; changing the key ends them. ``STEPSTONE_API_KEY=new,old`` (rotation)
signs with ``new`` and still accepts sessions signed with ``old``.

A session's CSRF token is an HMAC of its nonce: pages embed it and scripts send
it back in the ``X-CSRF-Token`` header on every state-changing request made
with the cookie. Logging out revokes the nonce in this process (until the
session would have expired anyway) and clears the cookie.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from stepstone.server.auth import AuthConfig, _matches

COOKIE = "stepstone_session"
CSRF_HEADER = "x-csrf-token"
DEFAULT_TTL = 12 * 3600.0
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_CONTEXT = b"stepstone-dashboard-session-v1"


@dataclass(frozen=True)
class Session:
    nonce: str
    expires: int
    csrf: str


def _mac(secret: bytes, message: str) -> str:
    digest = hmac.new(secret, message.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


class SessionKeeper:
    """Issues, reads and revokes dashboard sessions for an ``AuthConfig``."""

    def __init__(
        self, auth: AuthConfig, *, ttl: float = DEFAULT_TTL, clock: Callable[[], float] = time.time
    ) -> None:
        self.auth = auth
        self.ttl = ttl
        self.clock = clock
        self._secrets = [hmac.new(key.encode(), _CONTEXT, hashlib.sha256).digest() for key in auth.api_keys]
        self._revoked: dict[str, float] = {}

    @property
    def required(self) -> bool:
        """Whether pages need a login (not when serving with ``--insecure-no-auth``)."""
        return not self.auth.open

    def login(self, api_key: str) -> str | None:
        """A new session token if ``api_key`` is an API key (constant time), else ``None``."""
        if not self._secrets or not _matches(api_key.strip(), self.auth.api_keys):
            return None
        expires = int(self.clock() + self.ttl)
        nonce = secrets.token_urlsafe(18)
        payload = f"{expires}.{nonce}"
        return f"{payload}.{_mac(self._secrets[0], payload)}"

    def read(self, token: str | None) -> Session | None:
        """The session a cookie value proves, or ``None`` (forged, expired, revoked)."""
        if not token or token.count(".") != 2:
            return None
        expires_text, nonce, mac = token.split(".")
        payload = f"{expires_text}.{nonce}"
        secret = next((s for s in self._secrets if hmac.compare_digest(_mac(s, payload), mac)), None)
        if secret is None or not expires_text.isdigit():
            return None
        expires = int(expires_text)
        if expires <= self.clock() or nonce in self._revoked:
            return None
        return Session(nonce, expires, _mac(secret, f"csrf:{nonce}"))

    def check_csrf(self, session: Session, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(session.csrf.encode(), given.encode())

    def revoke(self, session: Session) -> None:
        now = self.clock()
        self._revoked = {n: exp for n, exp in self._revoked.items() if exp > now}
        self._revoked[session.nonce] = session.expires
