"""JSON (de)serialisation of stored values, with size limits.

Values are round-tripped through JSON when first produced, so the first
execution of a step and every replay see exactly the same value.
"""

from __future__ import annotations

import json
from typing import Any

from stepstone.errors import LimitExceededError, SerializationError

_encoder = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
_decode = json.JSONDecoder().decode


def dumps(value: Any, *, what: str, limit: int | None = None) -> str:
    """Encode ``value``; raise a non-retriable error naming ``what`` if impossible."""
    try:
        # An int's JSON is its repr, an empty object's ``{}`` (an event without
        # data): json's own encoder builds an encoder per call.
        if type(value) is int:
            text = int.__repr__(value)
        elif type(value) is dict and not value:
            text = "{}"
        else:
            text = _encoder.encode(value)
    except (TypeError, ValueError) as exc:
        raise SerializationError(f"{what} is not JSON-serialisable: {exc}") from exc
    if limit is not None and len(text) > limit // 4 and len(text.encode()) > limit:
        raise LimitExceededError(f"{what} is {len(text.encode())} bytes, over the limit of {limit} bytes")
    return text


def loads(text: str | None) -> Any:
    return None if text is None else _decode(text)


_SCALARS = frozenset({str, int, float, bool, type(None)})


def round_trip(value: Any, text: str | None) -> Any:
    """``loads(text)`` where ``text`` is ``dumps(value)``: a JSON scalar (of
    exactly these types; no NaN or infinity, which ``dumps`` refuses) is its
    own round trip and is not decoded again."""
    return value if type(value) in _SCALARS else loads(text)
