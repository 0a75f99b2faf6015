"""Flow control (issue 4): a noisy neighbour against fair scheduling, and the
scheduler's overhead.

    .venv/bin/python bench/bench_flow.py [--noisy 10000] [--quiet 20]

1. Tenant A sends 10,000 runs to a function with
   ``Concurrency(limit=5, key="event.data.tenant")``, then tenant B sends 20.
   Each run is one step of 10 ms simulated I/O. Reported: B's queue delay
   (event sent -> first step starts), p50/p99, next to the same work through a
   plain FIFO function (no key) in the same run.
2. Throughput of 2,000 one-step trivial runs with a concurrency key (20 tenants,
   limit 10 each) versus without.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from typing import Any

from workloads import pct

import stepstone as ss


async def neighbours(folder: str, keyed: bool, noisy: int, quiet: int) -> dict[str, Any]:
    app = ss.App("bench-flow", database_url=f"sqlite:///{folder}/flow.db?synchronous=normal")
    delays: dict[str, list[float]] = {"A": [], "B": []}
    done = asyncio.Event()
    total = noisy + quiet
    finished = 0
    options: dict[str, Any] = {}
    if keyed:
        options["concurrency"] = ss.Concurrency(limit=5, key="event.data.tenant")

    async def work(tenant: str, sent: float) -> None:
        delays[tenant].append(time.time() - sent)
        await asyncio.sleep(0.01)

    @app.function(id="sync", trigger=ss.on_event("sync"), **options)
    async def sync(ctx: ss.Context) -> None:
        nonlocal finished
        await ctx.step.run("work", work, ctx.event.data["tenant"], ctx.event.data["sent"])
        finished += 1
        if finished == total:
            done.set()

    await app.start_async(concurrency=10)
    for start in range(0, noisy, 1000):
        await app.send_async(
            [ss.Event("sync", {"tenant": "A", "sent": time.time()}) for _ in range(min(1000, noisy - start))]
        )
    await app.send_async([ss.Event("sync", {"tenant": "B", "sent": time.time()}) for _ in range(quiet)])
    await asyncio.wait_for(done.wait(), 3600)
    await app.stop_async()
    app.close()
    b = delays["B"]
    return {"p50": statistics.median(b), "p99": pct(b, 0.99), "max": max(b)}


async def throughput(folder: str, keyed: bool, runs: int = 2000) -> float:
    app = ss.App("bench-tput", database_url=f"sqlite:///{folder}/tput.db?synchronous=normal")
    options: dict[str, Any] = {}
    if keyed:
        options["concurrency"] = ss.Concurrency(limit=10, key="event.data.tenant")
    done = asyncio.Event()
    finished = 0

    async def trivial() -> int:
        return 1

    @app.function(id="t", trigger=ss.on_event("t"), **options)
    async def t(ctx: ss.Context) -> None:
        nonlocal finished
        await ctx.step.run("s", trivial)
        finished += 1
        if finished == runs:
            done.set()

    for start in range(0, runs, 500):
        await app.send_async([ss.Event("t", {"tenant": f"t{i % 20}"}) for i in range(start, start + 500)])
    began = time.perf_counter()
    await app.start_async(concurrency=10)
    await asyncio.wait_for(done.wait(), 600)
    elapsed = time.perf_counter() - began
    await app.stop_async()
    app.close()
    return runs / elapsed


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--noisy", type=int, default=10_000)
    parser.add_argument("--quiet", type=int, default=20)
    args = parser.parse_args()
    results = {}
    for keyed in (True, False):
        with tempfile.TemporaryDirectory() as folder:
            results[keyed] = asyncio.run(neighbours(folder, keyed, args.noisy, args.quiet))
    print(f"noisy neighbour: A sends {args.noisy:,} runs, then B sends {args.quiet}; B's queue delay")
    for keyed, label in ((True, "fair (Concurrency limit=5 per tenant)"), (False, "plain FIFO (no key)")):
        r = results[keyed]
        print(f"  {label:<40} p50 {r['p50'] * 1e3:9.1f} ms   p99 {r['p99'] * 1e3:9.1f} ms")
    rates = {}
    for keyed in (True, False):
        with tempfile.TemporaryDirectory() as folder:
            rates[keyed] = asyncio.run(throughput(folder, keyed))
    print("scheduler overhead: 2,000 one-step runs")
    print(f"  with a concurrency key (20 tenants, limit 10): {rates[True]:8,.0f} runs/s")
    print(
        f"  without:                                       {rates[False]:8,.0f} runs/s"
        f"   (keyed / plain = {rates[True] / rates[False]:.2f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
