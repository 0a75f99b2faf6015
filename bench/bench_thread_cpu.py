"""Where a sequential three-step run's client CPU goes, thread by thread
(issue 18, target 4): the ``workloads`` latency loop (send, ``runs.list``,
``runs.wait``; an in-process worker), with each thread's CPU time read from
``/proc/self/task`` before and after.

    .venv/bin/python bench/bench_thread_cpu.py [--store postgres|sqlite] [--runs 300]
    PYTHONPATH=<tree>:<tree>/bench .venv/bin/python bench/bench_thread_cpu.py   # another tree

CPU per run of the event loop, the PostgreSQL writer and reader threads and
the listener, beside the wall time per run: on two cores a run whose threads
burn as much CPU as it takes wall time is CPU-bound, not waiting on the server.
With ``--store postgres`` it also prints the CPU for one query
(``SELECT pg_sleep(0.01)``) through psycopg inside a pipeline and outside one
(the price of psycopg's pipeline mode), and through the store's own statement
path (``store/pgwire.py``), which every transaction of the store now takes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from workloads import add_three_steps

import stepstone as ss

TICK = os.sysconf("SC_CLK_TCK")


def cpu_by_thread() -> dict[str, float]:
    """Each live thread's user + system CPU seconds, by thread name."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    seconds: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(FileNotFoundError):
            fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
            name = names.get(int(tid), f"thread-{tid}")
            seconds[name] = seconds.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / TICK
    return seconds


async def one_run(app: ss.App) -> None:
    [event_id] = await app.send_async(ss.Event("three"))
    [run] = await app.runs.list_async(event_id=event_id)
    await app.runs.wait_async(run.id, timeout="30s")


async def measure(url: str, runs: int, warm_up: int = 20) -> None:
    app = ss.App("thread-cpu", database_url=url)
    add_three_steps(app)
    await app.start_async(concurrency=10)
    for _ in range(warm_up):
        await one_run(app)
    before, started = cpu_by_thread(), time.perf_counter()
    for _ in range(runs):
        await one_run(app)
    wall, after = time.perf_counter() - started, cpu_by_thread()
    await app.stop_async()
    app.close()
    print(f"wall per run {wall / runs * 1000:.2f} ms; client CPU per run by thread:")
    total = 0.0
    for name, seconds in sorted(after.items()):
        spent = (seconds - before.get(name, 0.0)) / runs * 1000
        total += spent
        if spent > 0:
            print(f"  {name:32s} {spent:6.2f} ms")
    print(f"  {'all threads':32s} {total:6.2f} ms")


def pipeline_price(url: str, queries: int = 50) -> None:
    """CPU per query: psycopg plain, psycopg with each in its own pipeline,
    then the store's statement path (``pgwire``: its own pipeline, a prepared
    statement), as every transaction of the store now sends it."""
    import psycopg

    from stepstone.store.pgwire import Wire

    with psycopg.connect(url, autocommit=True) as conn:
        for mode in ("plain", "pipeline", "pgwire"):
            cpu = time.thread_time()
            for _ in range(queries):
                if mode == "plain":
                    conn.execute("SELECT pg_sleep(0.01)").fetchone()
                elif mode == "pipeline":
                    with conn.pipeline() as pipeline:
                        cursor = conn.execute("SELECT pg_sleep(0.01)")
                        pipeline.sync()
                        cursor.fetchone()
                else:
                    wire = Wire.of(conn)
                    wire.begin()
                    wire.execute("SELECT pg_sleep(0.01)", {}).fetchone()
                    wire.end()
            label = {"plain": "psycopg plain", "pipeline": "psycopg pipeline", "pgwire": "pgwire"}[mode]
            print(f"one query, {label:16s}: {(time.thread_time() - cpu) / queries * 1000:.2f} ms CPU")


@contextlib.contextmanager
def database(store: str) -> Iterator[str]:
    if store == "sqlite":
        with tempfile.TemporaryDirectory(prefix="thread-cpu-") as folder:
            yield f"sqlite:///{folder}/bench.db"
        return
    from tests.pgcluster import PgCluster

    cluster = PgCluster.start_new(settings={})  # PostgreSQL's durable defaults
    try:
        yield cluster.create_database("thread_cpu")
    finally:
        cluster.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", choices=("postgres", "sqlite"), default="postgres")
    parser.add_argument("--runs", type=int, default=300)
    args = parser.parse_args()
    with database(args.store) as url:
        asyncio.run(measure(url, args.runs))
        if args.store == "postgres":
            pipeline_price(url)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
