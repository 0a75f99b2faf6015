"""Lazy memo loading: a lease reads a run's step index, not its outputs; a
replay reads outputs in pages as it reaches them and forgets each once handed
over, so a resumed run with a large history needs a page of it in memory, not
all of it (``runstate.py``)."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import tracemalloc
from pathlib import Path

import pytest

import stepstone as ss
from stepstone.runstate import PAGE_BYTES, StoreMemos
from stepstone.store.base import Store, Tx
from stepstone.store.rows import StepKind, StepStatus
from tests.conftest import BACKENDS, MEMORY, backend_url
from tests.integration.test_store_contract import NOW, add_runs, lease, step
from tests.polling import wait_for

from ..conftest import query, run_of


@pytest.fixture(params=[*BACKENDS, MEMORY])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Every backend, and the in-memory fake (the store contract)."""
    return backend_url(request, request.param, tmp_path)


def history(store: Store, run_id: str, outputs: list[str]) -> None:
    """A run whose completed steps ``s0``, ``s1``... recorded ``outputs``, then
    one waiting step (no output)."""
    rows = [step(run_id, f"s{i}", output, position=i) for i, output in enumerate(outputs)]
    waiting = dataclasses.replace(
        step(run_id, "w", position=len(outputs)), kind=StepKind.WAIT, status=StepStatus.WAITING, output=None
    )
    store.transact_sync(lambda tx: tx.save_steps([*rows, waiting], []))


def test_a_lease_reads_the_step_index_with_sizes_not_outputs(store: Store) -> None:
    add_runs(store, ["r"])
    outputs = ['"abc"', '"é"', "null"]  # é is two bytes in UTF-8
    history(store, "r", outputs)
    [leased] = store.transact_sync(lambda tx: lease(tx, "w1", 1, NOW, NOW + 10))
    assert [(s.step_id, s.status, s.output) for s in leased.steps] == [
        ("s0", "completed", None),
        ("s1", "completed", None),
        ("s2", "completed", None),
        ("w", "waiting", None),
    ]
    assert leased.output_bytes == {"s0": 5, "s1": 4, "s2": 4}

    def page(tx: Tx) -> dict[str, str | None]:
        return tx.step_outputs("r", 1, 3)

    assert store.read_sync(page) == {"s1": '"é"', "s2": "null"}  # the waiting step has none


def test_outputs_are_read_in_pages_and_handed_over_once(store: Store) -> None:
    add_runs(store, ["r"])
    outputs = [f'"{i:03d}{"x" * (i % 5) * 10}"' for i in range(30)]
    history(store, "r", outputs)
    [leased] = store.transact_sync(lambda tx: lease(tx, "w1", 1, NOW, NOW + 10))
    memos = StoreMemos(store, "r", leased.steps, leased.output_bytes, page_steps=8, page_bytes=10_000)
    assert memos.stored_bytes() == sum(len(o) for o in outputs)
    index = {s.step_id: s for s in leased.steps}

    async def replay(order: list[int]) -> list[str | None]:
        return [await memos.output(index[f"s{i}"]) for i in order]

    # The handler reaches s20 first (a parallel branch), then runs in order.
    got = asyncio.run(replay([20, *range(20), *range(21, 30)]))
    assert got == [outputs[20], *outputs[:20], *outputs[21:]]
    assert memos.reads == 4  # s20..s27; s0..s7; s8..s15; s16..s19 and s28, s29 (s20..s27 handed)
    assert memos._page == {}  # nothing held once handed over

    small = StoreMemos(store, "r", leased.steps, leased.output_bytes, page_steps=100, page_bytes=100)
    asyncio.run(small.output(index["s0"]))
    assert 1 < len(small._page) + 1 <= 100 // 5 + 1  # a page stops at its byte budget


@pytest.mark.parametrize("db_url", BACKENDS, indirect=True)
def test_a_resumed_run_with_a_large_history_stays_in_bounded_memory(app: ss.App, db_url: str) -> None:
    # 25.6 MB of recorded outputs: over six pages of runstate.PAGE_BYTES (a page costs
    # about twice its size while the driver's bytes become str), so the bound of
    # half the history sits well above one page's cost and far below eager loading
    count, size = 640, 40_000
    assert count * size > 6 * PAGE_BYTES

    def status() -> str:  # not app.runs.get: a run's view reads every output
        [(value,)] = query(db_url, f"SELECT status FROM runs WHERE id = '{run_id}'")
        return str(value)

    @app.function(id="long", trigger=ss.on_event("go"), max_state=None)
    async def long(ctx: ss.Context) -> int:
        total = 0
        for i in range(count):
            total += len(await ctx.step.run(f"s{i}", lambda: "x" * size))
        await ctx.step.wait_for_event("more", event="more", timeout="1m")
        return total

    app.start()
    [event_id] = app.send(ss.Event("go"))
    run_id = run_of(app, event_id).id
    wait_for(lambda: status() == "waiting", 60, "the run waits after its steps")
    gc.collect()
    tracemalloc.start()
    try:
        app.send(ss.Event("more"))
        wait_for(lambda: status() == "completed", 60, "the resumed run completes")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert app.runs.get(run_id).output == count * size
    history_bytes = count * (size + 2)
    assert peak < history_bytes / 2, f"peak {peak} bytes while resuming a {history_bytes}-byte history"


def test_a_memo_without_its_output_equals_a_replaced_copy() -> None:
    memo = step("r", "s", '"value"', position=3)
    assert memo.without_output() == dataclasses.replace(memo, output=None)
    assert memo.output == '"value"'  # the original is untouched
