"""Encryption of step data at rest (optional extra ``stepstone[crypto]``).

``EncryptionMiddleware`` encrypts, with AES-256-GCM, every step output, the
function's output and ``event.data["encrypted"]`` of every event written on a
user's behalf (``app.send``, ``step.send_event``, ``step.invoke``'s data: all
pass through ``before_send_events``), so keys and expressions on the other
event fields keep working. What the engine writes from these (a child's
output forwarded to its parent, the system events that embed a run's event
or output) copies the envelopes, never the plaintext. Stored values become
envelopes ``{"__stepstone_encrypted__": 1, "kid": ..., "data": ...}``; the store,
the API and the dashboard only ever see those.

Rotation: encrypt with ``key``; decrypt with whichever of ``key`` and
``fallback_keys`` the envelope's key id names. ``decrypt_only=True`` stops
encrypting new data (to migrate away) while old data stays readable. A value
that no listed key can decrypt fails the run with a non-retriable
``EncryptionError`` instead of handing ciphertext to the handler.

Keys are 32 random bytes, or any string (hashed with SHA-256 into a key:
use a long random secret).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from stepstone import serde
from stepstone.errors import NonRetriableError
from stepstone.events import Event
from stepstone.middleware import Middleware

if TYPE_CHECKING:
    from stepstone.context import Context

MARKER = "__stepstone_encrypted__"
KeyInput = str | bytes


class EncryptionError(NonRetriableError):
    """Encrypted data could not be decrypted with any configured key."""


def is_encrypted(value: Any) -> bool:
    """Whether ``value`` is an encryption envelope."""
    return isinstance(value, dict) and value.get(MARKER) == 1


MAX_SHOWN_DEPTH = 100  # deeper than events may nest (64); outputs are cut here
TOO_DEEP = "(nested too deeply to show)"


def mask(value: Any, depth: int = 0) -> Any:
    """``value`` with every envelope replaced by the string ``"encrypted"`` (how the
    API and the dashboard show ciphertext), and whatever nests deeper than
    ``MAX_SHOWN_DEPTH`` replaced by ``TOO_DEEP``, so that no stored value (an
    event accepted before nesting was bounded, a deep output) makes a page fail
    with ``RecursionError`` here or in the serializers after it."""
    if is_encrypted(value):
        return "encrypted"
    if isinstance(value, dict | list) and depth >= MAX_SHOWN_DEPTH:
        return TOO_DEEP
    if isinstance(value, dict):
        return {k: mask(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [mask(v, depth + 1) for v in value]
    return value


def shown(text: str | None) -> Any:
    """Stored JSON as the API and the dashboard show it (see ``mask``)."""
    try:
        return mask(serde.loads(text))
    except RecursionError:  # nested beyond what the JSON decoder can follow
        return TOO_DEEP


def _key_bytes(key: KeyInput) -> bytes:
    if isinstance(key, bytes):
        if len(key) != 32:
            raise ValueError("an encryption key given as bytes must be 32 bytes (AES-256)")
        return key
    if not isinstance(key, str) or not key:
        raise ValueError("an encryption key must be 32 bytes or a non-empty string")
    return hashlib.sha256(key.encode()).digest()


class _Key:
    def __init__(self, key: KeyInput) -> None:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        raw = _key_bytes(key)
        self.id = hashlib.sha256(b"stepstone-kid" + raw).hexdigest()[:12]
        self.aead = AESGCM(raw)


class EncryptionMiddleware(Middleware):
    """Encrypt step outputs, function outputs and ``event.data["encrypted"]``."""

    def __init__(
        self, key: KeyInput, fallback_keys: Sequence[KeyInput] = (), decrypt_only: bool = False
    ) -> None:
        self.primary = _Key(key)
        self.keys = {k.id: k for k in [self.primary, *(_Key(f) for f in fallback_keys)]}
        self.decrypt_only = decrypt_only

    # -- envelopes -----------------------------------------------------------------------
    def encrypt(self, value: Any) -> dict[str, Any]:
        nonce = os.urandom(12)
        plain = json.dumps(value, separators=(",", ":")).encode()
        sealed = self.primary.aead.encrypt(nonce, plain, MARKER.encode())
        return {MARKER: 1, "kid": self.primary.id, "data": base64.b64encode(nonce + sealed).decode()}

    def decrypt(self, envelope: dict[str, Any], what: str) -> Any:
        from cryptography.exceptions import InvalidTag

        try:
            blob = base64.b64decode(envelope["data"])
        except (KeyError, ValueError) as exc:
            raise EncryptionError(f"{what}: malformed encrypted value") from exc
        preferred = self.keys.get(str(envelope.get("kid")))
        for key in [preferred] if preferred else list(self.keys.values()):
            try:
                plain = key.aead.decrypt(blob[:12], blob[12:], MARKER.encode())
            except InvalidTag:
                continue
            return json.loads(plain)
        raise EncryptionError(
            f"{what}: cannot decrypt with the configured keys (wrong key, or a rotated key "
            f"missing from fallback_keys; key id {envelope.get('kid')!r})"
        )

    def reveal(self, value: Any, what: str) -> Any:
        """Decrypt every envelope inside ``value``."""
        if is_encrypted(value):
            return self.decrypt(value, what)
        if isinstance(value, dict):
            return {k: self.reveal(v, what) for k, v in value.items()}
        if isinstance(value, list):
            return [self.reveal(v, what) for v in value]
        return value

    # -- hooks ---------------------------------------------------------------------------
    def transform_input(self, ctx: Context, steps: dict[str, Any]) -> dict[str, Any]:
        ctx.events = [Event(e.name, self.reveal(e.data, f"event {e.name!r}"), e.id, e.ts) for e in ctx.events]
        ctx.event = ctx.events[0]
        return {step_id: self.reveal(value, f"step {step_id!r}") for step_id, value in steps.items()}

    def transform_output(self, ctx: Context, output: Any, step_id: str | None) -> Any:
        return output if self.decrypt_only else self.encrypt(output)

    def before_send_events(self, ctx: Context | None, events: list[Event]) -> list[Event]:
        if self.decrypt_only:
            return events
        return [
            Event(e.name, {**e.data, "encrypted": self.encrypt(e.data["encrypted"])}, e.id, e.ts)
            if "encrypted" in e.data and not is_encrypted(e.data["encrypted"])
            else e
            for e in events
        ]
