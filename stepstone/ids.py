"""Time-sortable identifiers (ULID layout: 48-bit milliseconds + 80 random bits).

Ids made by one process are strictly increasing, even within a millisecond (the
random part is incremented), so runs created together keep their order.
"""

from __future__ import annotations

import base64
import os
import threading
import time

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
# base64's base-32 digits in value order, spelled in ours: the id is encoded in C.
_CROCKFORD = bytes.maketrans(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", _ALPHABET.encode())
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
    # 160 bits are 32 digits of 5 bits from the top: the last 26 are the 128 bits of the id.
    return base64.b32encode(value.to_bytes(20, "big")).translate(_CROCKFORD)[6:].decode()
