"""Login throttling: a client address that fails to log in too often must wait.

Failed attempts are counted per address over a sliding window; once an address
has ``limit`` failures in the window, every attempt from it (the right key
included, so guessing learns nothing) gets 429 with ``Retry-After`` until its
oldest failure leaves the window. A successful login does not count. State is
per process, bounded by pruning addresses whose failures have all expired.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable


class LoginThrottle:
    DEFAULT_LIMIT = 10
    DEFAULT_WINDOW = 60.0

    def __init__(
        self,
        *,
        limit: int = DEFAULT_LIMIT,
        window: float = DEFAULT_WINDOW,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = limit
        self.window = window
        self.clock = clock
        self._failures: dict[str, deque[float]] = {}

    def retry_after(self, address: str) -> int | None:
        """Whole seconds ``address`` must wait before trying again, or ``None``."""
        failures = self._recent(address)
        if len(failures) < self.limit:
            return None
        return max(1, math.ceil(failures[0] + self.window - self.clock()))

    def failed(self, address: str) -> None:
        self._prune()
        self._failures.setdefault(address, deque()).append(self.clock())

    def _recent(self, address: str) -> deque[float]:
        failures = self._failures.get(address, deque())
        while failures and failures[0] + self.window <= self.clock():
            failures.popleft()
        return failures

    def _prune(self) -> None:
        for address in [a for a in self._failures if not self._recent(a)]:
            del self._failures[address]
