"""When a run's parallel branches have all stopped replaying.

A replayed step returns its memo at once, so on a wake one branch can run
through its memos and reach its next, new step while a sibling branch has not
replayed its own recorded steps yet. Whether the new step means the history
no longer fits the code (recorded steps never reached, ``divergence``) can only
be judged once every other branch has stopped: reached its own frontier (a new
step, or a recorded one still unfinished), paused, or ended. ``app.check``
knows because it ends each branch at its frontier; a live run must decide
before the new step executes, so the branch that reached it waits here.

An asyncio task runs from one ``await`` to the next within one turn of the
event loop, and a replayed step never awaits: branches that are still
replaying reach a step in every turn or so. The wait ends after a few turns in
which no branch reached a step. Threads of a plain ``def`` handler run beside
the loop, so they are counted instead: the handler's thread and the threads of
``ctx.step.parallel`` run unless parked here, joining their branches, or ended.
A thread that reaches no step for ``THREAD_STALL`` is taken as stopped. A
branch that awaits something other than a step between two steps, or a thread
the handler starts itself, is not seen (the verdict may come early: a false
divergence, as before this wait existed).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

QUIET_TURNS = 8  # turns of the event loop without a step reached: every branch stopped
THREAD_POLL = 0.005  # seconds between looks at the threads while one still runs
# A running thread that reaches no step for this long is taken as stopped: it
# executes a step (its branch's frontier), or the handler joins a thread of its own.
THREAD_STALL = 1.0


class Branches:
    """The branches of one invocation, as far as a pending verdict needs them."""

    def __init__(self) -> None:
        self.reached = 0  # step calls reached by any branch (the interpreter counts them)
        self.threaded = False  # a plain def handler: branches are threads
        self._running = 0  # threads neither parked, joining nor ended
        self._lock = threading.Lock()

    def start_threads(self) -> None:
        """The handler runs in a thread of its own (a plain ``def`` handler)."""
        self.threaded = True
        self._add(1)

    def fork(self, count: int) -> Fork:
        """A thread starts ``count`` branch threads and joins them."""
        return Fork(self, count)

    def _add(self, delta: int) -> None:
        with self._lock:
            self._running += delta

    @asynccontextmanager
    async def parked(self) -> AsyncIterator[None]:
        """The calling branch waits for a verdict: it runs nothing meanwhile."""
        if self.threaded:
            self._add(-1)
        try:
            yield
        finally:
            if self.threaded:
                self._add(1)

    async def settled(self, done: Callable[[], bool]) -> None:
        """Return once ``done()`` holds or no other branch can reach a step."""
        loop = asyncio.get_running_loop()
        quiet, progress_at = 0, loop.time()
        while quiet < QUIET_TURNS and not done():
            seen = self.reached
            threads = self._running > 0 and loop.time() - progress_at < THREAD_STALL
            await asyncio.sleep(THREAD_POLL if threads else 0)
            if self.reached != seen:
                quiet, progress_at = 0, loop.time()
            elif not threads:
                quiet += 1


class Fork:
    """Branch threads of one ``ctx.step.parallel``: the joining thread waits, each
    branch runs; the last to end hands its count back to the joining thread."""

    def __init__(self, branches: Branches, count: int) -> None:
        self._branches = branches
        self._left = count
        if count:
            branches._add(count - 1)

    def ended(self) -> None:
        """One branch thread ended (returned or raised)."""
        with self._branches._lock:
            self._left -= 1
            if self._left:
                self._branches._running -= 1
