"""Time-sortable identifiers (ULID layout: 48-bit milliseconds + 80 random bits).

Ids made by one process are strictly increasing, even within a millisecond (the
random part is incremented), so runs created together keep their order.
"""

from __future__ import annotations

import os
import threading
import time

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
# Every 10-bit value as its two digits: 26 digits are 13 look-ups (a third of
# ``base64.b32encode``'s time, whose 5-byte groups run in Python).
_PAIRS = tuple(high + low for high in _ALPHABET for low in _ALPHABET)
_SHIFTS = tuple(range(120, -1, -10))
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
    # 26 digits are 130 bits: the first digit holds the top 3 of the 128 bits.
    return "".join([_PAIRS[(value >> shift) & 1023] for shift in _SHIFTS])
