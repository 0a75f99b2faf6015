"""How retention presses on the write lock (issue 17): batches shrink when they
hold the lock longer than their budget, the pruner rests after each in
proportion, and a writer waiting for SQLite's lock while a batch holds it
gets it before the next batch (the first version retook the lock back to
back and stalled a worker for 22 s). No timing is asserted: the pace is fed
a clock, and the writer's turn is an order of commits."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Callable
from typing import Any

import pytest

import stepstone as ss
from stepstone.scheduler.retention import MIN_SCALE, REST, BatchOp, Pace, pace_for, prune_plan, run_plan
from stepstone.store.base import Tx
from stepstone.store.viewrows import Pruned

from ..conftest import query
from ..polling import wait_for

DEADLINE = 10.0


def _old_runs(app: ss.App, n: int) -> None:
    app.function(id="f", trigger=ss.on_event("go"))(lambda ctx: None)
    app.start()
    ids = app.send([ss.Event("go") for _ in range(n)])
    for event_id in ids:
        app.runs.wait(app.runs.list(event_id=event_id)[0].id)
    app.stop()


def _ticking(step: float) -> Callable[[], float]:
    """A clock that moves ``step`` seconds at each reading: every batch holds its
    transaction ``step`` seconds."""
    ticks = iter(range(1_000_000))
    return lambda: next(ticks) * step


def test_slow_batches_shrink_and_the_pruner_rests_in_proportion(
    make_app: Callable[..., ss.App], db_url: str
) -> None:
    app = make_app(retention=None)
    _old_runs(app, 24)
    slow = 0.05  # each batch "holds the lock" 2.5x its 20 ms budget
    pace = Pace(runs=10, budget=0.02, duty=0.05, clock=_ticking(slow))
    rests: list[float] = []
    batches: list[Pruned] = []
    now = app.clock.now() + 10
    run_plan(prune_plan(1.0, now, pace), app.store.transact_sync, batches.append, pace, sleep=rests.append)
    runs = [b.counts["runs"] for b in batches if "runs" in b.counts]
    assert runs[:4] == [10, 4, 2, 1] and sum(runs) == 24  # 0.4x after each slow batch, down to 10%
    assert query(db_url, "SELECT COUNT(*) FROM runs")[0][0] == 0
    # Every batch took 50 ms inside its transaction: 95% of the time resting.
    assert rests and all(r >= max(REST, slow * 19) - 1e-9 for r in rests)


def test_fast_batches_grow_back_at_most_doubling() -> None:
    pace = Pace(runs=100, budget=0.02, clock=_ticking(0.001))
    pace.scale = MIN_SCALE
    sizes = []
    for _ in range(5):
        pace.held = 0.001
        pace.after()
        sizes.append(pace.limit(pace.runs))
    assert sizes == [20, 40, 80, 100, 100]
    pace.held = 0.004
    assert pace.after() == REST  # a short batch: the minimum rest


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # PostgreSQL locks rows, not the database
def test_a_writer_waiting_during_a_batch_commits_before_the_next_batch(
    make_app: Callable[..., ss.App], db_url: str
) -> None:
    app = make_app(retention=None)
    _old_runs(app, 12)
    order: list[str] = []
    waiting = threading.Event()
    writer = threading.Thread(target=_write_when_free, args=(db_url, waiting, order))

    def transact(op: BatchOp) -> Any:
        def first_holds_the_lock_while_the_writer_waits(tx: Tx) -> Any:
            result = op(tx)
            if not writer.is_alive() and not order:
                writer.start()
                assert waiting.wait(DEADLINE)  # its BEGIN IMMEDIATE is about to wait for us
            return result

        return app.store.transact_sync(first_holds_the_lock_while_the_writer_waits)

    pace = Pace(runs=3)
    plan = prune_plan(1.0, app.clock.now() + 10, pace)
    run_plan(plan, transact, lambda b: order.append(f"batch {len(order)}"), pace)
    writer.join(DEADLINE)
    wait_for(lambda: "writer" in order, DEADLINE, "the writer's commit")
    assert order[:3] == ["batch 0", "writer", "batch 2"], order


def _write_when_free(db_url: str, waiting: threading.Event, order: list[str]) -> None:
    """Another process's checkpoint: a write transaction on its own connection,
    through SQLite's busy handler as the store's own writes go."""
    conn = sqlite3.connect(db_url.removeprefix("sqlite:///"), timeout=DEADLINE, isolation_level=None)
    conn.set_trace_callback(lambda sql: waiting.set() if sql.startswith("BEGIN") else None)
    with contextlib.closing(conn):
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO gcra (key, tat) VALUES ('probe', 1e12)")
        conn.execute("COMMIT")
        order.append("writer")


def test_postgresql_paces_lighter_than_sqlite() -> None:
    """SQLite's one write lock gets the default pace; PostgreSQL's row locks a
    longer budget and shorter rests."""
    lite, pg = pace_for("sqlite", runs=7), pace_for("postgres", runs=7)
    assert lite == Pace(runs=7) and pg.runs == 7
    assert pg.budget > lite.budget and pg.duty > lite.duty
    lite.held = pg.held = 0.2
    assert pg.after() < lite.after() and pg.scale == 1.0 > lite.scale  # 0.2 s: within PostgreSQL's budget
