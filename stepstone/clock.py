"""Time source. Everything that reads the time goes through a ``Clock`` so that
``stepstone.testing`` can run workflows on a virtual clock."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch."""
        ...


class SystemClock:
    def now(self) -> float:
        return time.time()


SYSTEM_CLOCK = SystemClock()
