"""What a step timeout costs per step (issue 14, point 1): a run of N trivial
steps on SQLite, untimed and timed, for a sync and an async step function in
an async handler. A timed sync step runs on a thread of its own (so that an
abandoned one never holds a pool thread); a timed async step runs under
``asyncio.timeout``. Each timed figure is printed with its ratio against the
untimed one measured in the same run.

    .venv/bin/python bench/bench_step_timeout.py [--steps 300] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import stepstone as ss
from stepstone.attempts import AbandonedThreads, attempt


def sync_step() -> int:
    return 1


async def async_step() -> int:
    return 1


def build(path: str, steps: int) -> ss.App:
    app = ss.App("bench", database_url=f"sqlite:///{path}")
    for kind, fn in (("sync", sync_step), ("async", async_step)):
        for timeout in (None, "10s"):
            name = f"{kind}-{'timed' if timeout else 'untimed'}"

            def register(fn: Any = fn, timeout: Any = timeout, name: str = name) -> None:
                @app.function(id=name, trigger=ss.on_event(name), retries=0)
                async def handler(ctx: ss.Context) -> int:
                    total = 0
                    for i in range(steps):
                        total += await ctx.step.run(f"s{i}", fn, timeout=timeout)
                    return total

            register()
    return app


def per_step_ms(app: ss.App, name: str, steps: int) -> float:
    started = time.perf_counter()
    [event_id] = app.send(ss.Event(name))
    [run] = app.runs.list(event_id=event_id)
    done = app.runs.wait(run.id, timeout="300s")
    assert done.output == steps, done
    return (time.perf_counter() - started) / steps * 1000


async def mechanism_us(fn: Any, timeout: float | None, n: int = 2000) -> float:
    """The attempt mechanism alone (no store): microseconds per attempt."""
    pool = ThreadPoolExecutor(4)
    ledger = AbandonedThreads()
    started = time.perf_counter()
    for _ in range(n):
        await attempt(
            "s", fn, (), context=contextvars.copy_context(), timeout=timeout, threads=pool, abandoned=ledger
        )
    pool.shutdown()
    return (time.perf_counter() - started) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        app = build(f"{tmp}/bench.db", args.steps)
        app.start(concurrency=1)
        try:
            figures: dict[str, list[float]] = {}
            for _ in range(args.rounds):  # interleaved, so drift hits every variant alike
                for kind in ("sync", "async"):
                    for variant in ("untimed", "timed"):
                        name = f"{kind}-{variant}"
                        figures.setdefault(name, []).append(per_step_ms(app, name, args.steps))
        finally:
            app.close()
    print("the attempt mechanism alone (no store), per attempt:")
    for kind, fn in (("sync", sync_step), ("async", async_step)):
        base = statistics.median(asyncio.run(mechanism_us(fn, None)) for _ in range(3))
        timed = statistics.median(asyncio.run(mechanism_us(fn, 10.0)) for _ in range(3))
        print(f"  {kind:5} step fn: untimed {base:.1f} us, timed {timed:.1f} us (ratio {timed / base:.2f}x)")
    print(f"per step, median of {args.rounds} runs of {args.steps} steps (SQLite, one worker):")
    for kind in ("sync", "async"):
        base = statistics.median(figures[f"{kind}-untimed"])
        timed = statistics.median(figures[f"{kind}-timed"])
        print(
            f"  {kind:5} step fn: untimed {base:.3f} ms, timeout=10s {timed:.3f} ms "
            f"(ratio {timed / base:.2f}x, +{(timed - base) * 1000:.0f} us)"
        )


if __name__ == "__main__":
    main()
