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

from stepstone.errors import LeaseLostError
from stepstone.store.base import Store, Tx
from stepstone.store.rows import Fence

from .integration.test_store_contract import step

DEADLINE = 30.0


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


def checkpoint(fence: Fence, step_id: str) -> Callable[[Tx], Any]:
    return lambda tx: tx.checkpoint(fence, [step(fence.run_id, step_id)], [])


def group_commit(store: Store, ops: list[Callable[[Tx], Any]]) -> list[Any]:
    """``ops`` in one group commit; their results (or exceptions)."""

    async def commit() -> list[Any]:
        futures = await submitted_together(store, ops, DEADLINE)
        return await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), DEADLINE)

    return asyncio.run(commit())


def stored_steps(store: Store, run_id: str) -> list[str]:
    return [s.step_id for s in store.read_sync(lambda tx: tx.get_steps(run_id))]


def stale_in_the_middle(store: Store, fences: list[Fence], round_: int) -> None:
    """One group commit of three checkpoints, the middle one under a stale
    fence: it alone is refused, the two around it commit."""
    stale = Fence(run_id=fences[1].run_id, owner="w", epoch=fences[1].epoch - 1)
    ops = [
        checkpoint(fences[0], f"a{round_}"),
        checkpoint(stale, f"x{round_}"),
        checkpoint(fences[2], f"c{round_}"),
    ]
    first, refused, last = group_commit(store, ops)
    assert isinstance(refused, LeaseLostError)
    assert not isinstance(first, BaseException) and not isinstance(last, BaseException)


def only_the_stale_one_lost(store: Store, fences: list[Fence], rounds: int) -> None:
    assert stored_steps(store, fences[0].run_id) == [f"a{n}" for n in range(rounds)]
    assert stored_steps(store, fences[1].run_id) == []
    assert stored_steps(store, fences[2].run_id) == [f"c{n}" for n in range(rounds)]
