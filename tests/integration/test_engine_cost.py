"""The engine's own work on a sequential run's critical path (issue 18, target
4, session 9), on both stores, pinned by counts, never by time: what happens
between a commit's acknowledgement and the next statement (wake-ups, turns of
the loop, objects made per run or per step).

- a run's end wakes the worker's idle loop only if it changed what the loop
  waits for (a pass wanted, a due time learned, a first free slot): a
  sequential run's end used to wake it once, to go back to sleep (a turn of
  the loop and a new timer per run).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

import stepstone as ss
from stepstone.worker import Worker

RUNS = 20
WARM_UP = 3


async def _one() -> int:
    return 1


def _sequential(app: ss.App, runs: int = RUNS, during: Callable[[], Any] | None = None) -> None:
    """``runs`` three-step runs one at a time (send, ``runs.list``,
    ``runs.wait``; an in-process worker); ``during()`` after the warm-up."""

    @app.function(id="three", trigger=ss.on_event("three"))
    async def three(ctx: ss.Context) -> list[int]:
        return [await ctx.step.run(name, _one) for name in ("a", "b", "c")]

    async def one() -> None:
        [eid] = await app.send_async(ss.Event("three"))
        [run] = await app.runs.list_async(event_id=eid)
        done = await app.runs.wait_async(run.id, timeout="10s")
        assert done.status == "completed" and [s.output for s in done.steps] == [1, 1, 1]

    async def main() -> None:
        await app.start_async(concurrency=10)
        try:
            for _ in range(WARM_UP):
                await one()
            if during is not None:
                during()
            for _ in range(runs):
                await one()
        finally:
            await app.stop_async()

    asyncio.run(main())


def test_a_sequential_runs_end_does_not_wake_the_idle_worker(
    app: ss.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: one ``Worker._poke`` per run (its idle loop woke, found nothing
    to do and slept again). A pass wanted, a due time or a freed last slot
    still wake it (``test_pg_hops.py``: a run behind a full worker starts at
    once)."""
    pokes: list[str] = []
    poke = Worker._poke
    counting = False

    def counted(self: Worker) -> None:
        if counting:
            pokes.append(self.id)
        poke(self)

    def start_counting() -> None:
        nonlocal counting
        counting = True

    monkeypatch.setattr(Worker, "_poke", counted)
    _sequential(app, during=start_counting)
    # 0 on a quiet host; a periodic duty that falls between runs wants a pass
    # (its ``_want_lease``), and that run's end then pokes, rightly.
    assert len(pokes) <= RUNS // 5, len(pokes)
