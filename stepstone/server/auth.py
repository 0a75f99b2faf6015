"""Bearer-key authentication.

Two kinds of key: an *event key* that may only send events (``POST
/api/v1/events``), and an *API key* that may do everything, sending included.
Keys come from flags or ``STEPSTONE_API_KEY`` / ``STEPSTONE_EVENT_KEY``; a
comma-separated list allows rotation. Tokens are compared in constant time.

Routes opt in through their router's ``route_class`` (``routing.guarded``),
which checks the key *before* the request body is read or validated: an
unauthenticated request gets 401 whatever its body, and changes nothing.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from fastapi.security import HTTPBearer

from stepstone.errors import AuthenticationError, ConfigError

API_KEY_ENV = "STEPSTONE_API_KEY"
EVENT_KEY_ENV = "STEPSTONE_EVENT_KEY"

# Only documents the scheme in OpenAPI; ``routing.guarded`` routes enforce it.
bearer = HTTPBearer(
    auto_error=False,
    scheme_name="bearer",
    description="`Authorization: Bearer <key>`: the API key, or for POST /api/v1/events the event key",
)


class Scope(Enum):
    INGEST = "ingest"  # sending events: event key or API key
    API = "api"  # everything else: API key only


def _keys(raw: str | None) -> tuple[str, ...]:
    return tuple(k.strip() for k in (raw or "").split(",") if k.strip())


@dataclass(frozen=True)
class AuthConfig:
    api_keys: tuple[str, ...] = ()
    event_keys: tuple[str, ...] = ()
    insecure: bool = False

    @classmethod
    def resolve(
        cls,
        api_key: str | None = None,
        event_key: str | None = None,
        *,
        insecure: bool = False,
        env: Mapping[str, str] = os.environ,
    ) -> AuthConfig:
        """Keys from the arguments, else the environment. Without an API key,
        refuse (``ConfigError``) unless ``insecure`` is set explicitly."""
        config = cls(
            _keys(api_key or env.get(API_KEY_ENV)), _keys(event_key or env.get(EVENT_KEY_ENV)), insecure
        )
        if not config.api_keys and not insecure:
            raise ConfigError(
                "api_key",
                f"no API key: set ${API_KEY_ENV} (and optionally "
                f"${EVENT_KEY_ENV}) or pass --insecure-no-auth explicitly",
            )
        return config

    @property
    def open(self) -> bool:
        return self.insecure and not self.api_keys

    def check(self, authorization: str | None, scope: Scope) -> None:
        """Raise ``AuthenticationError`` unless the header carries a key valid for ``scope``."""
        if self.open:
            return
        token = _bearer_token(authorization)
        if token is None:
            raise AuthenticationError("missing bearer key: send 'Authorization: Bearer <key>'")
        allowed = self.api_keys + (self.event_keys if scope is Scope.INGEST else ())
        if not _matches(token, allowed):
            raise AuthenticationError(
                "invalid key"
                if scope is Scope.INGEST or not _matches(token, self.event_keys)
                else "an event key may only send events; use the API key"
            )


def _bearer_token(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def _matches(token: str, keys: tuple[str, ...]) -> bool:
    """Compare against every key (no early exit), each in constant time."""
    given = token.encode()
    found = False
    for key in keys:
        found |= hmac.compare_digest(given, key.encode())
    return found
