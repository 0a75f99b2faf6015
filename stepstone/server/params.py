"""Parsing request parameters that Pydantic cannot check alone: moments in time
(RFC 3339 or epoch seconds) and opaque pagination cursors. Errors are
``ConfigError`` naming the parameter."""

from __future__ import annotations

import base64
import json
import math
from datetime import UTC, datetime

from stepstone.errors import ConfigError

# Times shown by the API have microsecond resolution, stored ones a little more:
# bounds move back half a microsecond so that a run's ``created_at`` as shown is
# inside ``since=`` that value and outside ``until=`` it.
_HALF_MICROSECOND = 5e-7


def parse_moment(value: str | float | None, field: str) -> float | None:
    """Epoch seconds from an RFC 3339 date-time (naive means UTC) or a number,
    as a filter bound (see ``_HALF_MICROSECOND``)."""
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        seconds = _from_text(str(value).strip(), field)
    if not math.isfinite(seconds):
        raise ConfigError(field, f"expected a finite time, got {value!r}")
    return seconds - _HALF_MICROSECOND


def _from_text(text: str, field: str) -> float:
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(
            field, f"expected an RFC 3339 date-time (2024-05-01T12:00:00Z) or epoch seconds, got {text!r}"
        ) from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def check_range(since: float | None, until: float | None) -> None:
    if since is not None and until is not None and since > until:
        raise ConfigError("since", "must not be after until")


def encode_cursor(last_run_id: str) -> str:
    raw = json.dumps({"before": last_run_id}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def decode_cursor(cursor: str | None) -> str | None:
    """The run id a page continues after; ``ConfigError("cursor")`` if malformed."""
    if cursor is None:
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        before = json.loads(raw)["before"]
    except (ValueError, KeyError, TypeError):
        before = None
    if not isinstance(before, str) or not before:
        raise ConfigError("cursor", "malformed cursor; pass a previous page's next_cursor unchanged")
    return before
