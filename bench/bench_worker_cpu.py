"""A worker process's CPU per queued SQLite run, as compare.py's queued figure
runs it (issue 18, session 8).

N three-step runs are queued first; then a process that only works them
(the app loaded, ``start_async(concurrency=10)``, its heap settled as
``stepstone worker`` settles it, ``cli/worker.py``) drains them. Reported:
steps/s, the process's CPU per run and the garbage collector's share of it
(``gc.callbacks``, thread CPU), from the worker's start to the last run's
end. CPU per run moves much less with the host's load than steps/s does.

    PYTHONPATH=<tree>:<tree>/bench .venv/bin/python bench/bench_worker_cpu.py [--runs 5000] [--sync full]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import stepstone as ss


def _child(url: str, runs: int) -> dict[str, Any]:
    from workloads import add_three_steps

    from stepstone.cli import worker as command  # imported before the clock starts

    app = ss.App("bench", database_url=url)
    add_three_steps(app)
    collector = {"cpu": 0.0, "started": 0.0}

    def timed(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            collector["started"] = time.thread_time()
        else:
            collector["cpu"] += time.thread_time() - collector["started"]

    async def drain() -> tuple[float, float]:
        done, ended = asyncio.Event(), 0

        def on_end(run_id: str, _read: object = None) -> None:
            nonlocal ended
            ended += 1
            if ended == runs:
                done.set()

        app._run_changed = on_end  # type: ignore[method-assign]
        gc.callbacks.append(timed)
        cpu, wall = time.process_time(), time.perf_counter()
        await app.start_async(concurrency=10)
        settle = getattr(command, "_settle_heap", None)  # absent in older trees
        if settle is not None:
            settle()
        await asyncio.wait_for(done.wait(), 900)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        await app.stop_async()
        app.close()
        return cpu, wall

    cpu, wall = asyncio.run(drain())
    return {
        "steps_per_s": 3 * runs / wall,
        "cpu_ms": cpu * 1e3 / runs,
        "gc_us": collector["cpu"] * 1e6 / runs,
    }


def _queued(url: str, runs: int) -> None:
    sender = ss.App("sender", database_url=url)
    sender.function(id="three", trigger=ss.on_event("three"))(lambda ctx: None)  # the trigger only
    for start in range(0, runs, 500):
        sender.send([ss.Event("three") for _ in range(min(500, runs - start))])
    sender.close()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5000)
    parser.add_argument("--sync", choices=["full", "normal"], default="full")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--child", help=argparse.SUPPRESS)  # the worker process: its database URL
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.child, args.runs)))
        return 0
    print(f"stepstone from {Path(ss.__file__).resolve().parent}")
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory() as folder:
            url = f"sqlite:///{folder}/worker.db?synchronous={args.sync}"
            _queued(url, args.runs)
            out = subprocess.run(
                [sys.executable, __file__, "--child", url, "--runs", str(args.runs)],
                capture_output=True,
                text=True,
                check=True,
                env=os.environ.copy(),
            )
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(
            f"  {r['steps_per_s']:8,.0f} steps/s   CPU {r['cpu_ms']:.3f} ms/run "
            f"(garbage collector {r['gc_us']:.1f} µs)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
