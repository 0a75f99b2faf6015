"""When a write awaited on an event loop may commit in its submitter's turn.

Writes submitted from an event loop share a group commit: the first one
schedules a flush with ``call_soon`` and every write submitted before the flush
runs joins its batch. A submitter that awaits its write while that flush is
the only callback ready may run the batch at once instead (``Eager``): the
flush would have been the loop's next callback and would have carried the
same writes, so the batch is the same, only the turns of the loop (and, on
PostgreSQL, the two thread hand-offs) that running the flush and then waking
the submitter cost are saved. A loop with other callbacks ready keeps the
scheduled flush: under load, writes keep gathering into one transaction.

Early commits in a row with no turn of the loop between them (a handler whose
steps never await) stop after ``EAGER_RUN``: the next write waits for its
flush, so timers (the heartbeat) and I/O still get their turn. A loop without
a visible ready queue (not asyncio's own) always waits for the flush.
"""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from typing import Any, Protocol


class Flushes(Protocol):
    """A loop's lane of writes: ``commit_now`` runs its scheduled flush early
    if ``EagerTurns.may_commit`` allows."""

    def commit_now(self) -> None: ...


class Eager(asyncio.Future[Any]):
    """A write's outcome. Awaiting it first lets its lane commit at once if
    nothing else would run before the scheduled flush (``Flushes.commit_now``)."""

    def __init__(self, lane: Flushes, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop=loop)
        self._lane = lane

    def __await__(self) -> Generator[Any, None, Any]:
        if not self.done():
            self._lane.commit_now()
        return (yield from super().__await__())

    __iter__ = __await__


class EagerTurns:
    """Counts a lane's early commits and tells whether one more may run now."""

    EAGER_RUN = 8

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._ready: Any = getattr(loop, "_ready", None)  # asyncio's deque of ready callbacks
        self._self_pipe = getattr(loop, "_read_from_self", None)  # drains call_soon_threadsafe's pipe
        self._tick: asyncio.Handle | None = None  # scheduled by an early commit: the loop turned
        self._early = 0  # early commits since the loop last turned

    def may_commit(self, flush: asyncio.Handle | None = None) -> bool:
        """Whether no callback but the scheduled ``flush`` is ready to run and
        the run of early commits is not at its cap."""
        return self._early < self.EAGER_RUN and self.alone(flush)

    def alone(self, flush: asyncio.Handle | None) -> bool:
        """Whether no callback but ``flush`` is ready to run (draining the
        loop's self-pipe does not count: it only reads the wake-up bytes of
        callbacks already in the queue)."""
        ready = self._ready
        if ready is None:
            return False
        for handle in ready:  # stops at the first callback of another
            if handle is flush or handle is self._tick or handle.cancelled():
                continue
            if handle._callback != self._self_pipe:
                return False
        return True

    def took(self) -> None:
        """An early commit ran: counted until the loop turns."""
        if self._tick is None:
            self._tick = self.loop.call_soon(self._turned)
        self._early += 1

    def _turned(self) -> None:
        self._tick, self._early = None, 0
