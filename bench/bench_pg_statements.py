"""Where a sequential three-step run's PostgreSQL transactions spend their time
(issue 18, target 4): the server's execution time per statement
(``pg_stat_statements``) and each kind of transaction's wall time, with the
part of it spent waiting for the server (``pgwire.Wire.sync``). A durable
private cluster (PostgreSQL's defaults), one run at a time.

    PYTHONPATH=<tree>:<tree>/bench .venv/bin/python <tree>/bench/bench_pg_statements.py [--runs 300]

A transaction's kind is the names of its first four statements.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time
from typing import Any

import psycopg
from bench_postgres import server
from workloads import three_step_latencies

import stepstone as ss
from stepstone.store import pgwire, sqlbase
from stepstone.store.postgres import PostgresStore


class Timings:
    """Each write transaction's statements, wall time and time in ``Wire.sync``."""

    def __init__(self) -> None:
        self.local = threading.local()
        self.walls: dict[str, list[float]] = {}
        self.waits: dict[str, list[float]] = {}

    def install(self) -> None:
        timings, local = self, self.local
        run, write, sync = sqlbase.SqlPlumbing._exec, PostgresStore._write, pgwire.Wire.sync

        def named(plumbing: Any, name: str, *args: Any) -> Any:
            if getattr(local, "names", None) is not None:
                local.names.append(name)
            return run(plumbing, name, *args)

        def timed_write(store: PostgresStore, conn: Any, ops: list[Any]) -> Any:
            local.names, local.waited, start = [], 0.0, time.perf_counter()
            try:
                return write(store, conn, ops)
            finally:
                kind = "+".join(local.names[:4])
                timings.walls.setdefault(kind, []).append(time.perf_counter() - start)
                timings.waits.setdefault(kind, []).append(local.waited)
                local.names = None

        def timed_sync(wire: pgwire.Wire) -> None:
            start = time.perf_counter()
            try:
                sync(wire)
            finally:
                if getattr(local, "names", None) is not None:
                    local.waited += time.perf_counter() - start

        sqlbase.SqlPlumbing._exec = named  # type: ignore[method-assign,assignment]
        PostgresStore._write = timed_write  # type: ignore[method-assign,assignment]
        pgwire.Wire.sync = timed_sync  # type: ignore[method-assign,assignment]

    def report(self, runs: int) -> str:
        lines = []
        for kind, walls in sorted(self.walls.items(), key=lambda item: -len(item[1]))[:4]:
            wall, wait = statistics.median(walls) * 1e3, statistics.median(self.waits[kind]) * 1e3
            lines.append(f"  {len(walls) / runs:4.2f}/run  p50 {wall:.3f} ms, waiting {wait:.3f} ms  {kind}")
        return "\n".join(lines)


def server_times(conn: psycopg.Connection[Any], runs: int) -> str:
    rows = conn.execute(
        "SELECT calls, total_exec_time, plans, total_plan_time, query FROM pg_stat_statements"
        " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
        " AND calls >= %s ORDER BY total_exec_time DESC",
        (runs,),
    ).fetchall()
    executed, planned = (sum(row[i] for row in rows) / runs * 1e3 for i in (1, 3))
    lines = [
        f"  server execution per run: {executed:.0f} us, planning {planned:.0f} us (plans per call, plan us)"
    ]
    for calls, ms, plans, plan_ms, query in rows[:12]:
        lines.append(
            f"  {calls / runs:4.2f}/run {ms / calls * 1e3:6.1f} us {plans / calls:4.2f} {plan_ms / max(plans, 1) * 1e3:6.1f} us"
            f"  {' '.join(str(query).split())[:70]}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=300)
    args = parser.parse_args()
    timings = Timings()
    timings.install()
    with server(None, statements=True) as create:
        url = create("statements")
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            asyncio.run(three_step_latencies(ss.App("warm", database_url=url), 20))
            conn.execute("SELECT pg_stat_statements_reset()")
            timings.walls.clear()
            timings.waits.clear()
            latencies = asyncio.run(three_step_latencies(ss.App("bench", database_url=url), args.runs, 0))
            print(f"three-step run p50 {statistics.median(latencies) * 1e3:.2f} ms")
            print(timings.report(args.runs))
            print(server_times(conn, args.runs))


if __name__ == "__main__":
    main()
