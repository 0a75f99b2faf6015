"""What the benchmarks share: percentiles, the three-step workflow, and the two
in-process measurements (gaps between steps, three-step latency) on any app."""

from __future__ import annotations

import itertools
import time

import stepstone as ss


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def add_three_steps(app: ss.App) -> None:
    """The benchmark's three-step function (``three``), triggered by ``three``."""

    async def trivial() -> int:
        return 1

    @app.function(id="three", trigger=ss.on_event("three"))
    async def three(ctx: ss.Context) -> int:
        for name in ("a", "b", "c"):
            await ctx.step.run(name, trivial)
        return 3


async def step_gaps(app: ss.App, steps: int = 900, timeout: str = "300s") -> list[float]:
    """Gaps between consecutive trivial steps of one run (interpreter + the
    fenced checkpoint); closes ``app``."""
    stamps: list[float] = []

    async def trivial() -> int:
        stamps.append(time.perf_counter())
        return 1

    @app.function(id="many-steps", trigger=ss.on_event("many"))
    async def many(ctx: ss.Context) -> int:
        for _ in range(steps):
            await ctx.step.run("s", trivial)
        return steps

    await app.start_async(concurrency=1)
    [eid] = await app.send_async(ss.Event("many"))
    [run] = await app.runs.list_async(event_id=eid)
    await app.runs.wait_async(run.id, timeout=timeout)
    await app.stop_async()
    app.close()
    return [b - a for a, b in itertools.pairwise(stamps)]


async def three_step_latencies(app: ss.App, runs: int = 300, warm_up: int = 10) -> list[float]:
    """send -> ``runs.wait`` returns it completed, one three-step run at a time
    (in-process worker, woken when the run ends); closes ``app``."""
    add_three_steps(app)
    await app.start_async(concurrency=10)
    latencies = []
    for _ in range(runs):
        t = time.perf_counter()
        [eid] = await app.send_async(ss.Event("three"))
        [run] = await app.runs.list_async(event_id=eid)
        done = await app.runs.wait_async(run.id, timeout="30s")
        latencies.append(time.perf_counter() - t)
        assert done.status == "completed"
    await app.stop_async()
    app.close()
    return latencies[warm_up:]
