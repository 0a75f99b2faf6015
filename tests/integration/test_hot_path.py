"""The engine's own cost per run (issue 18, sequential latency), pinned by counts.

A sequential three-step run on SQLite (send, ``runs.list`` for its id,
``runs.wait``; an in-process worker) is counted, not timed: statements sent to
SQLite, turns of the event loop and tasks created per run. The counts do not
depend on the machine's load, so a change that brings back a read, a task per
wake-up or a hop through the loop per commit fails here. Also pinned: how the
SQLite store's lane commits (a lone write in its submitter's turn, concurrent
writes together, timers never starved), and that ``runs.list(event_id=...)``
finds the event's runs through indexes instead of scanning every run.
"""

from __future__ import annotations

import asyncio
import cProfile
import itertools
import pstats
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import stepstone as ss
from stepstone.store.base import Tx
from stepstone.store.sqlite import DIALECT, SqliteStore, _Lane
from stepstone.worker import Worker

RUNS = 30  # measured after WARM_UP runs, so one-off work (registration, caches) is not counted
WARM_UP = 5


class Counts:
    def __init__(self) -> None:
        self.statements = 0
        self.turns = 0
        self.tasks = 0


@pytest.fixture
def counted_sqlite(monkeypatch: pytest.MonkeyPatch) -> Counts:
    """Every statement any connection of a SQLite store sends, counted."""
    counts = Counts()
    connect = SqliteStore.connect

    def counting(self: SqliteStore) -> sqlite3.Connection:
        conn = connect(self)

        def seen(_sql: str) -> None:
            counts.statements += 1

        conn.set_trace_callback(seen)
        return conn

    monkeypatch.setattr(SqliteStore, "connect", counting)

    async def no_retention(self: Worker) -> None:
        await asyncio.sleep(3600)  # a worker's retention pass at start is not a run's cost

    monkeypatch.setattr(Worker, "_prune_once", no_retention)
    return counts


async def _one() -> int:
    return 1


def _three_steps(app: ss.App) -> None:
    """``bench_hot_path.py``'s run: three trivial steps."""
    app.function(id="three", trigger=ss.on_event("three"))(_three)


async def _three(ctx: ss.Context) -> list[int]:
    return [await ctx.step.run(name, _one) for name in ("a", "b", "c")]


def _sequential_runs(app: ss.App, counts: Counts) -> None:
    """``RUNS`` runs one at a time, counted from after the warm-up."""

    async def one() -> None:
        [eid] = await app.send_async(ss.Event("three"))
        [run] = await app.runs.list_async(event_id=eid)
        done = await app.runs.wait_async(run.id, timeout="10s")
        assert done.status == "completed" and [s.id for s in done.steps] == ["a", "b", "c"]

    async def main() -> None:
        loop = asyncio.get_running_loop()
        turn = loop._run_once  # type: ignore[attr-defined]

        def counted_turn() -> None:
            counts.turns += 1
            turn()

        def task_factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
            counts.tasks += 1
            return asyncio.Task(coro, loop=loop, **kwargs)

        _three_steps(app)
        await app.start_async(concurrency=10)
        try:
            for _ in range(WARM_UP):
                await one()
            counts.statements = counts.tasks = 0
            loop._run_once = counted_turn  # type: ignore[attr-defined]
            loop.set_task_factory(task_factory)
            for _ in range(RUNS):
                await one()
            loop._run_once = turn  # type: ignore[attr-defined]
            loop.set_task_factory(None)
        finally:
            await app.stop_async()

    asyncio.run(main())


def test_a_sequential_three_step_run_costs_a_fixed_number_of_statements_turns_and_tasks(
    tmp_path: Path, counted_sqlite: Counts
) -> None:
    """Before this was pinned: 51.2 statements, 18 turns of the loop and 4 tasks
    per run (a task per ``wait_for`` of the worker's idle loop and of
    ``runs.wait``, two turns per commit, the first poll of ``runs.wait``
    reading the steps of a run still running). Now 50 statements (send 10,
    lease pass 15, two checkpoints 4 each, the last step and the end 9, the
    three reads 4 + 3 + 4, less the reads' BEGIN counted once: see the
    breakdown in docs/benchmarks.md), 5 turns, and one task: the invocation's."""
    app = ss.App("hot", database_url=f"sqlite:///{tmp_path}/hot.db")
    try:
        _sequential_runs(app, counted_sqlite)
    finally:
        app.close()
    per_run = counted_sqlite.statements / RUNS
    assert per_run <= 50.5, per_run
    assert counted_sqlite.tasks / RUNS == 1, counted_sqlite.tasks
    assert counted_sqlite.turns / RUNS <= 8, counted_sqlite.turns  # 5, and idle polls under load


# -- the SQLite store's lane ----------------------------------------------------------------------


@pytest.fixture
def lane_store(tmp_path: Path) -> Iterator[SqliteStore]:
    store = SqliteStore(str(tmp_path / "lane.db"))
    store.migrate()
    yield store
    store.close()


_keys = itertools.count()


def _noop_write(tx: Tx) -> int:
    """A write that changes a row every time (``commits`` counts only those)."""
    tx.lower_partition(f"p{next(_keys)}", "f", None, 1.0)
    return 1


def test_a_lone_write_commits_in_its_submitters_turn(lane_store: SqliteStore) -> None:
    """Awaited while nothing else is ready, a write commits before the loop
    turns again: a timer due at once has not fired when the write returns."""
    fired: list[bool] = []

    async def main() -> tuple[bool, bool]:
        asyncio.get_running_loop().call_later(0, fired.append, True)
        future = lane_store.submit(_noop_write)
        submitted = future.done()  # submitting alone commits nothing yet
        await future
        return submitted, bool(fired)

    assert asyncio.run(main()) == (False, False)
    assert lane_store.commits == 1


def test_writes_submitted_in_one_turn_share_one_transaction(lane_store: SqliteStore) -> None:
    """What one callback submits before it waits is one transaction, committed
    early or not (README: operations submitted in the same turn share one)."""

    async def main() -> list[int]:
        futures = [lane_store.submit(_noop_write) for _ in range(5)]
        first = [await futures[0]]  # the early commit carries all five
        return first + [await f for f in futures[1:]]

    assert asyncio.run(main()) == [1] * 5
    assert lane_store.commits == 1


def test_writes_of_tasks_ready_together_share_one_transaction(lane_store: SqliteStore) -> None:
    async def main() -> list[int]:
        return list(await asyncio.gather(*(lane_store.transact(_noop_write) for _ in range(10))))

    assert asyncio.run(main()) == [1] * 10
    assert lane_store.commits == 1  # group commit: one transaction for the ten tasks


def test_writes_in_a_row_that_never_yield_still_let_timers_run(lane_store: SqliteStore) -> None:
    """A handler whose steps never await commits eagerly at most ``EAGER_RUN``
    times in a row; then a write waits for the loop's turn, where due timers
    (the heartbeat, a sleep's wake-up) run."""
    fired: list[int] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        done = 0

        def timer() -> None:
            fired.append(done)

        loop.call_later(0, timer)
        for _ in range(3 * _Lane.EAGER_RUN):
            await lane_store.transact(_noop_write)
            done += 1

    asyncio.run(main())
    assert fired and fired[0] <= _Lane.EAGER_RUN, fired
    assert lane_store.commits == 3 * _Lane.EAGER_RUN


def test_a_write_submitted_inside_a_commit_waits_for_its_own_transaction(lane_store: SqliteStore) -> None:
    """A write submitted while the lane is committing (a fault hook, a progress
    report) is not committed inside that transaction: it gets its own."""
    inner: list[asyncio.Future[int]] = []

    def outer(tx: Tx) -> int:
        inner.append(lane_store.submit(_noop_write))
        return _noop_write(tx)

    async def main() -> tuple[int, int]:
        first = await lane_store.transact(outer)
        return first, await inner[0]

    assert asyncio.run(main()) == (1, 1)
    assert lane_store.commits == 2


# -- runs.list(event_id=...) ------------------------------------------------------------------------


def test_listing_the_runs_of_an_event_reads_them_through_indexes(lane_store: SqliteStore) -> None:
    """``runs.list(event_id=...)`` (how a caller finds the runs its send
    started) tested the event on every run, newest first, until ``limit`` runs
    matched: a scan of the whole table for an event with fewer runs."""
    conn = sqlite3.connect(lane_store.path)
    params: dict[str, Any] = {
        "function_id": None,
        "any_status": 1,
        "since": None,
        "until": None,
        "before_id": None,
        "app_version": None,
        "event_id": "e1",
        "limit": 100,
    }
    sql = DIALECT.sql("list_runs_of_event", {"statuses": 0})
    plan = [str(row[3]) for row in conn.execute("EXPLAIN QUERY PLAN " + sql, params)]
    conn.close()
    assert not any(step.startswith("SCAN") for step in plan), plan
    assert any(step.startswith("SEARCH r ") for step in plan), plan  # runs by primary key


def test_listing_by_event_returns_the_events_runs_with_every_other_filter(
    make_app: Callable[..., ss.App],
) -> None:
    app = make_app()

    @app.function(id="one", trigger=ss.on_event("go"))
    async def one(ctx: ss.Context) -> int:
        return 1

    @app.function(id="two", trigger=ss.on_event("go"))
    async def two(ctx: ss.Context) -> int:
        return 2

    [first] = app.send(ss.Event("go"))
    app.send(ss.Event("go"))
    runs = app.runs.list(event_id=first)
    assert sorted(r.function_id for r in runs) == ["one", "two"]
    assert all(first in r.event_ids for r in runs)
    assert [r.function_id for r in app.runs.list(event_id=first, function_id="two")] == ["two"]
    assert app.runs.list(event_id=first, status="completed") == []
    assert len(app.runs.list(event_id=first, limit=1)) == 1
    assert app.runs.list(event_id="no-such-event") == []


def test_listing_runs_reads_their_steps_in_one_statement(tmp_path: Path, counted_sqlite: Counts) -> None:
    """``runs.list`` read each run's steps with a statement of its own (101
    statements for a page of 100 runs); now one for the page, each run with
    exactly its own steps."""
    app = ss.App("list", database_url=f"sqlite:///{tmp_path}/list.db")

    @app.function(id="f", trigger=ss.on_event("go"))
    async def f(ctx: ss.Context) -> int:
        for i in range(ctx.event.data["n"]):
            await ctx.step.run(f"s{i}", lambda i=i: i)
        return 0

    async def main() -> None:
        await app.start_async(concurrency=4)
        try:
            ids = await app.send_async([ss.Event("go", {"n": n}) for n in range(6)])
            for eid in ids:
                [run] = await app.runs.list_async(event_id=eid)
                await app.runs.wait_async(run.id, timeout="10s")
        finally:
            await app.stop_async()

    try:
        asyncio.run(main())
        before = counted_sqlite.statements
        runs = app.runs.list(function_id="f")
        statements = counted_sqlite.statements - before
    finally:
        app.close()
    assert sorted(len(r.steps) for r in runs) == list(range(6))
    for run in runs:
        assert [s.id for s in run.steps] == [f"s{i}" for i in range(len(run.steps))]
        assert [s.output for s in run.steps] == list(range(len(run.steps)))
    assert statements == 4, statements  # BEGIN, the runs, their steps, COMMIT


def test_a_send_imports_no_opentelemetry_in_a_process_that_never_did() -> None:
    """No span can be active where OpenTelemetry's API was never imported: the
    send's trace context is then ``None`` without importing it (~0.1 s, once)."""
    code = (
        "import sys, tempfile, stepstone as ss\n"
        "app = ss.App('t', database_url=f'sqlite:///{tempfile.mkdtemp()}/t.db')\n"
        "app.send(ss.Event('e'))\n"
        "app.close()\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]", out


def test_a_send_deep_copies_nothing(tmp_path: Path) -> None:
    """A run's queue spec was encoded through ``dataclasses.asdict`` (a deep
    copy of every field: the largest Python cost of a send); its fields are
    plain values, encoded as they are."""
    app = ss.App("send", database_url=f"sqlite:///{tmp_path}/send.db")
    app.function(id="f", trigger=ss.on_event("go"))(lambda ctx: None)
    try:
        app.send(ss.Event("go"))
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(20):
            app.send(ss.Event("go"))
        profile.disable()
        assert len(app.runs.list(function_id="f")) == 21
    finally:
        app.close()
    called = {f"{file}:{name}" for (file, _, name) in pstats.Stats(profile).stats}  # type: ignore[attr-defined]
    assert not [c for c in called if c.endswith(("dataclasses.py:asdict", "copy.py:deepcopy"))]
