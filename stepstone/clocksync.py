"""Keeping an app's ``DatabaseClock`` on the database server's clock.

The offset is measured when the app opens its store (the best of a few round
trips) and again at every worker heartbeat. Each measurement reads the
server's clock in its own statement, bracketed by two readings of the local
clock inside the operation, so pool waits and event-loop delays do not widen
it. A database on this machine (SQLite) has no clock of its own: nothing to
correct.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from stepstone.clock import Clock, DatabaseClock
from stepstone.store.base import LocksTx, Store, Tx

log = logging.getLogger("stepstone.clock")
START_SAMPLES = 3
NOTABLE_SKEW = 1.0  # seconds of skew worth a warning at start

Sample = tuple[float, float, float] | None  # (server, sent, received)


def measure_op(local: Clock) -> Callable[[Tx], Sample]:
    def op(tx: LocksTx) -> Sample:
        sent = local.now()
        server = tx.server_time()
        received = local.now()
        return None if server is None else (server, sent, received)

    return op


def sync_at_start(store: Store, clock: Clock) -> None:
    """Measure the offset (blocking) before the app writes or compares any time."""
    if not isinstance(clock, DatabaseClock):
        return
    op = measure_op(clock.local)
    for _ in range(START_SAMPLES):
        sample = store.read_sync(op)
        if sample is None:  # the database runs on this machine's clock: no offset
            now = clock.local.now()
            clock.observe(now, now, now)
            return
        clock.observe(*sample)
    if abs(clock.offset) > NOTABLE_SKEW:
        log.warning(
            "this machine's clock is %.3f s %s the database server's; Stepstone uses the "
            "server's (fix the machine's time sync: logs and spans show local time)",
            abs(clock.offset),
            "behind" if clock.offset > 0 else "ahead of",
        )


async def resync(store: Store, clock: Clock) -> None:
    """Take one more measurement (a worker heartbeat's)."""
    if isinstance(clock, DatabaseClock):
        sample = await store.read(measure_op(clock.local))
        if sample is not None:
            clock.observe(*sample)
