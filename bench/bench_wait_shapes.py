"""Cost in wait count by condition shape (issue 18, target 3): matching one
incoming event against 10 and against 100,000 waiting runs, for each common
shape of ``if_`` condition, as a ratio measured in the same run.

    .venv/bin/python bench/bench_wait_shapes.py [--waits 100000] [--samples 9] [--store both]
    .venv/bin/python bench/bench_wait_shapes.py --store postgres --database-url postgresql://...

The waits are written straight through the store (``build_wait`` and
``insert_wait`` in one transaction), not by parking real runs: only their
number and condition matter here. A send is what ingestion does to match an
event (``runtime.waits.match_event`` in one write transaction); each resolves
exactly one wait. Every measurement gets a fresh database (a SQLite file; on
PostgreSQL a database of a private cluster, or of the server ``--database-url``
names, analysed after the waits are written, as autovacuum would; a SQLite WAL is
checkpointed).
"""

from __future__ import annotations

import argparse
import itertools
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from stepstone.expressions import index_shape
from stepstone.runtime.waits import build_wait, match_event, survey
from stepstone.store import make_store
from stepstone.store.base import Store, Tx
from stepstone.store.rows import WaitKind, WaitRow

NOW = time.time()
# shape name -> (condition, the waiting run's event data for wait i, the incoming data resolving wait i)
SHAPES: dict[str, tuple[str, Any, Any]] = {
    "equality (indexed)": (
        "async.data.k == event.data.k",
        lambda i: {"k": i},
        lambda i: {"k": i},
    ),
    "&& of equalities (indexed)": (
        "async.data.k == event.data.k && async.data.kind == event.data.kind",
        lambda i: {"k": i, "kind": "order"},
        lambda i: {"k": i, "kind": "order"},
    ),
    "run's value in event's list": (
        "event.data.k in async.data.ks",
        lambda i: {"k": i},
        lambda i: {"ks": [i, -i - 1]},
    ),
    "event's value in run's list": (
        "async.data.k in event.data.ks",
        lambda i: {"ks": [i, -i - 1]},
        lambda i: {"k": i},
    ),
    "string prefix": (
        "async.data.path.startsWith(event.data.prefix)",
        lambda i: {"prefix": f"/orders/{i}/"},
        lambda i: {"path": f"/orders/{i}/paid"},
    ),
    "run's string starts with": (
        "event.data.path.startsWith(async.data.prefix)",
        lambda i: {"path": f"/orders/{i}/paid"},
        lambda i: {"prefix": f"/orders/{i}/"},
    ),
    "comparison": (
        "async.data.n > event.data.n && async.data.n < event.data.n + 1",
        lambda i: {"n": i},
        lambda i: {"n": i + 0.5},
    ),
    "endsWith (unindexed)": (
        "async.data.path.endsWith(event.data.suffix)",
        lambda i: {"suffix": f"/{i}/paid"},
        lambda i: {"path": f"/orders/{i}/paid"},
    ),
}


def park(store: Store, condition: str, run_event: Any, count: int) -> None:
    def op(tx: Tx) -> None:
        for i in range(count):
            tx.insert_wait(
                build_wait(
                    run_id=f"r{i}",
                    step_id="done",
                    kind=WaitKind.EVENT,
                    event_name="bench.done",
                    condition=condition,
                    run_event={"name": "bench.start", "data": run_event(i)},
                    now=NOW,
                    expires_at=None,
                    field="if_",
                )
            )

    store.transact_sync(op)


def send(store: Store, data: dict[str, Any], n: int, surveyed: bool) -> tuple[list[WaitRow], float]:
    """Match one incoming event (its own write transaction, as ingestion); with
    ``surveyed``, unindexed waits are first read and evaluated in a read
    transaction, as ``App.send`` does for a name with many. Returns the
    matches and the time the write transaction took."""
    variables = {"event": {"name": "bench.done", "data": data, "id": f"e{n}", "ts": 0}}
    matched: list[WaitRow] = []
    found = None
    if surveyed:
        found = store.read_sync(lambda tx: survey(tx, "bench.done", variables, NOW, lambda *_: None))
    t = time.perf_counter()
    store.transact_sync(lambda tx: match_event(tx, "bench.done", data, variables, NOW, matched.append, found))
    return matched, time.perf_counter() - t


def measure(url_of: Callable[[], str], shape: str, waits: int, samples: int, surveyed: bool) -> list[float]:
    """Median send with 10 waits, with ``waits`` and the latter's write
    transaction, in seconds: the two databases' sends alternate, so that the
    load of a shared machine weighs on both alike."""
    condition, run_event, incoming = SHAPES[shape]
    stores = []
    try:
        for count in (10, waits):
            url = url_of()
            stores.append(make_store(url))
            stores[-1].migrate()
            park(stores[-1], condition, run_event, count)
            settle(url)
        costs: list[list[float]] = [[], [], []]
        for n in range(samples):
            for which, (store, count) in enumerate(zip(stores, (10, waits), strict=True)):
                i = count - 1 - n * max(1, count // samples)
                t = time.perf_counter()
                matched, write = send(store, incoming(i), n, surveyed)
                costs[which].append(time.perf_counter() - t)
                if which:
                    costs[2].append(write)
                assert [w.run_id for w in matched] == [f"r{i}"], matched
        return [statistics.median(c) for c in costs]
    finally:
        for store in stores:
            store.close()


def settle(url: str) -> None:
    """What the database does in the background after a bulk load, done before
    measuring: SQLite checkpoints its WAL (else the first send's commit would);
    PostgreSQL's autovacuum analyses the new rows and the checkpointer writes
    them out."""
    if url.startswith("sqlite:///"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE waits, wait_keys")
        conn.execute("CHECKPOINT")  # not one in the middle of the sends


def table(name: str, url_of: Callable[[], str], shapes: list[str], waits: int, samples: int) -> None:
    """A row per shape: a send with 10 waits, with ``waits``, their ratio; for
    an unindexed shape, a second row surveyed (``App.send``'s path for a name
    with many), whose last column is the write transaction's time."""
    print(f"\n{name}: {'shape':<32} {'10 waits':>10} {waits:>9,} waits  ratio  write tx")
    for shape in shapes:
        variants = [False] if index_shape(SHAPES[shape][0]) else [False, True]
        for surveyed in variants:
            small, big, write = measure(url_of, shape, waits, samples, surveyed)
            label = f"{shape}, surveyed" if surveyed else shape
            print(
                f"{'':<{len(name) + 2}}{label:<32} {small * 1e3:>7.2f} ms {big * 1e3:>10.2f} ms "
                f"{big / small:>6.1f}x {write * 1e3:>6.2f} ms",
                flush=True,
            )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--waits", type=int, default=100_000)
    parser.add_argument("--samples", type=int, default=9, help="at most 10")
    parser.add_argument("--shape", choices=sorted(SHAPES), action="append")
    parser.add_argument("--store", choices=["sqlite", "postgres", "both"], default="sqlite")
    parser.add_argument("--database-url", default=None, help="a PostgreSQL server to create databases on")
    args = parser.parse_args()
    shapes = args.shape or list(SHAPES)
    names = itertools.count()
    if args.store in ("sqlite", "both"):
        with tempfile.TemporaryDirectory() as folder:
            table(
                "sqlite",
                lambda: f"sqlite:///{folder}/waits{next(names)}.db",
                shapes,
                args.waits,
                args.samples,
            )
    if args.store in ("postgres", "both"):
        from bench_postgres import server

        with server(args.database_url) as create:
            table("postgres", lambda: str(create(f"waits{next(names)}")), shapes, args.waits, args.samples)
    return 0


if __name__ == "__main__":
    sys.exit(main())
