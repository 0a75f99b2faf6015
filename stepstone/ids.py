"""Time-sortable identifiers (ULID layout: 48-bit milliseconds + 80 random bits).

Ids made by one process are strictly increasing, even within a millisecond (the
random part is incremented), so runs created together keep their order.
"""

from __future__ import annotations

import os
import threading
import time

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_lock = threading.Lock()
_last = 0


def new_id(now: float | None = None) -> str:
    """A 26-character Crockford base-32 id whose prefix sorts by creation time."""
    global _last
    millis = int((time.time() if now is None else now) * 1000)
    value = (millis << 80) | int.from_bytes(os.urandom(10), "big")
    with _lock:
        if value <= _last and (_last >> 80) >= millis - 1000:
            value = _last + 1  # same millisecond (or a clock step back): keep increasing
        _last = value
    chars = []
    for _ in range(26):
        chars.append(_ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(chars))
