"""Waiting at scale (issue 3): worker RSS with 0 and 100,000 waiting runs, and
the cost of delivering one event that resolves one wait with 10 waiting runs
versus 100,000, measured in the same run.

    .venv/bin/python bench/bench_waits.py [--runs 100000]
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import stepstone as ss

HERE = Path(__file__).parent
STEPSTONE = str(Path(sys.executable).parent / "stepstone")


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def waiting(db: str) -> int:
    with sqlite3.connect(db, timeout=30) as conn:
        return int(conn.execute("SELECT COUNT(*) FROM runs WHERE status = 'waiting'").fetchone()[0])


def parked(db: str, count: int) -> Callable[[], bool]:
    return lambda: waiting(db) == count


def until(predicate: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.5)


def scenario(folder: str, runs: int, deliveries: int, measure_rss: bool) -> dict[str, float]:
    db = f"{folder}/waits.db"
    url = f"sqlite:///{db}?synchronous=normal"
    env = {**os.environ, "STEPSTONE_DATABASE_URL": url, "PYTHONPATH": str(HERE)}
    client = ss.App("client", database_url=url)
    worker = subprocess.Popen(
        [STEPSTONE, "--log-level", "WARNING", "worker", "waits_app:app", "--concurrency", "50"], env=env
    )
    try:
        until(lambda: bool(client.workers.list()), 60, "worker registration")
        time.sleep(1.0)
        rss0 = rss_kb(worker.pid)
        samples: dict[int, int] = {}
        t = time.perf_counter()
        for mark in sorted({min(runs, m) for m in (runs // 10, runs // 2, runs)}):
            sent = max(samples, default=0)
            for start in range(sent, mark, 1000):
                client.send(
                    [ss.Event("bench.start", {"k": i}) for i in range(start, min(mark, start + 1000))]
                )
            until(parked(db, mark), 3600, "runs to wait")
            samples[mark] = rss_kb(worker.pid)
        park_seconds = time.perf_counter() - t
        rss_full = samples[runs]
        costs = []
        for k in range(0, runs, max(1, runs // deliveries))[:deliveries]:
            t = time.perf_counter()
            client.send(ss.Event("bench.done", {"k": k}))
            costs.append(time.perf_counter() - t)
        until(lambda: waiting(db) == runs - len(costs), 120, "resolved runs to finish")
    finally:
        worker.terminate()
        worker.wait(60)
        client.close()
    out = {"delivery_p50": statistics.median(costs), "park_seconds": park_seconds}
    if measure_rss:
        out.update(rss0=rss0, rss_full=rss_full, **{f"rss_{k}": v for k, v in samples.items()})
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=100_000)
    args = parser.parse_args()
    small = []
    for _ in range(5):
        with tempfile.TemporaryDirectory() as small_dir:
            small.append(scenario(small_dir, 10, 10, False))

    with tempfile.TemporaryDirectory() as big_dir:
        big = scenario(big_dir, args.runs, 200, True)
    small_p50 = statistics.median(s["delivery_p50"] for s in small)
    print(f"worker RSS with 0 waiting runs: {big['rss0'] / 1024:8.1f} MB")
    for key in sorted((k for k in big if k.startswith("rss_") and k != "rss_full"), key=lambda k: int(k[4:])):
        print(
            f"worker RSS with {int(key[4:]):,} waiting runs: {big[key] / 1024:8.1f} MB "
            f"(x{big[key] / big['rss0']:.2f})"
        )
    print(f"{args.runs:,} runs reached their wait in {big['park_seconds']:.1f} s")
    print(
        f"deliver one event resolving one wait: {small_p50 * 1e3:.2f} ms with 10 waiting, "
        f"{big['delivery_p50'] * 1e3:.2f} ms with {args.runs:,} (ratio {big['delivery_p50'] / small_p50:.2f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
