"""Core SQLite benchmark (issue 2): floor, per-step overhead, three-step latency,
throughput. Every figure is reported next to a raw SQLite commit measured in the
same run, for each durability setting.

    .venv/bin/python bench/bench_core.py            # both settings
    .venv/bin/python bench/bench_core.py --profile  # plus where the time goes
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import os
import pstats
import sqlite3
import statistics
import sys
import tempfile
import time
from typing import Any

from workloads import add_three_steps, pct, step_gaps, three_step_latencies

import stepstone as ss
from stepstone.store.sqlite import SqliteStore


def raw_commit(path: str, sync: str, n: int = 3000) -> list[float]:
    """The floor: one single-row INSERT committed in WAL mode."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(f"PRAGMA synchronous = {sync}")
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)")
    times = []
    for _ in range(n):
        t = time.perf_counter()
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO t (v) VALUES (?)", ("x" * 64,))
        conn.execute("COMMIT")
        times.append(time.perf_counter() - t)
    conn.close()
    return times


def make_app(folder: str, sync: str, middleware: tuple[ss.Middleware, ...] = ()) -> ss.App:
    return ss.App(
        "bench", database_url=f"sqlite:///{folder}/bench.db?synchronous={sync}", middleware=middleware
    )


async def per_step(
    folder: str, sync: str, steps: int = 900, middleware: tuple[ss.Middleware, ...] = ()
) -> list[float]:
    """Gaps between consecutive trivial steps of one run: interpreter + checkpoint."""
    return await step_gaps(make_app(folder, sync, middleware), steps, timeout="120s")


async def three_step_latency(folder: str, sync: str, runs: int = 300) -> list[float]:
    return await three_step_latencies(make_app(folder, sync), runs)


async def throughput(folder: str, sync: str, runs: int = 2000, concurrency: int = 10) -> dict[str, Any]:
    """2,000 queued three-step runs drained by one default worker."""
    app = make_app(folder, sync)

    add_three_steps(app)
    for start in range(0, runs, 500):
        await app.send_async([ss.Event("three") for _ in range(min(500, runs - start))])
    store = app.store
    assert isinstance(store, SqliteStore)
    commits_before = store.commits
    done = asyncio.Event()
    count = 0

    def on_end(run_id: str, _read: object = None) -> None:
        nonlocal count
        count += 1
        if count == runs:
            done.set()

    app._run_changed = on_end  # type: ignore[method-assign]
    t = time.perf_counter()
    await app.start_async(concurrency=concurrency)
    await asyncio.wait_for(done.wait(), 600)
    elapsed = time.perf_counter() - t
    commits = store.commits - commits_before
    await app.stop_async()
    completed = len(await app.runs.list_async(status="completed", limit=1000))
    app.close()
    assert completed == min(runs, 1000)
    return {
        "seconds": elapsed,
        "steps_per_s": 3 * runs / elapsed,
        "runs_per_s": runs / elapsed,
        "commits_per_run": commits / runs,
    }


def profile_steps(folder: str, sync: str) -> str:
    profiler = cProfile.Profile()
    profiler.enable()
    asyncio.run(per_step(folder, sync, steps=900))
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(14)
    return out.getvalue()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sync", choices=["full", "normal", "both"], default="both")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--runs", type=int, default=2000)
    args = parser.parse_args()
    settings = ["full", "normal"] if args.sync == "both" else [args.sync]
    print(f"python {sys.version.split()[0]}, sqlite {sqlite3.sqlite_version}, cpus {os.cpu_count()}")
    for sync in settings:
        with tempfile.TemporaryDirectory() as tmp:
            floor = raw_commit(f"{tmp}/raw.db", sync)
            gaps = asyncio.run(per_step(tmp + "/", sync))
        with tempfile.TemporaryDirectory() as tmp:
            latency = asyncio.run(three_step_latency(tmp, sync))
        with tempfile.TemporaryDirectory() as tmp:
            tput = asyncio.run(throughput(tmp, sync, runs=args.runs))
        f50, s50 = statistics.median(floor), statistics.median(gaps)
        print(f"\nsynchronous={sync}")
        print(f"  raw WAL commit (floor)      p50 {f50 * 1e6:8.1f} us   p99 {pct(floor, 0.99) * 1e6:8.1f} us")
        print(
            f"  per-step overhead           p50 {s50 * 1e6:8.1f} us   p99 {pct(gaps, 0.99) * 1e6:8.1f} us"
            f"   = {s50 / f50:.2f}x floor"
        )
        print(
            f"  three-step run send->done   p50 {statistics.median(latency) * 1e3:8.2f} ms  "
            f"p99 {pct(latency, 0.99) * 1e3:8.2f} ms"
        )
        print(
            f"  throughput {args.runs} runs x 3 steps: {tput['steps_per_s']:,.0f} steps/s "
            f"({tput['runs_per_s']:,.0f} runs/s, {tput['commits_per_run']:.2f} commits/run)"
        )
        if args.profile:
            with tempfile.TemporaryDirectory() as tmp:
                print(profile_steps(tmp, sync))
    return 0


if __name__ == "__main__":
    sys.exit(main())
