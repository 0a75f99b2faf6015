"""The engine's own cost of a sequential three-step run on SQLite (issue 18,
sequential latency): what it counts and where its time goes.

    .venv/bin/python bench/bench_hot_path.py [--runs 300] [--sync full|normal]
    PYTHONPATH=<tree>:<tree>/bench .venv/bin/python bench/bench_hot_path.py   # another tree

The ``workloads.three_step_latencies`` loop (send, ``runs.list`` for the id,
``runs.wait``; an in-process worker), twice on fresh databases:

1. plain: p50 / p90 send -> completed, and the process's CPU time per run;
2. instrumented: per run, the statements sent to SQLite, the turns of the event
   loop, the tasks created, and the wall time spent in the write transactions'
   ``COMMIT`` (the fsync at ``synchronous=full``), in every other statement,
   and outside SQLite (the engine's Python and the loop): mean per run.

Counts do not depend on the machine's load; times do (compare trees in the
same minutes).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from typing import Any

from workloads import add_three_steps, pct

import stepstone as ss
from stepstone.store.sqlite import SqliteStore

WARM_UP = 20


class _Timed:
    """A connection whose statements are counted and timed (COMMIT apart)."""

    def __init__(self, conn: sqlite3.Connection, tally: dict[str, float]) -> None:
        self._conn, self._tally = conn, tally

    def execute(self, sql: str, params: Any = ()) -> sqlite3.Cursor:
        started = time.perf_counter()
        try:
            return self._conn.execute(sql, params)
        finally:
            kind = "commit" if sql == "COMMIT" else "statements"
            self._tally[kind] += time.perf_counter() - started
            self._tally["count"] += 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


async def _runs(app: ss.App, runs: int, tally: dict[str, float] | None) -> tuple[list[float], float]:
    """Latencies of ``runs`` runs after a warm-up, and their CPU seconds."""
    add_three_steps(app)
    await app.start_async(concurrency=10)
    loop = asyncio.get_running_loop()
    turn = loop._run_once  # type: ignore[attr-defined]

    def counted_turn() -> None:
        if tally is not None:
            tally["turns"] += 1
        turn()

    def task_factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        if tally is not None:
            tally["tasks"] += 1
        return asyncio.Task(coro, loop=loop, **kwargs)

    async def one() -> float:
        started = time.perf_counter()
        [eid] = await app.send_async(ss.Event("three"))
        [run] = await app.runs.list_async(event_id=eid)
        done = await app.runs.wait_async(run.id, timeout="30s")
        assert done.status == "completed"
        return time.perf_counter() - started

    for _ in range(WARM_UP):
        await one()
    if tally is not None:
        tally.update(dict.fromkeys(tally, 0.0))
        loop._run_once = counted_turn  # type: ignore[attr-defined]
        loop.set_task_factory(task_factory)
    cpu = time.process_time()
    latencies = [await one() for _ in range(runs)]
    cpu = time.process_time() - cpu
    loop._run_once = turn  # type: ignore[attr-defined]
    loop.set_task_factory(None)
    await app.stop_async()
    app.close()
    return latencies, cpu


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--sync", choices=["full", "normal"], default="full")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        app = ss.App("hot", database_url=f"sqlite:///{folder}/plain.db?synchronous={args.sync}")
        latencies, cpu = asyncio.run(_runs(app, args.runs, None))
    tally: dict[str, float] = dict.fromkeys(("count", "commit", "statements", "turns", "tasks"), 0.0)
    connect = SqliteStore.connect
    SqliteStore.connect = lambda self: _Timed(connect(self), tally)  # type: ignore[assignment,method-assign,return-value]
    with tempfile.TemporaryDirectory() as folder:
        app = ss.App("hot", database_url=f"sqlite:///{folder}/timed.db?synchronous={args.sync}")
        timed, _ = asyncio.run(_runs(app, args.runs, tally))
    SqliteStore.connect = connect  # type: ignore[method-assign]
    n = args.runs
    total = statistics.mean(timed) * 1e3
    commit, statements = tally["commit"] / n * 1e3, tally["statements"] / n * 1e3
    print(f"SQLite synchronous={args.sync}, {n} sequential three-step runs, pid {os.getpid()}")
    print(f"  p50 {statistics.median(latencies) * 1e3:.3f} ms  p90 {pct(latencies, 0.9) * 1e3:.3f} ms")
    print(f"  CPU per run {cpu / n * 1e3:.3f} ms")
    print(
        f"  per run: {tally['count'] / n:.2f} statements, {tally['turns'] / n:.2f} loop turns, "
        f"{tally['tasks'] / n:.2f} tasks"
    )
    print(
        f"  where the time goes (instrumented mean {total:.3f} ms): COMMITs {commit:.3f} ms, "
        f"other statements {statements:.3f} ms, outside SQLite {total - commit - statements:.3f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
