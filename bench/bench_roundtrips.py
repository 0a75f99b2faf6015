"""Round trips to PostgreSQL per sequential three-step run, by operation (issue 18,
target 4). Counted, not timed, so the figures hold on a loaded host.

    .venv/bin/python bench/bench_roundtrips.py                 # private cluster
    .venv/bin/python bench/bench_roundtrips.py --runs 100 --database-url postgresql://...

A round trip is a statement executed outside a pipeline, or a wait for the
results of a pipeline (``pgwire.Wire.sync`` with statements outstanding). "Waited
for" leaves out the round trip of each event loop's read's ``COMMIT``: its
caller has the value before. Every
write (``PostgresStore._write``) and read (``_read``) is attributed to the
operation it runs (its function's qualified name).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import statistics
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
from bench_postgres import server
from workloads import three_step_latencies

import stepstone as ss
from stepstone.store import pgwire
from stepstone.store.postgres import PostgresStore


class Counter:
    """Round trips and statements of the operation running on each thread."""

    def __init__(self) -> None:
        self.local = threading.local()
        self.trips: dict[str, list[int]] = collections.defaultdict(list)
        self.statements: dict[str, list[int]] = collections.defaultdict(list)
        self.early = 0  # round trips a read's caller did not wait for (its COMMIT's)

    def begin(self) -> None:
        self.local.trips, self.local.statements = 0, 0

    def end(self, name: str) -> None:
        self.trips[name].append(self.local.trips)
        self.statements[name].append(self.local.statements)

    def counting(self) -> bool:
        return hasattr(self.local, "trips")

    def install(self) -> None:
        """Wrap the store's and psycopg's entry points (this process only)."""
        counter = self
        write, read = PostgresStore._write, PostgresStore._read
        sync, send = pgwire.Wire.sync, pgwire.Wire.execute
        execute = psycopg.Connection.execute

        def counted_write(store: PostgresStore, conn: Any, ops: list[Callable[[Any], Any]]) -> Any:
            counter.begin()
            try:
                return write(store, conn, ops)
            finally:
                counter.end("write " + "+".join(_name(op) for op in ops))

        def counted_read(store: PostgresStore, op: Callable[[Any], Any], ready: Any, *wait: float) -> Any:
            counter.begin()

            def told(value: Any) -> None:
                counter.early += 1  # the caller has it: the COMMIT's round trip is not waited for
                ready(value)

            try:
                return read(store, op, None if ready is None else told, *wait)
            finally:
                counter.end("read " + _name(op))

        def counted_sync(wire: pgwire.Wire) -> None:
            if wire.sent and counter.counting():
                counter.local.trips += 1
            sync(wire)

        def counted_send(wire: pgwire.Wire, query: str, params: Any = None) -> Any:
            if counter.counting():
                counter.local.statements += 1
            return send(wire, query, params)

        def counted_execute(conn: Any, query: Any, params: Any = None, **kwargs: Any) -> Any:
            if counter.counting():
                counter.local.trips += 1
                counter.local.statements += 1
            return execute(conn, query, params, **kwargs)

        PostgresStore._write = counted_write  # type: ignore[method-assign,assignment]
        PostgresStore._read = counted_read  # type: ignore[method-assign,assignment]
        pgwire.Wire.sync = counted_sync  # type: ignore[method-assign,assignment]
        pgwire.Wire.execute = counted_send  # type: ignore[method-assign,assignment]
        psycopg.Connection.execute = counted_execute  # type: ignore[method-assign,assignment]


def _name(op: Callable[[Any], Any]) -> str:
    name = getattr(op, "__qualname__", type(op).__name__)
    return str(name).replace(".<locals>", "")


def report(counter: Counter, runs: int) -> Iterator[str]:
    totals = {"write": 0, "read": 0}
    for name in sorted(counter.trips, key=lambda n: -len(counter.trips[n])):
        trips, statements = counter.trips[name], counter.statements[name]
        totals[name.split(" ")[0]] += sum(trips)
        shapes = collections.Counter(zip(statements, trips, strict=True))
        detail = ", ".join(f"{n}x {s} statements in {t} trips" for (s, t), n in sorted(shapes.items()))
        yield f"  {name[:60]:60s} {len(trips) / runs:5.2f} per run: {detail}"
    yield (
        f"round trips per run: writes {totals['write'] / runs:.1f}, reads {totals['read'] / runs:.1f}, "
        f"total {(totals['write'] + totals['read']) / runs:.1f} (start-up included); "
        f"waited for: {(totals['write'] + totals['read'] - counter.early) / runs:.1f} "
        f"(an event loop's read has its value before its COMMIT's round trip)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--runs", type=int, default=100)
    args = parser.parse_args()
    counter = Counter()
    counter.install()
    with server(args.database_url) as create:
        app = ss.App("bench", database_url=create("trips"))
        latencies = asyncio.run(three_step_latencies(app, args.runs, warm_up=0))
    for line in report(counter, args.runs):
        print(line)
    print(f"three-step run p50 {statistics.median(latencies) * 1e3:.2f} ms (timed, for reference)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
