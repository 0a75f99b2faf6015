"""Duration parsing: ``"500ms" | "30s" | "5m" | "2h" | "7d"`` (and sums such as
``"1h30m"``), ``timedelta``, or a number of seconds."""

from __future__ import annotations

import re
from datetime import timedelta

Duration = str | int | float | timedelta

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")


def parse_duration(value: Duration, *, field: str = "duration") -> float:
    """Return ``value`` in seconds; raise ``ConfigError`` naming ``field`` if invalid."""
    from stepstone.errors import ConfigError

    if isinstance(value, bool):
        raise ConfigError(field, f"expected a duration, got {value!r}")
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().replace(" ", "")
        pos, seconds = 0, 0.0
        for match in _PART.finditer(text):
            if match.start() != pos:
                break
            seconds += float(match.group(1)) * _UNITS[match.group(2)]
            pos = match.end()
        if pos != len(text) or not text:
            raise ConfigError(
                field, f"cannot parse duration {value!r}; use e.g. '500ms', '30s', '5m', '2h', '7d'"
            )
    else:
        raise ConfigError(field, f"expected a duration, got {type(value).__name__}")
    if seconds < 0:
        raise ConfigError(field, f"duration must not be negative, got {value!r}")
    return seconds


def optional_duration(value: Duration | None, *, field: str) -> float | None:
    return None if value is None else parse_duration(value, field=field)
