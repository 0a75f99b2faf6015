"""Checks shared by the option classes: each raises ``ConfigError`` naming the field."""

from __future__ import annotations

from typing import Any

from stepstone.durations import Duration, parse_duration
from stepstone.errors import ConfigError
from stepstone.expressions import Expression, compile_expression

EVENT_VARS = frozenset({"event"})
MATCH_VARS = frozenset({"event", "async"})


def positive_int(value: Any, field_name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(field_name, f"must be a positive integer, got {value!r}")
    return value


def positive_duration(value: Duration, field_name: str) -> float:
    seconds = parse_duration(value, field=field_name)
    if seconds <= 0:
        raise ConfigError(field_name, f"must be a positive duration, got {value!r}")
    return seconds


def key_expression(
    source: str | None, field_name: str, variables: frozenset[str] = EVENT_VARS
) -> Expression | None:
    """The compiled CEL ``source`` (``None`` without one)."""
    return None if source is None else compile_expression(source, field=field_name, variables=variables)
