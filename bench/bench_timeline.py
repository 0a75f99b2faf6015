"""Where a sequential three-step run's wall time goes (issue 18, target 4):
a timeline of one run, median over many, on SQLite or PostgreSQL.

    .venv/bin/python bench/bench_timeline.py [--store sqlite|postgres] [--runs 500]
    .venv/bin/python bench/bench_timeline.py --sync off                    # SQLite without fsync
    PYTHONPATH=<tree>:<tree>/bench .venv/bin/python bench/bench_timeline.py  # another tree

The ``workloads`` run (send, ``runs.list(event_id=)``, ``runs.wait``; an
in-process worker at concurrency 10), stamped with ``time.perf_counter_ns`` at:
the send called and returned, the list and the wait returned, each step's
function called, the handler's body begun and returned, ``run_handler`` and
the run's end (``executor._finish``), the worker spawning the send's run and the app telling the waiter (``_run_changed``); and
around every commit: SQLite's write transaction (``SqliteStore._write``), or
each PostgreSQL round trip (``pgwire.Wire.sync``). Runs whose stamps came in
another order (a lease pass, a WAL checkpoint) are left out; the gaps are
medians over the rest. Between two database stamps is the engine's own
Python; inside them, the statements (and, on SQLite, the Python of the
operation that issues them).

PostgreSQL runs on a private durable cluster (``bench_postgres.server``, or
``--database-url``); SQLite on a temporary file at ``--sync`` (``full``).
The stamps cost ~0.5 µs each: read the gaps, not the sum, as the engine's.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import functools
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

from bench_postgres import server

import stepstone as ss
from stepstone import app as app_module
from stepstone import executor, worker

Stamp = tuple[str, int]
stamps: list[Stamp] = []


def stamp(label: str) -> None:
    stamps.append((label, time.perf_counter_ns()))


def around(owner: Any, name: str, label: str) -> None:
    """Stamp ``label>`` and ``label<`` around ``owner.name`` (a function or a coroutine function)."""
    fn = getattr(owner, name)
    if asyncio.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def awaited(*args: Any, **kwargs: Any) -> Any:
            stamp(label + ">")
            try:
                return await fn(*args, **kwargs)
            finally:
                stamp(label + "<")

        setattr(owner, name, awaited)
        return

    @functools.wraps(fn)
    def called(*args: Any, **kwargs: Any) -> Any:
        stamp(label + ">")
        try:
            return fn(*args, **kwargs)
        finally:
            stamp(label + "<")

    setattr(owner, name, called)


def instrument(store: str) -> None:
    if store == "sqlite":
        from stepstone.store.sqlite import SqliteStore

        around(SqliteStore, "_write", "commit")
    else:
        from stepstone.store.pgwire import Wire

        sync = Wire.sync

        def trip(wire: Wire) -> None:  # a sync with nothing outstanding is no round trip
            if not wire.sent:
                return sync(wire)
            stamp("trip>")
            try:
                return sync(wire)
            finally:
                stamp("trip<")

        Wire.sync = trip  # type: ignore[method-assign,assignment]
    around(executor, "run_handler", "handler")
    around(executor, "_finish", "end")
    around(worker.Worker, "_spawn", "spawn")
    around(app_module.App, "_run_changed", "told")


async def timeline(url: str, runs: int, warm_up: int = 20) -> list[list[Stamp]]:
    app = ss.App("timeline", database_url=url)

    async def trivial(name: str) -> int:
        stamp(f"step {name}")
        return 1

    @app.function(id="three", trigger=ss.on_event("three"))
    async def three(ctx: ss.Context) -> int:
        stamp("body>")
        for name in ("a", "b", "c"):
            await ctx.step.run(name, trivial, name)
        stamp("body<")
        return 3

    await app.start_async(concurrency=10)
    seen: list[list[Stamp]] = []
    for i in range(runs + warm_up):
        stamps.clear()
        stamp("send>")
        [event_id] = await app.send_async(ss.Event("three"))
        stamp("send<")
        [run] = await app.runs.list_async(event_id=event_id)
        stamp("listed")
        done = await app.runs.wait_async(run.id, timeout="30s")
        stamp("waited")
        assert done.status == "completed"
        if i >= warm_up:
            seen.append(list(stamps))
    await app.stop_async()
    app.close()
    return seen


def report(seen: list[list[Stamp]], database: Callable[[str], bool]) -> None:
    shapes = collections.Counter(tuple(label for label, _ in run) for run in seen)
    shape, count = shapes.most_common(1)[0]
    same = [run for run in seen if tuple(label for label, _ in run) == shape]
    print(f"{count} of {len(seen)} runs in the usual order; median gaps (µs):")
    engine = db = 0.0
    for k in range(1, len(shape)):
        gap = statistics.median((run[k][1] - run[k - 1][1]) / 1e3 for run in same)
        inside = database(shape[k])  # between a database stamp's ">" and its "<"
        db, engine = (db + gap, engine) if inside else (db, engine + gap)
        print(f"  {shape[k - 1]:>10} -> {shape[k]:<10} {gap:8.1f}{'  (database)' if inside else ''}")
    total = statistics.median((run[-1][1] - run[0][1]) / 1e3 for run in same)
    print(
        f"send -> waited: {total:.0f} µs (median); gaps inside database calls {db:.0f}, outside {engine:.0f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--store", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--sync", default="full", help="SQLite's synchronous setting")
    parser.add_argument("--database-url", help="a PostgreSQL server to create a database on")
    args = parser.parse_args()
    instrument(args.store)
    if args.store == "sqlite":
        with tempfile.TemporaryDirectory() as folder:
            seen = asyncio.run(timeline(f"sqlite:///{folder}/t.db?synchronous={args.sync}", args.runs))
        report(seen, lambda label: label == "commit<")
        return
    with server(args.database_url) as create:
        seen = asyncio.run(timeline(create("timeline"), args.runs))
    report(seen, lambda label: label == "trip<")


if __name__ == "__main__":
    main()
