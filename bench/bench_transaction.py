"""Transactional steps (issue 15): the per-step cost of ``step.transaction``
against ``step.run`` for the same one-row insert, on SQLite and PostgreSQL,
measured in the same run.

- ``transaction``: ``fn(conn)`` inserts the row on the store's connection,
  inside the step's checkpoint transaction (savepoint, bound, memo: one commit).
- ``run``: ``fn()`` inserts the row on a separate connection of its own and
  commits it, then the step's checkpoint commits (two commits, and the row
  is at-least-once).

A figure is the gap between consecutive steps of one run (the function
entered, step after step): interpreter, the user's insert and every commit.

    .venv/bin/python bench/bench_transaction.py                     # both stores
    .venv/bin/python bench/bench_transaction.py --steps 300 --only sqlite
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

from bench_postgres import server
from workloads import pct

import stepstone as ss


def insert_sql(url: str) -> str:
    mark = "?" if url.startswith("sqlite:") else "%s"
    return f"INSERT INTO items (run_id, v) VALUES ({mark}, {mark})"


def create_table(url: str) -> None:
    if url.startswith("sqlite:"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            conn.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, run_id TEXT, v TEXT)")
        return
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA shop")
        conn.execute("CREATE TABLE shop.items (id BIGSERIAL PRIMARY KEY, run_id TEXT, v TEXT)")


def own_connection(url: str) -> Any:
    """The ``run`` variant's connection: the user's own, opened once."""
    if url.startswith("sqlite:"):
        return sqlite3.connect(url.removeprefix("sqlite:///"), check_same_thread=False, timeout=30)
    import psycopg

    conn = psycopg.connect(url, options="-c search_path=shop")
    return conn


async def gaps(url: str, kind: str, steps: int) -> list[float]:
    """Per-step gaps of one run of ``steps`` inserts through ``kind``."""
    app = ss.App("bench", database_url=url)
    sql = insert_sql(url)
    if not url.startswith("sqlite:"):
        sql = sql.replace("items", "shop.items")
    stamps: list[float] = []
    separate = own_connection(url) if kind == "run" else None

    def in_transaction(conn: Any, run_id: str) -> int:
        stamps.append(time.perf_counter())
        conn.execute(sql, (run_id, "x" * 64))
        return 1

    def with_own_commit(run_id: str) -> int:
        stamps.append(time.perf_counter())
        assert separate is not None
        separate.execute(sql, (run_id, "x" * 64))
        separate.commit()
        return 1

    step: Callable[[ss.Context], Any]
    if kind == "transaction":

        async def step(ctx: ss.Context) -> Any:
            return await ctx.step.transaction("s", in_transaction, ctx.run_id)
    else:

        async def step(ctx: ss.Context) -> Any:
            return await ctx.step.run("s", with_own_commit, ctx.run_id)

    @app.function(id="inserts", trigger=ss.on_event("go"))
    async def inserts(ctx: ss.Context) -> int:
        for _ in range(steps):
            await step(ctx)
        return steps

    await app.start_async(concurrency=1)
    [eid] = await app.send_async(ss.Event("go"))
    [run] = await app.runs.list_async(event_id=eid)
    done = await app.runs.wait_async(run.id, timeout="600s")
    assert done.status == "completed", done.error
    await app.stop_async()
    app.close()
    if separate is not None:
        separate.close()
    return [b - a for a, b in itertools.pairwise(stamps)]


def report(store: str, url_for: Callable[[str], str], steps: int) -> None:
    figures: dict[str, list[float]] = {}
    for kind in ("run", "transaction"):
        url = url_for(kind)
        create_table(url)
        figures[kind] = asyncio.run(gaps(url, kind, steps))
    base = statistics.median(figures["run"])
    for kind, values in figures.items():
        med = statistics.median(values)
        print(
            f"{store:<10} {kind:<12} median {med * 1e6:8.0f} µs   p90 {pct(values, 0.9) * 1e6:8.0f} µs"
            f"   ratio to run {med / base:5.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--only", choices=["sqlite", "postgres"])
    parser.add_argument("--database-url", help="an existing PostgreSQL server (default: a private cluster)")
    args = parser.parse_args()
    print(f"per step, one run of {args.steps} one-row inserts each (gap between steps)")
    if args.only != "postgres":
        folder = tempfile.mkdtemp(prefix="bench-txn-")
        report("sqlite", lambda kind: f"sqlite:///{folder}/{kind}.db", args.steps)
    if args.only != "sqlite":
        with server(args.database_url) as create:
            report("postgres", create, args.steps)


if __name__ == "__main__":
    main()
