"""The generic cell rate algorithm, for throttles and rate limits.

Each key has a theoretical arrival time (TAT). With emission interval ``T``
(period / limit) and tolerance ``tau``, a request at ``now`` conforms when
``now >= TAT - tau``; it then moves the TAT to ``max(TAT, now) + T``. Over any
window of length ``w`` at most ``w / T + tau / T + 1`` requests conform.
"""

from __future__ import annotations

from stepstone.store.base import GcraTx


def allowed_at(tx: GcraTx, key: str, tolerance: float, now: float) -> float:
    """When the next request for ``key`` conforms (``<= now``: right away)."""
    tx.lock(key)
    tat = tx.gcra_tat(key)
    return now if tat is None else tat - tolerance


def consume(tx: GcraTx, key: str, interval: float, now: float) -> None:
    """Record a conforming request."""
    tat = tx.gcra_tat(key)
    tx.set_gcra_tat(key, max(tat or now, now) + interval)


def try_consume(tx: GcraTx, key: str, interval: float, tolerance: float, now: float) -> bool:
    if allowed_at(tx, key, tolerance, now) > now:
        return False
    consume(tx, key, interval, now)
    return True
