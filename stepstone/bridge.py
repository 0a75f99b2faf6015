"""The one bridge from synchronous code to coroutines.

A ``Portal`` is an event loop on a daemon thread, started when the portal is
made and stopped once by ``close``. A synchronous caller hands it a coroutine
and blocks until the coroutine is done (``call``); the coroutine runs in a copy
of the caller's context, so context variables (a trace context, a step scope)
cross the bridge as they cross an ``await``. ``call_in`` is the same crossing
onto a loop that something else runs: the worker's loop, for the step
bookkeeping of plain ``def`` handlers.

Every synchronous surface goes through here: ``App.start``/``stop`` and
``app.send``'s middleware hooks, ``ss.Client``'s blocking methods, ``TestEnv``,
and ``ctx.step`` in plain ``def`` handlers.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def call_in(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on ``loop``, which runs in another thread, and wait for its result."""
    return asyncio.run_coroutine_threadsafe(coro, loop).result()


class Portal:
    """An event loop on a daemon thread that runs coroutines for synchronous callers."""

    def __init__(self, name: str = "stepstone-portal") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the portal's loop and wait for its result. Called from
        a coroutine the portal itself runs (whose loop is busy waiting for this
        call), it runs ``coro`` on a loop of its own instead of deadlocking."""
        if threading.current_thread() is self._thread:
            aside = Portal(f"{self._thread.name}-nested")
            try:
                return aside.call(coro)
            finally:
                aside.close()
        return call_in(self.loop, coro)

    def close(self) -> None:
        """Stop the loop and its thread; coroutines still pending are abandoned."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()
