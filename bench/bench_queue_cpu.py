"""Queued throughput on SQLite with the CPU it costs (issue 18, throughput).

``bench_core.py``'s queued workload (2,000 three-step runs drained by one
in-process worker, concurrency 10), repeated, reporting beside steps/s the
process's CPU time per run: on a shared machine wall-clock throughput swings
with other jobs' load, CPU per run much less, so two trees measured minutes
apart compare better on it.

    PYTHONPATH=<tree>:<tree>/bench .venv/bin/python bench/bench_queue_cpu.py --sync normal --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time

from bench_core import throughput


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sync", choices=["full", "normal"], default="full")
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rates, cpus = [], []
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            cpu = time.process_time()
            result = asyncio.run(throughput(tmp, args.sync, runs=args.runs))
            cpu = time.process_time() - cpu  # sending included: the same work in every tree
        rates.append(result["steps_per_s"])
        cpus.append(cpu * 1e3 / args.runs)
        print(f"  {result['steps_per_s']:8,.0f} steps/s   CPU {cpus[-1]:.3f} ms/run (send + drain)")
    print(
        f"synchronous={args.sync}: median {statistics.median(rates):,.0f} steps/s, "
        f"CPU {statistics.median(cpus):.3f} ms/run"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
