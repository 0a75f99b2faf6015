"""Writes submitted from an event loop so that they commit in one group commit.

SQLite batches what one turn of the loop submits. On PostgreSQL the writes
queue behind the only writer (stores opened with ``?writers=1``), whose
connection a blocking caller on another thread holds until the loop has
handed them over; the writer then takes them in one batch. (Held by a write
the loop submitted itself, the connection could be held on the loop's own
thread, which runs a lone write there when nothing else is ready.)
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from stepstone.store.base import Store, Tx


async def submitted_together(
    store: Store, ops: list[Callable[[Tx], Any]], deadline: float = 10.0
) -> list[asyncio.Future[Any]]:
    """Submit ``ops`` (one group commit); their futures."""
    if store.dialect != "postgres":
        return [store.submit(op) for op in ops]
    inside, gate = threading.Event(), threading.Event()

    def hold(tx: Tx) -> None:
        inside.set()
        gate.wait(deadline)

    holder = threading.Thread(target=store.transact_sync, args=(hold,))
    holder.start()
    try:
        await asyncio.to_thread(inside.wait, deadline)
        futures = [store.submit(op) for op in ops]
        await asyncio.sleep(0)  # one turn of the loop: handed over, queued behind the holder
    finally:
        gate.set()
        await asyncio.to_thread(holder.join, deadline)
    return futures
