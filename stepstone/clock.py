"""Time source. Everything that reads the time goes through a ``Clock`` so that
``stepstone.testing`` can run workflows on a virtual clock, and so that every
process sharing a database decides on one time: the database server's.

Leases, deadlines and due times are written by one process and compared by
another, often on another machine. Were each to use its own clock, a machine
whose clock runs ahead by more than the lease TTL would see every other
worker's lease as expired (and execute their steps again) and count no live
lease under a concurrency limit. So an ``App`` on a ``SystemClock`` runs on a
``DatabaseClock``: the machine's clock plus an offset measured against the
server (``stepstone.clocksync``). A virtual or manual clock is never corrected.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol

DRIFT = 1e-3  # seconds per second a measured offset is assumed to lose in accuracy


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch."""
        ...


class SystemClock:
    """This machine's real-time clock. An ``App`` given one (or a subclass)
    corrects it to the database server's clock."""

    def now(self) -> float:
        return time.time()


SYSTEM_CLOCK = SystemClock()


class DatabaseClock:
    """A real-time clock that follows the database server's clock.

    ``observe`` takes one measurement: the server's time, read between two
    readings of the local clock. The server read it at some instant between
    them, so taking the midpoint errs by at most half the round trip. A
    measurement replaces the current offset unless it is less certain than the
    current one, whose uncertainty grows by ``DRIFT`` per second of age (so a
    local clock stepped by NTP is followed within seconds, and one slow round
    trip does not spoil a good measurement).
    """

    def __init__(self, local: Clock) -> None:
        self.local = local
        self._lock = threading.Lock()
        self._offset = 0.0
        self._error: float | None = None  # half the round trip of the measurement in use
        self._measured_at = 0.0  # local time that measurement began

    def now(self) -> float:
        return self.local.now() + self._offset

    @property
    def offset(self) -> float:
        """Seconds to add to the local clock to read the server's."""
        return self._offset

    @property
    def synced(self) -> bool:
        return self._error is not None

    def uncertainty(self) -> float | None:
        """The bound on the current offset's error, in seconds (None: never measured)."""
        with self._lock:
            return self._uncertainty(self.local.now())

    def _uncertainty(self, at: float) -> float | None:
        if self._error is None:
            return None
        return self._error + DRIFT * abs(at - self._measured_at)

    def observe(self, server: float, sent: float, received: float) -> bool:
        """Record the server's time ``server`` read between local times ``sent``
        and ``received``; returns whether the offset now in use came from it."""
        if received < sent:  # the local clock stepped back mid-measurement
            return False
        error = (received - sent) / 2
        with self._lock:
            current = self._uncertainty(received)
            if current is not None and error > current:
                return False
            self._offset = server - (sent + error)
            self._error, self._measured_at = error, sent  # the server read its clock after ``sent``
            return True
