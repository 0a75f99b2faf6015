"""A send's write transaction on PostgreSQL, timed beside the whole run (issue 18,
target 4, session 9): the wall time of ``App.send``'s store operation (its
round trips and its ``COMMIT``) in sequential three-step runs with an
in-process worker (the send starts its run directly), this tree and another
one (``--baseline``) alternating, each on a fresh database of one durable
private cluster (PostgreSQL's defaults: ``fsync`` and ``synchronous_commit``
on).

    .venv/bin/python bench/bench_send.py --baseline /tmp/main-src [--rounds 4 --runs 300]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def measure(url: str, runs: int, warm_up: int = 10) -> str:
    """One process's figures (the tree on ``sys.path``)."""
    from workloads import three_step_latencies

    import stepstone as ss
    from stepstone.store.postgres import PostgresStore

    sends: list[float] = []
    write = PostgresStore._write

    def timed(store: PostgresStore, conn: Any, ops: list[Any]) -> Any:
        started = time.perf_counter()
        try:
            return write(store, conn, ops)
        finally:
            if len(ops) == 1 and "._send." in getattr(ops[0], "__qualname__", ""):
                sends.append(time.perf_counter() - started)

    PostgresStore._write = timed  # type: ignore[method-assign,assignment]
    latencies = asyncio.run(three_step_latencies(ss.App("send", database_url=url), runs, warm_up))
    send = statistics.median(sends[warm_up:]) * 1e3
    return f"send's write p50 {send:.3f} ms  run p50 {statistics.median(latencies) * 1e3:.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--baseline", help="another tree's root (its package and bench/)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--measure", nargs=2, metavar=("URL", "RUNS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(measure(args.measure[0], int(args.measure[1])), flush=True)
        return
    sys.path.insert(0, str(HERE.parent))
    from tests.pgcluster import PgCluster

    trees = {"this tree": HERE.parent} | ({"baseline": Path(args.baseline)} if args.baseline else {})
    cluster = PgCluster.start_new()  # durable defaults
    try:
        for number in range(args.rounds):
            for name in list(trees) if number % 2 == 0 else list(reversed(trees)):
                tree = trees[name]
                env = dict(os.environ, PYTHONPATH=os.pathsep.join((str(tree), str(tree / "bench"))))
                url = cluster.create_database(f"r{number}_{name.replace(' ', '_')}")
                command = [sys.executable, str(HERE / "bench_send.py"), "--measure", url, str(args.runs)]
                out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
                print(f"round {number + 1} {name:9} {out.strip()}", flush=True)
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
