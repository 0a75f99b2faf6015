"""Signal delivery latency (issue 14) against event delivery, in the same run.

    .venv/bin/python bench/bench_signals.py [--samples 200] [--backend both|sqlite|postgres]

A run parks on ``step.wait_for_signal("w", "go")``; the clock starts when
``app.runs.signal_async(run, "go")`` is called and stops when the run's next
step starts (the wait resolved, the run re-leased and replayed to it). The
baseline is the same with ``step.wait_for_event("w", event="go", if_=
"async.data.k == event.data.k")`` and ``app.send_async``. Samples alternate
between the two, one run at a time, each sent only once its run is parked;
one in-process worker (default concurrency). PostgreSQL: a private durable
cluster (``tests/pgcluster.py``), as ``bench_postgres.py`` starts it.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time

from bench_postgres import server
from workloads import pct

import stepstone as ss

KINDS = ("signal", "event")


def build(url: str) -> tuple[ss.App, dict[str, asyncio.Future[float]]]:
    app = ss.App("bench-signals", database_url=url)
    seen: dict[str, asyncio.Future[float]] = {}

    async def observe(run_id: str) -> None:  # on the worker's loop, which is this one
        seen[run_id].set_result(time.perf_counter())

    @app.function(id="signal", trigger=ss.on_event("start.signal"))
    async def by_signal(ctx: ss.Context) -> None:
        await ctx.step.wait_for_signal("w", "go", timeout="60s")
        await ctx.step.run("next", observe, ctx.run_id)

    @app.function(id="event", trigger=ss.on_event("start.event"))
    async def by_event(ctx: ss.Context) -> None:
        await ctx.step.wait_for_event("w", event="go", if_="async.data.k == event.data.k", timeout="60s")
        await ctx.step.run("next", observe, ctx.run_id)

    return app, seen


async def parked(app: ss.App, run_id: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        run = await app.runs.get_async(run_id)
        if run.status == "waiting" and run.steps and run.steps[0].status == "waiting":
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"run {run_id} never parked ({run.status})")
        await asyncio.sleep(0.001)


async def one(app: ss.App, seen: dict[str, asyncio.Future[float]], kind: str, k: int) -> float:
    [event_id] = await app.send_async(ss.Event(f"start.{kind}", {"k": k}))
    [run] = await app.runs.list_async(event_id=event_id)
    future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
    seen[run.id] = future
    await parked(app, run.id)
    started = time.perf_counter()
    if kind == "signal":
        await app.runs.signal_async(run.id, "go", {"k": k})
    else:
        await app.send_async(ss.Event("go", {"k": k}))
    observed = await asyncio.wait_for(future, 60)
    del seen[run.id]
    return observed - started


async def measure(url: str, samples: int) -> dict[str, list[float]]:
    app, seen = build(url)
    await app.start_async()
    times: dict[str, list[float]] = {kind: [] for kind in KINDS}
    try:
        for i in range(samples + 10):  # 10 warm-up pairs
            for kind in KINDS if i % 2 else KINDS[::-1]:
                latency = await one(app, seen, kind, i)
                if i >= 10:
                    times[kind].append(latency)
    finally:
        await app.stop_async()
        app.close()
    return times


def report(backend: str, times: dict[str, list[float]]) -> None:
    sig, evt = times["signal"], times["event"]
    for q, label in ((0.5, "p50"), (0.99, "p99")):
        s, e = pct(sig, q), pct(evt, q)
        print(
            f"{backend:10} {label}: signal {s * 1e3:7.2f} ms   event {e * 1e3:7.2f} ms   ratio {s / e:5.2f}"
        )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--backend", choices=("both", "sqlite", "postgres"), default="both")
    args = parser.parse_args()
    print(f"{args.samples} samples of each, send -> the run's next step starts, one run at a time")
    if args.backend in ("both", "sqlite"):
        with tempfile.TemporaryDirectory() as folder:
            report("sqlite", asyncio.run(measure(f"sqlite:///{folder}/signals.db", args.samples)))
    if args.backend in ("both", "postgres"):
        with server(None) as create:
            report("postgresql", asyncio.run(measure(create("signals"), args.samples)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
