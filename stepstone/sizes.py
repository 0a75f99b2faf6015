"""Byte sizes in configuration: ``"512KB" | "16MB" | "1GB"`` (powers of 1024)
or a number of bytes, and the stored size of a text."""

from __future__ import annotations

import re

Size = str | int

_UNITS = {"B": 1, "KB": 1024, "MB": 1024**2, "GB": 1024**3}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(B|KB|MB|GB)", re.IGNORECASE)


def parse_size(value: Size, *, field: str) -> int:
    """Return ``value`` in bytes (at least 1); raise ``ConfigError`` naming ``field`` if invalid."""
    from stepstone.errors import ConfigError

    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ConfigError(field, f"expected a size such as '16MB' or a number of bytes, got {value!r}")
    if isinstance(value, int):
        size = value
    else:
        match = _SIZE.fullmatch(value.strip())
        if match is None:
            raise ConfigError(field, f"cannot parse size {value!r}; use e.g. '512KB', '16MB', '1GB'")
        size = int(float(match.group(1)) * _UNITS[match.group(2).upper()])
    if size < 1:
        raise ConfigError(field, f"must be at least 1 byte, got {value!r}")
    return size


def stored_bytes(text: str) -> int:
    """The size of ``text`` as the database stores it (UTF-8), without
    encoding it when it is ASCII (every encrypted output is)."""
    return len(text) if text.isascii() else len(text.encode())
