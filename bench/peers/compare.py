"""Stepstone beside DBOS Transact, the same workloads in the same run (issue 18).

    bash bench/peers/setup.sh                          # once: DBOS in bench/peers/.venv
    .venv/bin/python bench/peers/compare.py            # SQLite, then a private PostgreSQL
    .venv/bin/python bench/peers/compare.py --store sqlite --runs 200 --queued 2000

Two workloads, each on a fresh database per engine and part:

- **latency**: one three-step run at a time (trivial steps), from the call that
  starts it to the caller holding it completed: Stepstone ``send`` then
  ``runs.wait`` with an in-process worker; DBOS ``start_workflow`` then
  ``get_result`` (its most direct path: the workflow runs in the caller's
  process without a queue). Rounds alternate between the engines so both see
  the same host load; p50 and p90 over every round. Each round also times
  the floor (``bench/floor.py``: the run's four commits, one small row each,
  with no engine around them), so the table shows what each engine spends
  over what the disk and the server cost, and what a fifth of DBOS's p50
  leaves an engine.
- **queued**: N three-step runs queued first, then drained by one worker
  process (``stepstone worker --concurrency 10``; a DBOS process listening on
  its queue), timed from the first run's start to the last run's end with the
  database's own timestamps, so process start-up is not counted.

Same durability on both sides: SQLite in WAL mode with ``synchronous=FULL``
(Stepstone's default; DBOS's connections are switched to it by
``dbos_workload.py``), PostgreSQL with the server's durable defaults
(``fsync=on``, ``synchronous_commit=on``) in a private cluster
(``tests/pgcluster.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg

HERE = Path(__file__).resolve().parent
BENCH = HERE.parent
ROOT = BENCH.parent
sys.path[:0] = [str(ROOT), str(BENCH)]

from floor import floor_latencies  # noqa: E402
from workloads import pct, three_step_latencies  # noqa: E402

import stepstone as ss  # noqa: E402

PEER_PYTHON = HERE / ".venv" / "bin" / "python"
STEPSTONE = str(Path(sys.executable).parent / "stepstone")

Databases = Callable[[str], str]


@contextlib.contextmanager
def sqlite_databases() -> Iterator[Databases]:
    with tempfile.TemporaryDirectory(prefix="peers-") as folder:
        yield lambda name: f"sqlite:///{folder}/{name}.db"


@contextlib.contextmanager
def postgres_databases() -> Iterator[Databases]:
    from tests.pgcluster import PgCluster

    cluster = PgCluster.start_new(settings={})  # PostgreSQL's durable defaults
    try:
        yield cluster.create_database
    finally:
        cluster.stop()


def peer(mode: str, url: str, *options: str) -> dict[str, Any]:
    """One run of ``dbos_workload.py`` in the peers' virtualenv; its JSON result."""
    result = subprocess.run(
        [str(PEER_PYTHON), str(HERE / "dbos_workload.py"), mode, url, *options],
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=HERE,
    )
    if result.returncode != 0:
        raise RuntimeError(f"dbos_workload.py {mode} failed:\n{result.stderr[-3000:]}")
    decoded: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return decoded


def latencies(databases: Databases, runs: int, rounds: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {"stepstone": [], "dbos": [], "floor": []}
    per_round = max(1, runs // rounds)
    for i in range(rounds):
        app = ss.App("peers", database_url=databases(f"latency_stepstone_{i}"))
        samples["stepstone"] += asyncio.run(three_step_latencies(app, per_round))
        result = peer("latency", databases(f"latency_dbos_{i}"), "--runs", str(per_round))
        samples["dbos"] += result["latencies"]
        samples["floor"] += floor_latencies(databases(f"latency_floor_{i}"), per_round)
    return samples


def stepstone_queued(url: str, runs: int, concurrency: int) -> float:
    """Seconds from the first run's start to the last run's end, one worker process."""
    sender = ss.App("sender", database_url=url)
    sender.function(id="three", trigger=ss.on_event("three"))(lambda ctx: None)  # the trigger only
    for start in range(0, runs, 500):
        sender.send([ss.Event("three") for _ in range(min(500, runs - start))])
    sender.close()
    code = str(Path(ss.__file__).resolve().parent.parent)  # PYTHONPATH=<a tree> measures that tree
    env = {**os.environ, "STEPSTONE_DATABASE_URL": url, "PYTHONPATH": f"{BENCH}{os.pathsep}{code}"}
    command = [STEPSTONE, "--log-level", "WARNING", "worker", "pg_bench_app:app"]
    worker = subprocess.Popen(
        [*command, "--concurrency", str(concurrency)], env=env, stdout=subprocess.DEVNULL
    )
    try:
        return _drained(url, runs, worker)
    finally:
        worker.terminate()
        worker.wait(60)


def _drained(url: str, runs: int, worker: subprocess.Popen[bytes]) -> float:
    ended = "SELECT COUNT(*) FROM runs WHERE status = 'completed'"
    span = "SELECT MIN(started_at), MAX(ended_at) FROM runs"
    deadline = time.monotonic() + 900
    with _connect(url) as conn:
        while conn.execute(ended).fetchone()[0] < runs:
            if time.monotonic() > deadline or worker.poll() is not None:
                raise RuntimeError("the stepstone worker did not drain the queue")
            time.sleep(0.2)
        first, last = conn.execute(span).fetchone()
    return float(last - first)


@contextlib.contextmanager
def _connect(url: str) -> Iterator[Any]:
    if url.startswith("sqlite"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        try:
            yield conn
        finally:
            conn.close()
    else:
        with psycopg.connect(url, autocommit=True) as pg:
            yield pg


def dbos_queued(url: str, runs: int, options: list[str]) -> float:
    peer("fill", url, "--runs", str(runs))
    return float(peer("drain", url, "--runs", str(runs), *options)["seconds"])


def compare(store: str, databases: Databases, args: argparse.Namespace) -> list[str]:
    lat = latencies(databases, args.runs, args.rounds)
    s50, d50 = statistics.median(lat["stepstone"]), statistics.median(lat["dbos"])
    s90, d90 = pct(lat["stepstone"], 0.9), pct(lat["dbos"], 0.9)
    peer_options = ["--polling", str(args.dbos_polling)]
    if args.dbos_concurrency:
        peer_options += ["--concurrency", str(args.dbos_concurrency)]
    rows = [
        f"| {store} | three-step run p50 | {s50 * 1e3:.2f} ms | {d50 * 1e3:.2f} ms | {s50 / d50:.2f} (DBOS/Stepstone {d50 / s50:.1f}x) |",
        f"| {store} | three-step run p90 | {s90 * 1e3:.2f} ms | {d90 * 1e3:.2f} ms | {s90 / d90:.2f} (DBOS/Stepstone {d90 / s90:.1f}x) |",
        _floor_row(store, statistics.median(lat["floor"]), s50, d50),
    ]
    if args.queued <= 0:
        return rows
    s_sec = stepstone_queued(databases("queued_stepstone"), args.queued, args.concurrency)
    d_sec = dbos_queued(databases("queued_dbos"), args.queued, peer_options)
    s_rate, d_rate = 3 * args.queued / s_sec, 3 * args.queued / d_sec
    return [
        *rows,
        f"| {store} | {args.queued:,} queued runs, one process | {s_rate:,.0f} steps/s | {d_rate:,.0f} steps/s | {s_rate / d_rate:.1f}x |",
    ]


def _floor_row(store: str, floor: float, s50: float, d50: float) -> str:
    """The floor (``floor.py``: the run's four commits and nothing else) beside
    both p50s: what the engines spend over it, and what a fifth of DBOS's
    p50 (target 4) leaves an engine."""
    return (
        f"| {store} | floor p50: the four commits alone, no engine (floor.py) | {floor * 1e3:.2f} ms"
        f" (+{(s50 - floor) * 1e3:.2f} engine) | {floor * 1e3:.2f} ms (+{(d50 - floor) * 1e3:.2f} engine)"
        f" | DBOS/5 = {d50 / 5 * 1e3:.2f} ms leaves an engine +{(d50 / 5 - floor) * 1e3:.2f} ms |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--store", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--runs", type=int, default=300, help="sequential three-step runs per engine")
    parser.add_argument("--rounds", type=int, default=3, help="alternations of the latency workload")
    parser.add_argument("--queued", type=int, default=5000, help="queued runs (0: latency only)")
    parser.add_argument("--concurrency", type=int, default=10, help="Stepstone worker concurrency")
    parser.add_argument("--dbos-polling", type=float, default=0.05, help="DBOS queue polling interval (s)")
    parser.add_argument(
        "--dbos-concurrency", type=int, default=0, help="DBOS worker_concurrency (0: unlimited)"
    )
    args = parser.parse_args()
    if not PEER_PYTHON.exists():
        print(f"{PEER_PYTHON} is missing: run bash bench/peers/setup.sh first", file=sys.stderr)
        return 2
    version = subprocess.run(
        [str(PEER_PYTHON), "-c", "import importlib.metadata as m; print(m.version('dbos'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    print(
        f"Stepstone (this tree) vs DBOS Transact {version}; python {sys.version.split()[0]}, cpus {os.cpu_count()}"
    )
    print("| store | workload | Stepstone | DBOS | ratio Stepstone/DBOS |\n|---|---|---|---|---|", flush=True)
    stores = ["sqlite", "postgres"] if args.store == "both" else [args.store]
    for store in stores:
        with sqlite_databases() if store == "sqlite" else postgres_databases() as databases:
            print("\n".join(compare(store, databases, args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
