"""Retention benchmark (issue 17): checkpoint latency while old rows are pruned.

A database is filled with ``--runs`` old ended runs (each: a run, three steps,
four spans, an event link and an event: 10 rows, so 100,000 runs are
1,000,000 rows). One worker then executes runs of trivial steps one after the
other for the whole benchmark, and the gaps between its steps (interpreter +
fenced checkpoint) are measured, while another process prunes the old runs
with ``stepstone prune``'s own loop (``scheduler/retention.py`` ``run_plan``:
its batches, its pacing). The pruner is paused and resumed in alternating
windows (``--window`` seconds; a pause takes effect between two batches and is
acknowledged, so a quiet window holds no prune transaction): quiet and pruning
windows interleave in the same run on the same database, and each gap counts
for the window both of its ends fall in. The benchmark ends when the pruner
has deleted every old run (or after ``--max-seconds``).

    .venv/bin/python bench/bench_prune.py                      # SQLite, 1,000,000 rows
    .venv/bin/python bench/bench_prune.py --runs 20000         # quicker
    .venv/bin/python bench/bench_prune.py --postgres           # a private durable cluster
    .venv/bin/python bench/bench_prune.py --fixed-pace         # the earlier pace, to compare
    .venv/bin/python bench/bench_prune.py --database-url postgresql://...
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from workloads import pct

import stepstone as ss

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DAY = 86400.0
STEPS = 900  # steps per measuring run (under the per-run step limit)
QUIET, PRUNING = "quiet", "pruning"
_SPANS = (("queued", "queued"), ("step", "s0"), ("step", "s1"), ("step", "s2"))


# -- the old rows -------------------------------------------------------------------------------
def build(url: str, runs: int) -> int:
    """Old ended runs written straight to the database; returns the rows written."""
    ss.App("bench", database_url=url).store.close()  # migrated
    with _raw(url) as (conn, mark):
        at = time.time() - 60 * DAY
        for start in range(0, runs, 10_000):
            for sql, rows in _chunk(range(start, min(runs, start + 10_000)), at):
                conn.cursor().executemany(sql.replace("?", mark), rows)
            conn.commit()
        tables = ("runs", "steps", "spans", "run_events", "events")
        return sum(_count(conn, t) for t in tables)


@contextlib.contextmanager
def _raw(url: str) -> Iterator[tuple[Any, str]]:
    if url.startswith("sqlite"):
        conn: Any = sqlite3.connect(url.split("///", 1)[1].split("?")[0])
        yield conn, "?"
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    else:
        import psycopg

        conn = psycopg.connect(url)
        yield conn, "%s"
        conn.execute("SELECT setval(pg_get_serial_sequence('events', 'seq'), (SELECT MAX(seq) FROM events))")
        conn.commit()
        conn.autocommit = True
        conn.execute("VACUUM ANALYZE")
    conn.close()


def _count(conn: Any, table: str) -> int:
    cur = conn.cursor()
    cur.execute(f"SELECT COUNT(*) FROM {table}")
    return int(cur.fetchone()[0])


def _chunk(ids: range, at: float) -> list[tuple[str, Sequence[tuple[Any, ...]]]]:
    out = '{"ok": true, "n": 1}'
    return [
        (
            "INSERT INTO events (seq, id, name, data, ts, received_at) VALUES (?, ?, 'old', '{}', 0, ?)",
            [(i + 1, f"e{i}", at) for i in ids],
        ),
        (
            "INSERT INTO runs (id, function_id, status, event_ids, created_at, started_at, ended_at, output)"
            " VALUES (?, 'old', 'completed', '[]', ?, ?, ?, '1')",
            [(f"r{i:08d}", at, at, at + 1) for i in ids],
        ),
        (
            "INSERT INTO run_events (run_id, position, event_seq) VALUES (?, 0, ?)",
            [(f"r{i:08d}", i + 1) for i in ids],
        ),
        (
            "INSERT INTO steps (run_id, step_id, position, kind, status, attempts, output, started_at, ended_at)"
            " VALUES (?, ?, ?, 'run', 'completed', 1, ?, ?, ?)",
            [(f"r{i:08d}", f"s{p}", p, out, at, at) for i in ids for p in range(3)],
        ),
        (
            "INSERT INTO spans (run_id, kind, name, started_at, ended_at, status) VALUES (?, ?, ?, ?, ?, 'ok')",
            [(f"r{i:08d}", kind, name, at, at) for i in ids for kind, name in _SPANS],
        ),
    ]


# -- the pruner process -----------------------------------------------------------------------
def pruner(url: str, fixed: bool) -> None:
    """``stepstone prune --older-than 30d``'s loop, paused between batches while
    the parent says so: stdin ``pause``/``go``; stdout ``paused`` or, at the
    end, ``done``, each with the rows deleted so far by table as JSON."""
    from stepstone.scheduler.retention import Pace, pace_for, prune_plan, run_plan
    from stepstone.store.viewrows import Pruned

    going = threading.Event()

    def listen() -> None:
        for line in sys.stdin:
            if line.strip() == "go":
                going.set()
            else:
                going.clear()

    threading.Thread(target=listen, daemon=True).start()

    so_far = Pruned()

    def between(pruned: Pruned) -> None:
        nonlocal so_far
        so_far += pruned
        if not going.is_set():
            print("paused " + json.dumps(dict(so_far.counts)), flush=True)
            going.wait()

    app = ss.App("bench-pruner", database_url=url, retention=None)
    print("ready", flush=True)
    going.wait()
    pace = (
        Pace(budget=float("inf"), duty=1.0) if fixed else pace_for(app.store.dialect)
    )  # fixed: 100 ms rests
    total = run_plan(prune_plan(30 * DAY, app.clock.now(), pace), app.store.transact_sync, between, pace)
    print("done " + json.dumps(dict(total.counts)), flush=True)
    app.close()


# -- the measuring worker, the windows --------------------------------------------------------
class Windows:
    """Which window (quiet or pruning) each moment fell in."""

    def __init__(self) -> None:
        self.spans: list[tuple[float, float, str]] = []
        self.current: tuple[float, str] | None = None

    def begin(self, kind: str) -> None:
        self.end()
        self.current = (time.perf_counter(), kind)

    def end(self) -> None:
        if self.current is not None:
            self.spans.append((self.current[0], time.perf_counter(), self.current[1]))
            self.current = None

    def kind_of(self, a: float, b: float) -> str | None:
        for start, stop, kind in self.spans:
            if start <= a and b <= stop:
                return kind
        return None

    def seconds(self, kind: str) -> float:
        return sum(stop - start for start, stop, k in self.spans if k == kind)


async def measure(
    url: str, args: argparse.Namespace
) -> tuple[dict[str, list[float]], Windows, dict[str, int]]:
    app = ss.App("bench", database_url=url, retention=None)
    stamps: list[float | None] = []

    async def trivial() -> int:
        stamps.append(time.perf_counter())
        return 1

    @app.function(id="many", trigger=ss.on_event("many"))
    async def many(ctx: ss.Context) -> int:
        for _ in range(STEPS):
            await ctx.step.run("s", trivial)
        return STEPS

    await app.start_async(concurrency=1)
    stop = asyncio.Event()

    async def keep_busy() -> None:
        while not stop.is_set():
            [eid] = await app.send_async(ss.Event("many"))
            [run] = await app.runs.list_async(event_id=eid)
            assert (await app.runs.wait_async(run.id, timeout="600s")).status == "completed"
            stamps.append(None)  # no gap across runs

    busy = asyncio.create_task(keep_busy())
    windows = Windows()
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "--pruner",
        url,
        *(["--fixed-pace"] if args.fixed_pace else []),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert child.stdin is not None and child.stdout is not None
    assert (await child.stdout.readline()).strip() == b"ready"
    await asyncio.sleep(args.window)  # warm-up: caches, first runs; not measured
    stamps.clear()
    done = False
    pruned: dict[str, int] = {}
    started = time.perf_counter()
    for kind in itertools.cycle((QUIET, PRUNING)):
        if done or time.perf_counter() - started > args.max_seconds:
            break
        windows.begin(kind)
        if kind == QUIET:
            await asyncio.sleep(args.window)
            continue
        child.stdin.write(b"go\n")
        await child.stdin.drain()
        done, pruned = await _until_paused_or_done(child.stdout, child.stdin, args.window)
    windows.end()
    stop.set()
    await busy
    if not done:  # stopped early: the pruner is paused between batches
        child.kill()
    await child.wait()
    await app.stop_async()
    app.close()
    gaps: dict[str, list[float]] = {QUIET: [], PRUNING: []}
    for a, b in itertools.pairwise(stamps):
        within = None if a is None or b is None else windows.kind_of(a, b)
        if within is not None and a is not None and b is not None:
            gaps[within].append(b - a)
    return gaps, windows, pruned


async def _until_paused_or_done(
    out: asyncio.StreamReader, stdin: asyncio.StreamWriter, window: float
) -> tuple[bool, dict[str, int]]:
    """Let the pruner run for ``window`` seconds, then pause it; returns whether
    it finished, and its totals so far."""
    line = asyncio.ensure_future(out.readline())
    finished, _ = await asyncio.wait([line], timeout=window)
    if not finished:
        stdin.write(b"pause\n")
        await stdin.drain()
    word, counts = (await line).decode().strip().split(" ", 1)
    assert word in ("paused", "done"), word
    return word == "done", json.loads(counts)


# -- the report -------------------------------------------------------------------------------
def report(rows: int, gaps: dict[str, list[float]], windows: Windows, pruned: dict[str, int]) -> None:
    deleted = sum(pruned.values())
    busy_s = windows.seconds(PRUNING)
    print(
        f"pruned {deleted:,} of {rows:,} rows ({pruned.get('runs', 0):,} runs) in {busy_s:.1f} s of pruning "
        f"windows ({deleted / busy_s if busy_s else 0:,.0f} rows/s); quiet windows {windows.seconds(QUIET):.1f} s"
    )
    for kind in (QUIET, PRUNING):
        g = gaps[kind]
        print(
            f"{kind:8} steps={len(g):7,}  p50={pct(g, 0.5) * 1e3:7.3f} ms  p99={pct(g, 0.99) * 1e3:7.3f} ms  "
            f"p99.9={pct(g, 0.999) * 1e3:7.3f} ms  max={max(g) * 1e3:7.1f} ms"
        )
    for q in (0.5, 0.99):
        print(f"p{q * 100:g} ratio (pruning / quiet): {pct(gaps[PRUNING], q) / pct(gaps[QUIET], q):.2f}x")
    print("(target: p99 ratio <= 2x)")


@contextlib.contextmanager
def database(args: argparse.Namespace) -> Iterator[str]:
    if args.database_url:
        yield args.database_url
        return
    if args.postgres:
        from tests.pgcluster import PgCluster

        cluster = PgCluster.start_new(settings={})  # PostgreSQL's durable defaults
        try:
            yield cluster.create_database("bench_prune")
        finally:
            cluster.stop()
        return
    with tempfile.TemporaryDirectory(prefix="stepstone-prune-") as folder:
        yield f"sqlite:///{os.path.join(folder, 'prune.db')}"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=100_000, help="old runs (10 rows each)")
    parser.add_argument("--window", type=float, default=3.0, help="seconds per quiet or pruning window")
    parser.add_argument("--max-seconds", type=float, default=3600.0, help="stop measuring after this")
    parser.add_argument("--postgres", action="store_true", help="a private PostgreSQL cluster")
    parser.add_argument("--database-url", default=None, help="an existing (empty) database")
    parser.add_argument(
        "--fixed-pace", action="store_true", help="the earlier pace: full batches, 100 ms rests (to compare)"
    )
    parser.add_argument("--pruner", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.pruner:
        pruner(args.pruner, args.fixed_pace)
        return
    with database(args) as url:
        t = time.perf_counter()
        rows = build(url, args.runs)
        print(
            f"built {args.runs:,} old runs = {rows:,} rows in {time.perf_counter() - t:.1f} s ({url.split(':')[0]})"
        )
        print(
            "pace: " + ("fixed (100 runs, 100 ms rests)" if args.fixed_pace else "pace_for(store) (adaptive)")
        )
        gaps, windows, pruned = asyncio.run(measure(url, args))
        report(rows, gaps, windows, pruned)


if __name__ == "__main__":
    main()
