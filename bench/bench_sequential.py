"""Sequential three-step runs beside an in-process worker (issue 18, target 4):
p50 latency, CPU seconds of this process per run, and commits per run, for this
tree and another one (``--baseline``, e.g. ``git archive main``) in alternating
processes, so both see the same host load. CPU and commits are the figures a
loaded host does not move.

    .venv/bin/python bench/bench_sequential.py --baseline /tmp/main-src               # SQLite
    .venv/bin/python bench/bench_sequential.py --baseline /tmp/main-src --store postgres
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import stepstone as ss

HERE = Path(__file__).resolve().parent


async def measure(url: str, runs: int, warm_up: int = 10) -> str:
    """One process's figures for ``runs`` runs after ``warm_up`` (the tree on ``sys.path``)."""
    from workloads import add_three_steps

    app = ss.App("sequential", database_url=url)
    add_three_steps(app)
    await app.start_async(concurrency=10)
    latencies: list[float] = []
    cpu = commits = 0.0
    for i in range(runs + warm_up):
        if i == warm_up:
            cpu, commits = time.process_time(), app.store.commits  # type: ignore[attr-defined]
        started = time.perf_counter()
        [event_id] = await app.send_async(ss.Event("three"))
        [run] = await app.runs.list_async(event_id=event_id)
        done = await app.runs.wait_async(run.id, timeout="30s")
        assert done.status == "completed"
        latencies.append(time.perf_counter() - started)
    cpu, commits = time.process_time() - cpu, app.store.commits - commits  # type: ignore[attr-defined]
    await app.stop_async()
    app.close()
    p50 = statistics.median(latencies[warm_up:]) * 1000
    return f"p50 {p50:.2f} ms  CPU {cpu / runs * 1000:.3f} ms/run  commits {commits / runs:.2f}/run"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--store", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--baseline", help="another tree's root (its package and bench/)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--measure", nargs=2, metavar=("URL", "RUNS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(asyncio.run(measure(args.measure[0], int(args.measure[1]))), flush=True)
        return
    trees = {"this tree": HERE.parent} | ({"baseline": Path(args.baseline)} if args.baseline else {})
    with tempfile.TemporaryDirectory() as tmp:
        if args.store == "sqlite":
            rounds(trees, args, lambda name: f"sqlite:///{tmp}/{name}.db")
            return
        sys.path.insert(0, str(HERE.parent))
        from tests.pgcluster import running_cluster

        with running_cluster() as cluster:
            rounds(trees, args, lambda name: cluster.create_database(name))


def rounds(trees: dict[str, Path], args: argparse.Namespace, url_for: Callable[[str], str]) -> None:
    for number in range(args.rounds):
        order = list(trees) if number % 2 == 0 else list(reversed(trees))
        for name in order:
            tree = trees[name]
            env = dict(os.environ, PYTHONPATH=os.pathsep.join((str(tree), str(tree / "bench"))))
            url = url_for(f"r{number}_{name.replace(' ', '_')}")
            command = [sys.executable, str(HERE / "bench_sequential.py"), "--measure", url, str(args.runs)]
            out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
            print(f"round {number + 1} {name:9} {out.strip()}", flush=True)


if __name__ == "__main__":
    main()
