"""PostgreSQL benchmark (issue 5): commit floor, per-step overhead, three-step
latency, and throughput of queued three-step runs with one and two worker
processes. Every figure is measured in one run against one server.

    .venv/bin/python bench/bench_postgres.py                 # private durable cluster
    .venv/bin/python bench/bench_postgres.py --profile       # plus where the time goes
    .venv/bin/python bench/bench_postgres.py --database-url postgresql://...  # an existing server

Without ``--database-url`` it starts a private cluster (``tests/pgcluster.py``)
with PostgreSQL's default, durable settings (``fsync=on``,
``synchronous_commit=on``): a committed step survives a power loss.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import io
import itertools
import os
import pstats
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import psycopg.rows
from workloads import pct, step_gaps, three_step_latencies

import stepstone as ss

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
STEPSTONE = str(Path(sys.executable).parent / "stepstone")


@contextlib.contextmanager
def server(url: str | None, statements: bool = False) -> Iterator[Any]:
    """Yields a function that creates a fresh database and returns its URL."""
    if url is not None:
        names = itertools.count()
        base = url.rsplit("/", 1)[0]
        created: list[str] = []

        def create(name: str) -> str:
            db = f"bench_{os.getpid()}_{name}_{next(names)}"
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(f"CREATE DATABASE {db}".encode())
            created.append(db)
            return f"{base}/{db}"

        try:
            yield create
        finally:
            with psycopg.connect(url, autocommit=True) as conn:
                for db in created:
                    conn.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)".encode())
        return
    from tests.pgcluster import PgCluster

    settings = (
        {"shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.track_planning": "on"}
        if statements
        else {}
    )
    cluster = PgCluster.start_new(settings=settings)  # PostgreSQL's durable defaults
    try:
        yield lambda name: cluster.create_database(name)
    finally:
        cluster.stop()


def raw_commit(url: str, n: int = 3000) -> list[float]:
    """The floor: one single-row INSERT committed on its own (autocommit)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id BIGSERIAL PRIMARY KEY, v TEXT)")
        times = []
        for _ in range(n):
            t = time.perf_counter()
            conn.execute("INSERT INTO t (v) VALUES (%s)", ("x" * 64,))
            times.append(time.perf_counter() - t)
    return times


def checkpoint_breakdown(url: str, n: int = 2000) -> dict[str, list[float]]:
    """Where a step's commit goes: the checkpoint transaction's four statements
    on one connection, plain then pipelined as the store sends a lone operation,
    then the same operation through the store's writer thread."""
    from stepstone.store.pgerrors import translate
    from stepstone.store.pgpipeline import run_alone
    from stepstone.store.postgres import DIALECT, PgTx, PostgresStore, _notify_if_woken
    from stepstone.store.rows import Fence, NewRun, StepKind, StepRow, StepStatus

    store = PostgresStore.from_url(url)
    store.migrate()

    def setup(tx: Any) -> Any:
        seq = tx.insert_event("e", "go", "{}", 0, 1.0)
        tx.create_run(
            NewRun(
                id="r", function_id="f", event_seqs=[seq], event_ids=["e"], available_at=1.0, created_at=1.0
            )
        )
        return tx.take("w", "r", 1.0, 1e12)

    leased = store.transact_sync(setup)
    fence = Fence(run_id="r", owner="w", epoch=leased.epoch)
    counter = itertools.count()

    def memo() -> list[StepRow]:
        return [
            StepRow(
                run_id="r",
                step_id=f"s{next(counter)}",
                position=0,
                kind=StepKind.RUN,
                status=StepStatus.COMPLETED,
                attempts=1,
                output="1",
                error=None,
                wake_at=None,
                started_at=1.0,
                ended_at=1.0,
            )
        ]

    def checkpoint(rows: list[StepRow]) -> Callable[[Any], Any]:
        return lambda tx: tx.checkpoint(fence, rows, [])

    sql_alone, pipelined, through_store = [], [], []
    with psycopg.connect(url, autocommit=True, row_factory=psycopg.rows.dict_row) as conn:
        for _ in range(n):
            t = time.perf_counter()
            conn.execute("BEGIN")
            PgTx(conn, DIALECT).checkpoint(fence, memo(), [])
            conn.execute("COMMIT")
            sql_alone.append(time.perf_counter() - t)
    with psycopg.connect(url, autocommit=True, row_factory=psycopg.rows.dict_row) as conn:
        for _ in range(n):
            rows = memo()
            t = time.perf_counter()
            ok, _ = run_alone(
                conn,
                checkpoint(rows),
                lambda c: PgTx(c, DIALECT),
                _notify_if_woken,
                translate,
            )
            pipelined.append(time.perf_counter() - t)
            assert ok
    for _ in range(n):
        rows = memo()
        t = time.perf_counter()
        store.transact_sync(checkpoint(rows))
        through_store.append(time.perf_counter() - t)
    store.close()
    return {"sql": sql_alone, "pipelined": pipelined, "store": through_store}


async def per_step(url: str, steps: int = 900) -> list[float]:
    """Gaps between consecutive trivial steps of one run: interpreter + checkpoint."""
    return await step_gaps(ss.App("bench", database_url=url), steps)


async def three_step_latency(url: str, runs: int = 300) -> list[float]:
    return await three_step_latencies(ss.App("bench", database_url=url), runs)


def throughput(
    url: str, runs: int, processes: int, concurrency: int, statements: bool = False, waits: bool = False
) -> dict[str, float]:
    """``runs`` queued three-step runs drained by ``processes`` `stepstone worker`
    processes. Timed from the first run's start to the last run's end (database
    timestamps), so process start-up is not counted. With ``statements`` (a
    cluster with pg_stat_statements loaded), prints the statements the workers
    ran per run; with ``waits``, what the server's processes were doing
    (``Waits``)."""
    sender = ss.App("sender", database_url=url)
    sender.function(id="three", trigger=ss.on_event("three"))(lambda ctx: None)  # registers the trigger
    for start in range(0, runs, 500):
        sender.send([ss.Event("three") for _ in range(min(500, runs - start))])
    sender.close()
    with psycopg.connect(url, autocommit=True) as conn:
        # Statistics, as autovacuum gathers them within a minute on a live
        # database: without any, the planner joins events by a full scan.
        conn.execute("ANALYZE")
        if statements:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            conn.execute("SELECT pg_stat_statements_reset()")
        before = _commits(conn)
        code = str(Path(ss.__file__).resolve().parent.parent)  # PYTHONPATH=<a tree> measures that tree
        env = {
            **os.environ,
            "STEPSTONE_DATABASE_URL": url,
            "PYTHONPATH": f"{ROOT / 'bench'}{os.pathsep}{code}",
        }
        workers = [
            subprocess.Popen(
                [
                    STEPSTONE,
                    "--log-level",
                    "WARNING",
                    "worker",
                    "pg_bench_app:app",
                    "--concurrency",
                    str(concurrency),
                ],
                env=env,
                stdout=subprocess.DEVNULL,
            )
            for _ in range(processes)
        ]
        server = _server_pids(conn)
        try:
            deadline = time.monotonic() + 600
            while not _started(conn):  # CPU is counted from the first lease: not start-up
                if time.monotonic() > deadline or any(w.poll() is not None for w in workers):
                    raise RuntimeError("workers did not start")
                time.sleep(0.01)
            cpu = (_cpu([w.pid for w in workers]), _cpu(server()))
            sampler = Waits(url) if waits else None
            while _ended(conn) < runs:
                if time.monotonic() > deadline or any(w.poll() is not None for w in workers):
                    raise RuntimeError("workers did not finish the load")
                time.sleep(0.2)
            cpu = (_cpu([w.pid for w in workers]) - cpu[0], _cpu(server()) - cpu[1])
            if sampler is not None:
                print(sampler.stop(runs))
            transactions = _commits(conn) - before
            first, last, busy = conn.execute(  # type: ignore[misc]
                "SELECT MIN(started_at), MAX(ended_at), SUM(ended_at - started_at) FROM runs"
            ).fetchone()
            if statements:
                print(statement_counts(conn, runs))
        finally:
            for w in workers:
                w.terminate()
            for w in workers:
                w.wait(60)
    elapsed = last - first
    return {
        "seconds": elapsed,
        "steps_per_s": 3 * runs / elapsed,
        "runs_per_s": runs / elapsed,
        "transactions_per_run": transactions / runs,
        "worker_cpu_ms_per_run": cpu[0] * 1e3 / runs,
        "server_cpu_ms_per_run": cpu[1] * 1e3 / runs,
        # Little's law: runs in flight on average (of processes x concurrency
        # slots); the rest of the time a slot waited for a lease pass.
        "in_flight": busy / elapsed,
    }


class Waits:
    """Samples ``pg_stat_activity`` every few milliseconds on its own connection
    while the workers drain the queue (each server process's state and wait
    event: ``Client/ClientRead`` is a backend waiting for its client,
    ``Lock/transactionid`` for another transaction's row, ``LWLock/WALWrite``
    and ``IO/WALSync`` for the WAL flush), and reads ``pg_stat_wal`` before
    and after: WAL writes and syncs per run."""

    QUERY = (
        "SELECT backend_type, state, wait_event_type, wait_event FROM pg_stat_activity"
        " WHERE pid <> pg_backend_pid() AND (datname IS NULL OR datname = current_database())"
    )

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True)
        self.wal = self._wal()
        self.seen: Counter[str] = Counter()
        self.samples = 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _wal(self) -> tuple[int, ...]:
        row = self.conn.execute("SELECT wal_records, wal_write, wal_sync FROM pg_stat_wal").fetchone()
        return tuple(int(v) for v in row) if row else (0, 0, 0)

    def _sample(self) -> None:
        while not self.done.wait(0.003):
            self.samples += 1
            for kind, state, wtype, wevent in self.conn.execute(self.QUERY).fetchall():
                if kind == "client backend" and state == "idle":
                    what = "idle (between transactions)"
                elif wtype is None:
                    what = "on CPU"
                else:
                    what = f"{wtype}/{wevent}"
                self.seen[f"{kind}: {what}"] += 1

    def stop(self, runs: int) -> str:
        self.done.set()
        self.thread.join()
        records, writes, syncs = (b - a for a, b in zip(self.wal, self._wal(), strict=True))
        self.conn.close()
        lines = [
            f"    WAL per run: {records / runs:.1f} records, {writes / runs:.2f} writes, {syncs / runs:.2f} syncs",
            f"    server processes, mean number in each state over {self.samples} samples:",
        ]
        for what, n in self.seen.most_common(14):
            lines.append(f"      {n / max(self.samples, 1):6.2f}  {what}")
        return "\n".join(lines)


def _started(conn: psycopg.Connection[Any]) -> bool:
    return conn.execute("SELECT 1 FROM runs WHERE started_at IS NOT NULL LIMIT 1").fetchone() is not None


def _cpu(pids: list[int]) -> float:
    """User + system CPU seconds of these processes so far (Linux /proc); the
    load of other jobs on the machine does not change it, so it compares
    runs made minutes apart better than wall-clock throughput does."""
    ticks = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def _server_pids(conn: psycopg.Connection[Any]) -> Callable[[], list[int]]:
    """The server's processes now (postmaster and its children), if it runs on
    this machine; none otherwise."""
    row = conn.execute("SHOW data_directory").fetchone()
    try:
        postmaster = int(Path(str(row[0]) if row else "-", "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return lambda: []

    def pids() -> list[int]:
        found = [postmaster]
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, IndexError, ValueError):
                if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == postmaster:
                    found.append(int(stat.parent.name))
        return found

    return pids


def statement_counts(conn: psycopg.Connection[Any], runs: int) -> str:
    """The statements run on this database since the reset, per run, most
    frequent first (round trips: each is one unless pipelined)."""
    rows = conn.execute(
        "SELECT calls, total_exec_time, query FROM pg_stat_statements"
        " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
        " ORDER BY calls DESC"
    ).fetchall()
    total = sum(int(calls) for calls, _, _ in rows)
    lines = [f"    statements per run: {total / runs:.1f}"]
    for calls, ms, query in rows[:30]:
        text = " ".join(str(query).split())[:110]
        lines.append(f"    {calls / runs:6.2f}/run {ms / calls * 1e3:7.1f} us  {text}")
    return "\n".join(lines)


def _ended(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT COUNT(*) FROM runs WHERE status = 'completed'").fetchone()
    return int(row[0]) if row else 0


def _commits(conn: psycopg.Connection[Any]) -> int:
    """Committed transactions of this database so far (every connection's)."""
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
    ).fetchone()
    return int(row[0]) if row else 0


def profile_steps(url: str) -> str:
    profiler = cProfile.Profile()
    profiler.enable()
    asyncio.run(per_step(url, steps=900))
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(14)
    return out.getvalue()


def report_throughput(args: argparse.Namespace, create: Callable[[str], str]) -> None:
    one = throughput(create("one"), args.runs, 1, args.concurrency, args.statements, args.waits)
    two = throughput(create("two"), args.runs, 2, args.concurrency, args.statements, args.waits)
    for label, result in (("1 worker process ", one), ("2 worker processes", two)):
        print(
            f"  {args.runs} runs x 3 steps, {label}: {result['steps_per_s']:8,.0f} steps/s "
            f"({result['runs_per_s']:,.0f} runs/s, {result['transactions_per_run']:.2f} transactions/run; "
            f"CPU per run: workers {result['worker_cpu_ms_per_run']:.2f} ms, "
            f"server {result['server_cpu_ms_per_run']:.2f} ms; "
            f"runs in flight {result['in_flight']:.1f} of {args.concurrency * (2 if two is result else 1)})"
        )
    print(f"  scaling 2 / 1 processes: {two['steps_per_s'] / one['steps_per_s']:.2f}x")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--database-url", default=None, help="an existing server (a database is created per part)"
    )
    parser.add_argument("--runs", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=10, help="per worker process")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument(
        "--throughput-only", action="store_true", help="only the queued throughput (1 and 2 processes)"
    )
    parser.add_argument(
        "--statements",
        action="store_true",
        help="print the statements per run (private cluster with pg_stat_statements)",
    )
    parser.add_argument(
        "--waits", action="store_true", help="sample the server's wait events and WAL syncs during the drain"
    )
    args = parser.parse_args()
    with server(args.database_url, args.statements) as create:
        with psycopg.connect(create("info")) as conn:
            version = conn.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
            settings = {
                name: conn.execute(f"SHOW {name}".encode()).fetchone()[0]  # type: ignore[index]
                for name in ("fsync", "synchronous_commit")
            }
        print(
            f"python {sys.version.split()[0]}, postgresql {version} "
            f"(fsync={settings['fsync']}, synchronous_commit={settings['synchronous_commit']}), "
            f"psycopg {psycopg.__version__}, cpus {os.cpu_count()}"
        )
        if args.throughput_only:
            report_throughput(args, create)
            return 0
        floor = raw_commit(create("floor"))
        parts = checkpoint_breakdown(create("parts"))
        gaps = asyncio.run(per_step(create("steps")))
        latency = asyncio.run(three_step_latency(create("latency")))
        f50, s50 = statistics.median(floor), statistics.median(gaps)
        print(
            f"  raw single-row commit (floor) p50 {f50 * 1e6:8.1f} us   p99 {pct(floor, 0.99) * 1e6:8.1f} us"
        )
        print(
            f"  per-step overhead             p50 {s50 * 1e6:8.1f} us   p99 {pct(gaps, 0.99) * 1e6:8.1f} us"
            f"   = {s50 / f50:.2f}x floor"
        )
        print(
            f"    checkpoint transaction alone (BEGIN, fence, upsert, COMMIT): "
            f"p50 {statistics.median(parts['sql']) * 1e6:.1f} us plain, "
            f"{statistics.median(parts['pipelined']) * 1e6:.1f} us pipelined; "
            f"through the store's writer thread {statistics.median(parts['store']) * 1e6:.1f} us"
        )
        print(
            f"  three-step run send->done     p50 {statistics.median(latency) * 1e3:8.2f} ms  "
            f"p99 {pct(latency, 0.99) * 1e3:8.2f} ms"
        )
        report_throughput(args, create)
        if args.profile:
            print(profile_steps(create("profile")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
