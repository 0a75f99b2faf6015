"""Driving an app through injected store faults on a virtual clock.

A worker runs in the foreground (``Worker.drain``, as ``stepstone.testing``
does): nothing happens between calls, so where a fault lands is decided by
the workload alone, not by timing. A store error surfacing from a drain or a
send (the fault itself, for writes no caller retries) is retried the way a
real worker or client would: the next pass, the same event ids.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import stepstone as ss
from stepstone.errors import StoreUnavailableError
from stepstone.store.base import Tx
from stepstone.testing import VirtualClock
from stepstone.worker import Worker

T = TypeVar("T")
START = 1_800_000_000.0


class Driver:
    def __init__(self, app: ss.App) -> None:
        assert isinstance(app.clock, VirtualClock)
        self.app, self.clock = app, app.clock
        self.worker: Worker = app.worker(concurrency=10, instance_id="faults")

    async def retried(self, call: Callable[[], Awaitable[T]]) -> T:
        """``call()``, repeated while the store is unavailable (at most a few times)."""
        for _ in range(5):
            try:
                return await call()
            except StoreUnavailableError:
                continue
        return await call()

    async def send(self, events: Sequence[ss.Event]) -> list[str]:
        return await self.retried(lambda: self.app.send_async(list(events)))

    async def drain(self) -> None:
        await self.retried(self.worker.drain)

    async def next_due(self) -> float | None:
        ids, crons = self.app.registry.ids(), self.worker._schedules()

        def op(tx: Tx) -> float | None:
            times = [t for t in (tx.next_due(ids), tx.next_cron(crons), tx.next_deadline()) if t is not None]
            return min(times) if times else None

        return await self.app.store.read(op)

    async def settle(self, done: Callable[[], Awaitable[bool]], steps: int = 200) -> None:
        """Drain, then move the clock to the next due time, until ``done()``."""
        for _ in range(steps):
            await self.drain()
            if await done():
                return
            due = await self.next_due()
            if due is None:
                return
            self.clock.move_to(max(due, self.clock.now()))
        raise AssertionError("the workload did not settle")


def virtual_app(db_url: str, name: str = "faults") -> ss.App:
    return ss.App(name, database_url=db_url, clock=VirtualClock(START))
