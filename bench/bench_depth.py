"""Cost in queue depth (issue 18, target 2): a lease pass and a checkpoint with
10³, 10⁴, 10⁵ and 10⁶ queued runs of one function, on SQLite and PostgreSQL,
each as a ratio to the 10³ figure measured in the same run.

    .venv/bin/python bench/bench_depth.py                        # both stores, up to 10⁶
    .venv/bin/python bench/bench_depth.py --store sqlite --max 100000
    .venv/bin/python bench/bench_depth.py --database-url postgresql://...  # an existing server
    .venv/bin/python bench/bench_depth.py --parked   # the depth is sleeping runs ahead of due ones

The queue is filled with bulk INSERTs straight into ``runs`` and ``queue`` (one
transaction per size step; ``generate_series`` on PostgreSQL), not through
``send``: only the depth matters here, not how the runs got there. A lease pass
is what a worker's pass does (``scheduler.leasing.lease`` for ten runs plus
``next_due``), in its own transaction; a checkpoint is one completed step
committed on a leased run. Each figure is the median of ``--samples`` passes.
After each fill the database is settled (SQLite: the WAL checkpointed;
PostgreSQL: VACUUM ANALYZE and CHECKPOINT), as a queue grown over time would be, so
the figures are not the bulk load's own write-back.
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import stepstone as ss
from stepstone.scheduler.leasing import lease
from stepstone.store import make_store
from stepstone.store.base import Store, Tx
from stepstone.store.rows import Fence, LeasedRun, StepKind, StepRow, StepStatus

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

FUNCTION = "f"
WANTED = 10  # a worker's default concurrency
NOW = time.time()
UNTIL = NOW + 3600
DUE_IDS = 10**8  # ids (and queue order) of the due runs added behind parked ones
Fill = Callable[[int, int, float], None]  # (first id, end id, available_at)


def registry() -> Any:
    app = ss.App("bench-depth", database_url="sqlite:///never-opened.db")  # only its registry is used
    app.function(id=FUNCTION)(lambda ctx: None)
    return app.registry


# -- filling the queue ------------------------------------------------------------------
def fill_sqlite(path: str, start: int, stop: int, at: float) -> None:
    runs = ((f"r{i:09d}", NOW) for i in range(start, stop))
    fresh = int(at <= NOW)  # a run due later slept there: it was leased before
    items = ((f"r{i:09d}", at, NOW - 1 + i * 1e-6, fresh) for i in range(start, stop))
    with sqlite3.connect(path) as conn:
        conn.executemany(
            "INSERT INTO runs (id, function_id, status, event_ids, created_at) VALUES (?, 'f', 'queued', '[]', ?)",
            runs,
        )
        conn.executemany(
            "INSERT INTO queue (run_id, function_id, partition_key, available_at, sort_at, fresh) "
            "VALUES (?, 'f', 'f', ?, ?, ?)",
            items,
        )
    with sqlite3.connect(path) as conn:  # as a queue filled over time would have been
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def fill_postgres(url: str, start: int, stop: int, at: float) -> None:
    import psycopg

    with psycopg.connect(url) as conn:
        params = {"start": start, "stop": stop - 1, "now": NOW, "at": at, "fresh": int(at <= NOW)}
        conn.execute(
            "INSERT INTO runs (id, function_id, status, event_ids, created_at) "
            "SELECT 'r' || lpad(g::text, 9, '0'), 'f', 'queued', '[]', %(now)s "
            "FROM generate_series(%(start)s::int, %(stop)s::int) g",
            params,
        )
        conn.execute(
            "INSERT INTO queue (run_id, function_id, partition_key, available_at, sort_at, fresh) "
            "SELECT 'r' || lpad(g::text, 9, '0'), 'f', 'f', %(at)s, %(now)s - 1 + g * 1e-6, %(fresh)s "
            "FROM generate_series(%(start)s::int, %(stop)s::int) g",
            params,
        )
    with psycopg.connect(url, autocommit=True) as conn:
        # What autovacuum and the checkpointer do after a bulk load, done before
        # measuring rather than during it. (Until autovacuum has analyzed the
        # new rows the planner guesses a few per partition and may sort them:
        # see docs/benchmarks.md.)
        conn.execute("VACUUM ANALYZE queue, runs")
        conn.execute("CHECKPOINT")


# -- the two operations -----------------------------------------------------------------
def timed(op: Callable[[], object], samples: int) -> float:
    costs = []
    for _ in range(samples):
        t = time.perf_counter()
        op()
        costs.append(time.perf_counter() - t)
    return statistics.median(costs)


def measure(store: Store, functions: Any, samples: int, tag: str) -> tuple[float, float]:
    """(lease pass, checkpoint) medians in seconds; leases ``WANTED`` runs per pass."""
    held: list[LeasedRun] = []
    passes = iter(range(samples))

    def lease_pass() -> None:
        owner = f"w-{tag}-{next(passes)}"

        def op(tx: Tx) -> None:
            held.extend(lease(tx, owner, functions, WANTED, NOW, UNTIL))
            tx.next_due([FUNCTION])

        store.transact_sync(op)

    lease_cost = timed(lease_pass, samples)
    assert len(held) == WANTED * samples, f"leased {len(held)}, not {WANTED * samples}"
    steps = iter(range(samples))

    def checkpoint() -> None:
        n = next(steps)
        leased = held[n]
        fence = Fence(run_id=leased.run.id, owner=f"w-{tag}-{n // WANTED}", epoch=leased.epoch)
        row = StepRow(
            run_id=leased.run.id,
            step_id=f"s{n}",
            position=0,
            kind=StepKind.RUN,
            status=StepStatus.COMPLETED,
            attempts=1,
            output="1",
            started_at=NOW,
            ended_at=NOW,
        )
        store.transact_sync(lambda tx: tx.checkpoint(fence, [row], []))

    return lease_cost, timed(checkpoint, samples)


# -- the stores -------------------------------------------------------------------------
@contextmanager
def sqlite_target() -> Iterator[tuple[str, Fill]]:
    with tempfile.TemporaryDirectory() as folder:
        path = f"{folder}/depth.db"
        yield f"sqlite:///{path}", lambda start, stop, at: fill_sqlite(path, start, stop, at)


@contextmanager
def postgres_target(url: str | None) -> Iterator[tuple[str, Fill]]:
    if url is not None:
        yield url, lambda start, stop, at: fill_postgres(url, start, stop, at)
        return
    from tests.pgcluster import PgCluster

    cluster = PgCluster.start_new(settings={})  # PostgreSQL's durable defaults
    try:
        db = cluster.create_database("depth")
        yield db, lambda start, stop, at: fill_postgres(db, start, stop, at)
    finally:
        cluster.stop()


def curve(name: str, url: str, fill: Fill, sizes: list[int], samples: int, parked: bool) -> None:
    store = make_store(url)
    store.migrate()
    functions = registry()
    base: tuple[float, float] | None = None
    filled = 0
    print(f"\n{name}: {'queued':>9} {'lease pass':>12} {'ratio':>6} {'checkpoint':>12} {'ratio':>6}  (fill)")
    try:
        for size in sizes:
            t = time.perf_counter()
            if parked:  # sleeping a day, ahead of the due runs in queue order
                fill(filled, size, NOW + 86_400)
                fill(DUE_IDS + filled, DUE_IDS + filled + samples * WANTED, NOW - 1)
            else:
                fill(filled, size, NOW - 1)
            store.transact_sync(
                lambda tx: tx.lower_partition(FUNCTION, FUNCTION, None, NOW - 1)
            )  # as a send does
            filled, fill_seconds = size, time.perf_counter() - t
            cost = measure(store, functions, samples, str(size))
            base = base or cost
            print(
                f"{name}: {size:>9,} {cost[0] * 1e3:>9.2f} ms {cost[0] / base[0]:>5.2f}x "
                f"{cost[1] * 1e3:>9.2f} ms {cost[1] / base[1]:>5.2f}x  ({fill_seconds:.1f} s)",
                flush=True,
            )
    finally:
        store.close()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--max", type=int, default=1_000_000)
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument(
        "--parked", action="store_true", help="the depth is runs sleeping ahead of the due ones"
    )
    parser.add_argument("--database-url", default=None, help="an existing, empty PostgreSQL database")
    args = parser.parse_args()
    sizes = [n for n in (1_000, 10_000, 100_000, 1_000_000) if n <= args.max]
    if args.store in ("sqlite", "both"):
        with sqlite_target() as (url, fill):
            curve("sqlite", url, fill, sizes, args.samples, args.parked)
    if args.store in ("postgres", "both"):
        with postgres_target(args.database_url) as (url, fill):
            curve("postgres", url, fill, sizes, args.samples, args.parked)
    return 0


if __name__ == "__main__":
    sys.exit(main())
