"""Signed HTTP between ``stepstone server`` and the functions it serves by URL.

Every request and every response carries ``X-Stepstone-Signature:
t=<unix seconds>,s=<hex HMAC-SHA256 of "<t>.<raw body>">``. A receiver accepts
it only if the signature matches the current key or the fallback key (so a key
rotates without downtime on either side) and ``t`` is within five minutes of
its own clock, so a captured request cannot be replayed later. Comparisons are
constant-time."""

from __future__ import annotations

import hashlib
import hmac
import os
import time
from dataclasses import dataclass

from stepstone.errors import ConfigError, StepstoneError

SIGNATURE_HEADER = "X-Stepstone-Signature"
SIGNING_KEY_ENV = "STEPSTONE_SIGNING_KEY"
SIGNING_KEY_FALLBACK_ENV = "STEPSTONE_SIGNING_KEY_FALLBACK"
TOLERANCE = 300.0  # seconds either side of the receiver's clock
MIN_KEY_LENGTH = 16


class SignatureError(StepstoneError):
    """A signature is missing, malformed, wrong or outside the time window."""


def _checked(field: str, key: str | None) -> str | None:
    if key is None:
        return None
    if not isinstance(key, str) or len(key.strip()) < MIN_KEY_LENGTH:
        raise ConfigError(field, f"a signing key must be a string of at least {MIN_KEY_LENGTH} characters")
    return key.strip()


@dataclass(frozen=True, kw_only=True)
class SigningKeys:
    """The key that signs, and the one also accepted while a rotation is under way."""

    current: str
    fallback: str | None = None

    @classmethod
    def of(cls, signing_key: str, signing_key_fallback: str | None = None) -> SigningKeys:
        """Validated keys; ``ConfigError`` names the bad field."""
        current = _checked("signing_key", signing_key)
        if current is None:
            raise ConfigError("signing_key", "a signing key is required")
        return cls(current=current, fallback=_checked("signing_key_fallback", signing_key_fallback))

    @classmethod
    def from_env(
        cls, signing_key: str | None = None, signing_key_fallback: str | None = None
    ) -> SigningKeys | None:
        """The given keys, else ``$STEPSTONE_SIGNING_KEY`` (and its fallback); ``None`` if neither is set."""
        key = signing_key or os.environ.get(SIGNING_KEY_ENV) or None
        fallback = signing_key_fallback or os.environ.get(SIGNING_KEY_FALLBACK_ENV) or None
        if key is None:
            if fallback is not None:
                raise ConfigError("signing_key", "a fallback key was given without a signing key")
            return None
        return cls.of(key, fallback)

    def accepted(self) -> tuple[str, ...]:
        return (self.current,) if self.fallback is None else (self.current, self.fallback)


def _digest(key: str, stamp: str, body: bytes) -> str:
    return hmac.new(key.encode(), stamp.encode() + b"." + body, hashlib.sha256).hexdigest()


def sign(body: bytes, keys: SigningKeys, now: float | None = None) -> str:
    """The header value signing ``body`` with the current key at ``now``."""
    stamp = str(int(time.time() if now is None else now))
    return f"t={stamp},s={_digest(keys.current, stamp, body)}"


def verify(header: str | None, body: bytes, keys: SigningKeys, now: float | None = None) -> None:
    """Return if ``header`` signs ``body`` with an accepted key within the window;
    otherwise raise ``SignatureError`` saying why (never which key was tried)."""
    if not header:
        raise SignatureError(f"missing {SIGNATURE_HEADER} header")
    parts: dict[str, str] = {}
    for item in header.split(","):
        name, sep, value = item.strip().partition("=")
        if not sep or name in parts:
            raise SignatureError(f"malformed {SIGNATURE_HEADER} header")
        parts[name] = value
    stamp, given = parts.get("t", ""), parts.get("s", "")
    if not stamp.isdigit() or not given or set(parts) != {"t", "s"}:
        raise SignatureError(f"malformed {SIGNATURE_HEADER} header")
    clock = time.time() if now is None else now
    if abs(clock - int(stamp)) > TOLERANCE:
        raise SignatureError("stale signature: its time is more than 5 minutes from this clock")
    matched = False
    for key in keys.accepted():  # every key is tried, so timing does not tell which matched
        matched |= hmac.compare_digest(_digest(key, stamp, body), given.lower())
    if not matched:
        raise SignatureError("signature does not match")
