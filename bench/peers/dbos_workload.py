"""The peer side of the comparison: the same workloads on DBOS Transact.

Run by ``compare.py`` with the interpreter of ``bench/peers/.venv`` (created by
``setup.sh``), never the project's: DBOS and its dependencies stay out of
Stepstone's virtualenv. Each mode prints one JSON object on its last line.

    latency URL --runs N       one three-step workflow at a time, started and
                               awaited in the process that runs it
    fill URL --runs N          N three-step workflows enqueued (no worker)
    drain URL --runs N         one worker process drains the queue; the figure is
                               first start to last end, from the database's
                               own timestamps (process start-up not counted)

Durability matches Stepstone's defaults: on SQLite every connection is put in
WAL mode with ``synchronous=FULL`` (DBOS alone would use a rollback journal);
on PostgreSQL the server's settings apply (``synchronous_commit=on`` in the
cluster compare.py starts).
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import sys
import time
from typing import Any

import sqlalchemy as sa
from dbos import DBOS, DBOSClient, EnqueueOptions
from sqlalchemy import event

QUEUE = "bench"


@event.listens_for(sa.engine.Engine, "connect")
def _durable_sqlite(dbapi_conn: Any, _record: Any) -> None:
    if isinstance(dbapi_conn, sqlite3.Connection):
        dbapi_conn.execute("PRAGMA journal_mode=WAL")
        dbapi_conn.execute("PRAGMA synchronous=FULL")


@DBOS.step()
def trivial() -> int:
    return 1


@DBOS.workflow()
def three() -> int:
    for _ in range(3):
        trivial()
    return 3


def launch(url: str) -> None:
    DBOS(config={"name": "peers", "system_database_url": url, "log_level": "WARNING"})
    DBOS.launch()


def latency(url: str, runs: int, warm_up: int) -> dict[str, Any]:
    launch(url)
    samples = []
    for _ in range(runs + warm_up):
        t = time.perf_counter()
        assert DBOS.start_workflow(three).get_result() == 3
        samples.append(time.perf_counter() - t)
    DBOS.destroy()
    return {"latencies": samples[warm_up:]}


def fill(url: str, runs: int) -> dict[str, Any]:
    launch(url)  # creates the schema; nothing listens on the queue yet
    DBOS.destroy()
    client = DBOSClient(system_database_url=url)
    options: EnqueueOptions = {"queue_name": QUEUE, "workflow_name": "three"}
    for _ in range(runs):
        client.enqueue(options)
    client.destroy()
    return {"enqueued": runs}


def drain(url: str, runs: int, polling: float, concurrency: int | None) -> dict[str, Any]:
    launch(url)
    DBOS.register_queue(QUEUE, worker_concurrency=concurrency, polling_interval_sec=polling)
    engine = sa.create_engine(url)
    table = "workflow_status" if url.startswith("sqlite") else "dbos.workflow_status"
    queued = f"FROM {table} WHERE queue_name = '{QUEUE}'"
    done = sa.text(f"SELECT COUNT(*) {queued} AND status = 'SUCCESS'")
    deadline = time.monotonic() + 900
    with engine.connect() as conn:
        while conn.execute(done).scalar_one() < runs:
            conn.rollback()
            if time.monotonic() > deadline:
                raise RuntimeError("DBOS did not drain the queue in 15 minutes")
            time.sleep(0.2)
        first, last = conn.execute(
            sa.text(f"SELECT MIN(started_at_epoch_ms), MAX(updated_at) {queued}")
        ).one()
    engine.dispose()
    DBOS.destroy()
    return {"seconds": (last - first) / 1000}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("mode", choices=["latency", "fill", "drain"])
    parser.add_argument("url")
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--warm-up", type=int, default=10)
    parser.add_argument("--polling", type=float, default=0.05, help="queue polling interval (s)")
    parser.add_argument("--concurrency", type=int, default=None, help="worker_concurrency (none: unlimited)")
    args = parser.parse_args()
    if args.mode == "latency":
        result = latency(args.url, args.runs, args.warm_up)
        values = sorted(result["latencies"])
        result.update(n=len(values), p50=statistics.median(values), p90=values[int(0.9 * len(values))])
    elif args.mode == "fill":
        result = fill(args.url, args.runs)
    else:
        result = drain(args.url, args.runs, args.polling, args.concurrency)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
