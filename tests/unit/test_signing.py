"""Signatures of requests and answers between the server and an endpoint."""

from __future__ import annotations

import pytest

from stepstone.errors import ConfigError
from stepstone.signing import SignatureError, SigningKeys, sign, verify

KEYS = SigningKeys.of("k" * 16)
NOW = 1_800_000_000.0


def test_a_signed_body_verifies_and_any_change_fails() -> None:
    header = sign(b'{"a":1}', KEYS, NOW)
    verify(header, b'{"a":1}', KEYS, NOW)
    with pytest.raises(SignatureError, match="does not match"):
        verify(header, b'{"a":2}', KEYS, NOW)
    stamp, digest = header.split(",")
    with pytest.raises(SignatureError, match="does not match"):
        verify(f"t={int(NOW) + 1},{digest}", b'{"a":1}', KEYS, NOW)  # the time is signed too
    with pytest.raises(SignatureError, match="does not match"):
        verify(f"{stamp},s={'0' * 64}", b'{"a":1}', KEYS, NOW)


@pytest.mark.parametrize(
    "header", [None, "", "t=1", "s=ab", "t=x,s=ab", "t=1,s=ab,t=2", "t=1,s=ab,x=3", "garbage"]
)
def test_a_missing_or_malformed_header_is_refused(header: str | None) -> None:
    with pytest.raises(SignatureError, match="missing|malformed"):
        verify(header, b"", KEYS, NOW)


def test_a_stale_or_future_signature_is_refused_at_five_minutes() -> None:
    verify(sign(b"x", KEYS, NOW - 299), b"x", KEYS, NOW)
    verify(sign(b"x", KEYS, NOW + 299), b"x", KEYS, NOW)
    with pytest.raises(SignatureError, match="stale"):
        verify(sign(b"x", KEYS, NOW - 301), b"x", KEYS, NOW)
    with pytest.raises(SignatureError, match="stale"):
        verify(sign(b"x", KEYS, NOW - 3600), b"x", KEYS, NOW)


def test_rotation_accepts_the_fallback_key_and_signs_with_the_current() -> None:
    old = SigningKeys.of("old-key-0123456789")
    rotating = SigningKeys.of("new-key-0123456789", "old-key-0123456789")
    verify(sign(b"x", old, NOW), b"x", rotating, NOW)  # a peer not yet rotated
    verify(sign(b"x", rotating, NOW), b"x", SigningKeys.of("new-key-0123456789"), NOW)
    with pytest.raises(SignatureError):
        verify(sign(b"x", rotating, NOW), b"x", old, NOW)
    with pytest.raises(SignatureError):
        verify(sign(b"x", SigningKeys.of("third-key-0123456789"), NOW), b"x", rotating, NOW)


def test_keys_are_validated_naming_the_field(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="signing_key"):
        SigningKeys.of("short")
    with pytest.raises(ConfigError, match="signing_key_fallback"):
        SigningKeys.of("k" * 16, "short")
    monkeypatch.delenv("STEPSTONE_SIGNING_KEY", raising=False)
    monkeypatch.delenv("STEPSTONE_SIGNING_KEY_FALLBACK", raising=False)
    assert SigningKeys.from_env() is None
    monkeypatch.setenv("STEPSTONE_SIGNING_KEY_FALLBACK", "f" * 16)
    with pytest.raises(ConfigError, match="signing_key"):
        SigningKeys.from_env()
    monkeypatch.setenv("STEPSTONE_SIGNING_KEY", "e" * 16)
    assert SigningKeys.from_env() == SigningKeys(current="e" * 16, fallback="f" * 16)
    assert SigningKeys.from_env("g" * 16) == SigningKeys(current="g" * 16, fallback="f" * 16)
