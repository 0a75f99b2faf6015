"""A worker's slots: how many more runs it may start, shared by its lease
passes and by direct starts (a send in the same process taking runs for it in
the send's own transaction, ``app.py``), claimed from any thread.

A lease pass claims every free slot before its transaction and gives back
what it did not fill. A direct start reserves slots before the send's
transaction. When none is free because a pass has claimed them and its
transaction has not begun, the send takes them from that claim (the pass then
takes fewer): a pass that will most often find nothing (woken by a run's end)
must not turn a send away. Once the pass's transaction begins, its claim is
fixed (``seal_pass``). Runs in flight plus slots claimed never exceed the
concurrency.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class Slots:
    def __init__(self, concurrency: int, busy: Callable[[], int]) -> None:
        self.concurrency = concurrency
        self._busy = busy  # slots in use: runs in flight (all of them while none may start)
        self._lock = threading.Lock()
        self.claimed = 0  # by the current pass and by direct starts, not yet in flight
        self._pass = 0  # the current lease pass's part of ``claimed``
        self._sealed = True  # whether the pass's transaction has begun (or no pass runs)
        self._closed = False

    def free(self) -> int:
        return max(0, self.concurrency - self._busy() - self.claimed)

    def offered(self) -> int:
        """What ``reserve`` could give now: free slots and an unsealed pass's claim."""
        with self._lock:
            return 0 if self._closed else self.free() + (0 if self._sealed else self._pass)

    def claim_pass(self) -> int:
        """Every free slot, for a lease pass about to begin (0: no pass)."""
        with self._lock:
            self._pass = self.free()
            self.claimed += self._pass
            self._sealed = self._pass == 0
            return self._pass

    def seal_pass(self) -> int:
        """In the pass's transaction: how many it may take; no send takes from it now."""
        with self._lock:
            self._sealed = True
            return self._pass

    @property
    def pass_room(self) -> int:
        """What the current pass may take (final once sealed)."""
        return self._pass

    def end_pass(self) -> None:
        """The pass is over (its runs in flight): the rest of its claim is free."""
        with self._lock:
            self.claimed -= self._pass
            self._pass, self._sealed = 0, True

    def reserve(self, wanted: int) -> int:
        """Up to ``wanted`` slots for a direct start (0 once closed)."""
        with self._lock:
            if self._closed:
                return 0
            free = min(wanted, self.free())
            self.claimed += free
            taken = 0 if self._sealed else min(wanted - free, self._pass)
            self._pass -= taken  # moved from the pass's claim to the send's
            return free + taken

    def release(self, count: int) -> bool:
        """Give back a direct start's slots; returns whether none is claimed now."""
        with self._lock:
            self.claimed -= count
            return self.claimed == 0

    def close(self) -> None:
        """No direct start from now on (the worker is stopping)."""
        with self._lock:
            self._closed = True
