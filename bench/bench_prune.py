"""Retention benchmark (issue 17): checkpoint latency while old rows are pruned.

A SQLite database is filled with ``--runs`` old ended runs (each: a run, three
steps, four spans, an event link and an event: 10 rows, so 100,000 runs are
1,000,000 rows), then copied twice. On one copy runs of trivial steps
measure the gaps between steps (interpreter + fenced checkpoint) with nothing
else going on: the baseline. On the other the same runs execute while
``stepstone prune --older-than 30d`` deletes every old run in another process,
in its batches; only the gaps measured while the prune was running count.

    .venv/bin/python bench/bench_prune.py               # 100,000 runs: 1M rows
    .venv/bin/python bench/bench_prune.py --runs 20000  # quicker
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from workloads import pct

import stepstone as ss

DAY = 86400.0
STEPS = 900  # steps per measuring run (under the per-run step limit)
WARM_UP = 2  # runs before measuring
STEPSTONE = str(Path(sys.executable).parent / "stepstone")


def build(path: str, runs: int) -> int:
    """Old ended runs written straight to SQLite; returns the rows written."""
    ss.App("bench", database_url=f"sqlite:///{path}").store.close()
    old = time.time() - 60 * DAY
    conn = sqlite3.connect(path)
    with conn:
        for start in range(0, runs, 10_000):
            _chunk(conn, range(start, min(runs, start + 10_000)), old)
    [(rows,)] = conn.execute(
        "SELECT (SELECT COUNT(*) FROM runs) + (SELECT COUNT(*) FROM steps) + (SELECT COUNT(*) FROM spans)"
        " + (SELECT COUNT(*) FROM run_events) + (SELECT COUNT(*) FROM events)"
    ).fetchall()
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return int(rows)


def _chunk(conn: sqlite3.Connection, ids: range, at: float) -> None:
    out = '{"ok": true, "n": 1}'
    conn.executemany(
        "INSERT INTO events (seq, id, name, data, ts, received_at) VALUES (?, ?, 'old', '{}', 0, ?)",
        [(i + 1, f"e{i}", at) for i in ids],
    )
    conn.executemany(
        "INSERT INTO runs (id, function_id, status, event_ids, created_at, started_at, ended_at, output)"
        " VALUES (?, 'old', 'completed', '[]', ?, ?, ?, '1')",
        [(f"r{i:08d}", at, at, at + 1) for i in ids],
    )
    conn.executemany(
        "INSERT INTO run_events (run_id, position, event_seq) VALUES (?, 0, ?)",
        [(f"r{i:08d}", i + 1) for i in ids],
    )
    conn.executemany(
        "INSERT INTO steps (run_id, step_id, position, kind, status, attempts, output, started_at, ended_at)"
        " VALUES (?, ?, ?, 'run', 'completed', 1, ?, ?, ?)",
        [(f"r{i:08d}", f"s{p}", p, out, at, at) for i in ids for p in range(3)],
    )
    conn.executemany(
        "INSERT INTO spans (run_id, kind, name, started_at, ended_at, status) VALUES (?, ?, ?, ?, ?, 'ok')",
        [(f"r{i:08d}", kind, name, at, at) for i in ids for kind, name in _SPANS],
    )


_SPANS = (("queued", "queued"), ("step", "s0"), ("step", "s1"), ("step", "s2"))


async def gaps_while(path: str, runs: int, busy: subprocess.Popen[bytes] | None) -> list[float]:
    """Gaps between trivial steps (retention off: only ``busy`` prunes), in runs
    of ``STEPS`` steps one after the other: ``runs`` of them, or with ``busy``
    as many as it takes, counting only the gaps measured while it runs."""
    app = ss.App("bench", database_url=f"sqlite:///{path}", retention=None)
    stamps: list[tuple[float, bool]] = []

    async def trivial() -> int:
        stamps.append((time.perf_counter(), busy is None or busy.poll() is None))
        return 1

    @app.function(id="many", trigger=ss.on_event("many"))
    async def many(ctx: ss.Context) -> int:
        for _ in range(STEPS):
            await ctx.step.run("s", trivial)
        return STEPS

    await app.start_async(concurrency=1)
    for _ in range(WARM_UP):  # page cache and statement caches warm, not measured
        [eid] = await app.send_async(ss.Event("many"))
        await app.runs.wait_async((await app.runs.list_async(event_id=eid))[0].id, timeout="600s")
    stamps.clear()
    done = 0
    while (busy is None and done < runs) or (busy is not None and busy.poll() is None):
        [eid] = await app.send_async(ss.Event("many"))
        [run] = await app.runs.list_async(event_id=eid)
        assert (await app.runs.wait_async(run.id, timeout="600s")).status == "completed"
        stamps.append((time.perf_counter(), False))  # no gap across runs
        done += 1
    await app.stop_async()
    app.close()
    return [b - a for (a, live_a), (b, live_b) in itertools.pairwise(stamps) if live_a and live_b]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=100_000, help="old runs (10 rows each)")
    parser.add_argument("--baseline-runs", type=int, default=30, help=f"runs of {STEPS} steps, no pruning")
    parser.add_argument("--batch", type=int, default=100, help="runs per prune transaction")
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="stepstone-prune-")
    source = os.path.join(folder, "source.db")
    t = time.perf_counter()
    rows = build(source, args.runs)
    print(f"built {args.runs:,} old runs = {rows:,} rows in {time.perf_counter() - t:.1f} s")
    base, prune = os.path.join(folder, "base.db"), os.path.join(folder, "prune.db")
    shutil.copy(source, base)
    shutil.copy(source, prune)

    baseline = asyncio.run(gaps_while(base, args.baseline_runs, None))
    env = {"PATH": os.environ.get("PATH", ""), "STEPSTONE_DATABASE_URL": f"sqlite:///{prune}"}
    t = time.perf_counter()
    pruner = subprocess.Popen(
        [STEPSTONE, "prune", "--older-than", "30d", "--batch", str(args.batch)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    during = asyncio.run(gaps_while(prune, 0, pruner))
    out, _err = pruner.communicate(timeout=3600)
    prune_s = time.perf_counter() - t
    print(f"prune: {out.decode().strip()} in {prune_s:.1f} s ({rows / prune_s:,.0f} rows/s)")
    for name, gaps in (("without pruning", baseline), ("while pruning", during)):
        print(
            f"{name:16} steps={len(gaps):6,}  p50={pct(gaps, 0.5) * 1e3:7.3f} ms  "
            f"p99={pct(gaps, 0.99) * 1e3:7.3f} ms  max={max(gaps) * 1e3:7.1f} ms"
        )
    print(f"p99 ratio (while / without): {pct(during, 0.99) / pct(baseline, 0.99):.2f}x (target <= 2x)")
    print(f"p50 ratio (while / without): {pct(during, 0.5) / pct(baseline, 0.5):.2f}x")
    shutil.rmtree(folder)


if __name__ == "__main__":
    main()
