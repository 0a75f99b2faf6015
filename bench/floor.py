"""The floor under a sequential three-step run (issue 18, target 4): what any
engine that checkpoints each step before the next one starts must wait for,
with no engine around it.

A three-step run needs four durable commits: the run recorded before its
first step starts (the send's), one checkpoint for each of the first two
steps, and the last step's checkpoint with the run's end. The floor makes
exactly those four commits, one small row each (a ``runs`` row, three
``steps`` rows, an UPDATE of the run at the end), from Python with the
store's own driver, at the same durability as ``compare.py`` runs both
engines (SQLite: WAL, ``synchronous=FULL``; PostgreSQL: the server's
``synchronous_commit=on``, each commit one pipelined round trip). No index
but the primary keys, no event, no queue, no lease, no JSON, no event loop.

    .venv/bin/python bench/floor.py [--store sqlite|postgres] [--runs 300]

``compare.py`` measures it in the same rounds as Stepstone and DBOS and prints
it beside them: an engine's p50 can approach the floor but not pass it.
"""

from __future__ import annotations

import argparse
import contextlib
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg

SCHEMA = (
    "CREATE TABLE runs (id TEXT PRIMARY KEY, status TEXT NOT NULL, output TEXT)",
    "CREATE TABLE steps (run_id TEXT NOT NULL, step_id TEXT NOT NULL, output TEXT,"
    " PRIMARY KEY (run_id, step_id))",
)
START = "INSERT INTO runs (id, status) VALUES ({p}, 'running')"
STEP = "INSERT INTO steps (run_id, step_id, output) VALUES ({p}, {p}, '1')"
END = "UPDATE runs SET status = 'completed', output = '3' WHERE id = {p}"


@contextlib.contextmanager
def _sqlite_commits(url: str) -> Iterator[Callable[[list[tuple[str, tuple[Any, ...]]]], None]]:
    conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    for statement in SCHEMA:
        conn.execute(statement)

    def commit(statements: list[tuple[str, tuple[Any, ...]]]) -> None:
        conn.execute("BEGIN IMMEDIATE")
        for text, params in statements:
            conn.execute(text.format(p="?"), params)
        conn.execute("COMMIT")

    try:
        yield commit
    finally:
        conn.close()


@contextlib.contextmanager
def _postgres_commits(url: str) -> Iterator[Callable[[list[tuple[str, tuple[Any, ...]]]], None]]:
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in SCHEMA:
            conn.execute(statement)

        def commit(statements: list[tuple[str, tuple[Any, ...]]]) -> None:
            with conn.pipeline():  # BEGIN, the statements and COMMIT: one round trip
                conn.execute("BEGIN")
                for text, params in statements:
                    conn.execute(text.format(p="%s"), params, prepare=True)
                conn.execute("COMMIT")

        yield commit


def floor_latencies(url: str, runs: int = 300, warm_up: int = 250) -> list[float]:
    """Seconds per three-step run of the floor: four commits, one after another.
    The warm-up writes past SQLite's first WAL checkpoint (~1,000 frames at
    five a run): before it, every commit grows the WAL file, and a commit that
    appends costs more than one that overwrites (what a running engine does,
    and what Stepstone's and DBOS's rounds do after their first runs)."""
    commits = _sqlite_commits if url.startswith("sqlite") else _postgres_commits
    latencies = []
    with commits(url) as commit:
        for _ in range(runs + warm_up):
            run_id = uuid.uuid4().hex
            t = time.perf_counter()
            commit([(START, (run_id,))])
            commit([(STEP, (run_id, "a"))])
            commit([(STEP, (run_id, "b"))])
            commit([(STEP, (run_id, "c")), (END, (run_id,))])
            latencies.append(time.perf_counter() - t)
    return latencies[warm_up:]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--store", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--runs", type=int, default=300)
    args = parser.parse_args()
    if args.store == "sqlite":
        with tempfile.TemporaryDirectory(prefix="floor-") as folder:
            samples = floor_latencies(f"sqlite:///{Path(folder) / 'floor.db'}", args.runs)
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from tests.pgcluster import PgCluster

        cluster = PgCluster.start_new(settings={})  # PostgreSQL's durable defaults
        try:
            samples = floor_latencies(cluster.create_database("floor"), args.runs)
        finally:
            cluster.stop()
    print(
        f"{args.store}: floor of a three-step run (four commits) p50 {statistics.median(samples) * 1e3:.3f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
