"""Where a sequential three-step run's SQLite time goes, by kind of call
(issue 18, target 4): ``BEGIN IMMEDIATE``, the statements, and ``COMMIT``
(the WAL frames written and, at ``synchronous=full``, their fsync), per run.

    .venv/bin/python bench/bench_sqlite_split.py [--sync full|off] [--runs 1000]

Every ``execute`` of the store's write transactions (``batching.run_together``
on SQLite's connection) is timed with ``perf_counter_ns`` and summed per run
(the workload of ``workloads.three_step_latencies``: send, list, wait); the
figures are the median run's, after a warm-up of ``WARM_UP`` runs (whose
first commits grow the WAL file: what a running engine no longer pays). A
median leaves out, as the run's p50 does, the WAL checkpoint SQLite makes
every ~30 runs. What they leave of the run's wall time (``bench_timeline.py``)
is the engine's Python. Run it with ``--sync off`` too: the difference of the
``COMMIT`` rows is the fsync; what the calls cost above the four one-row
commits of ``floor.py`` is what the run's rows, indexes and statements add.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import statistics
import tempfile
import time
from typing import Any

from workloads import add_three_steps

import stepstone as ss
import stepstone.store.sqlite as sqlite_store

KINDS = ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE")
WARM_UP = 200  # runs (~6,500 WAL frames: past the first checkpoints)


class Timed:
    """A connection whose ``execute`` calls are timed by kind (statement or transaction control)."""

    def __init__(self, conn: Any, times: dict[str, list[int]]) -> None:
        self.conn, self.times = conn, times

    def execute(self, sql: str, *args: Any) -> Any:
        began = time.perf_counter_ns()
        result = self.conn.execute(sql, *args)
        word = sql.split(None, 1)[0]
        self.times[word if word in KINDS else "statements"].append(time.perf_counter_ns() - began)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)


async def runs_split(app: ss.App, runs: int, times: dict[str, list[int]]) -> list[dict[str, int]]:
    """The workload of ``workloads.three_step_latencies``, each run's time by kind."""
    add_three_steps(app)
    await app.start_async(concurrency=10)
    split = []
    for i in range(runs + WARM_UP):
        times.clear()
        [event_id] = await app.send_async(ss.Event("three"))
        [run] = await app.runs.list_async(event_id=event_id)
        await app.runs.wait_async(run.id, timeout="30s")
        if i >= WARM_UP:
            split.append({kind: sum(spent) for kind, spent in times.items()})
    await app.stop_async()
    app.close()
    return split


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sync", default="full", help="SQLite's synchronous setting")
    parser.add_argument("--runs", type=int, default=1000)
    args = parser.parse_args()
    times: dict[str, list[int]] = collections.defaultdict(list)
    together = sqlite_store.run_together  # type: ignore[attr-defined]
    sqlite_store.run_together = lambda conn, *a, **k: together(Timed(conn, times), *a, **k)  # type: ignore[attr-defined]
    with tempfile.TemporaryDirectory() as folder:
        app = ss.App("split", database_url=f"sqlite:///{folder}/s.db?synchronous={args.sync}")
        split = asyncio.run(runs_split(app, args.runs, times))
    print(f"SQLite synchronous={args.sync}, {len(split)} runs; the median run's time inside SQLite calls:")
    for kind in ("BEGIN", "statements", "COMMIT"):
        print(f"  {kind:<10} {statistics.median(run.get(kind, 0) for run in split) / 1000:7.1f} µs")
    print(f"  {'all':<10} {statistics.median(sum(run.values()) for run in split) / 1000:7.1f} µs")


if __name__ == "__main__":
    main()
