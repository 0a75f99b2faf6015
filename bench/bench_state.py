"""Resuming a long run with large outputs (issue 17, point 2): memory and latency.

A run records 999 steps (the 1000th is a wait) with 100 KB outputs each
(~100 MB of history), then waits for an event; the event resumes it and the
handler replays every step from its memo. Measured in a fresh process per
case (the history recorded by one process, resumed by a fresh one, so that
memory freed after recording does not hide the resume's): the growth of the
resuming process's RSS (sampled every 2 ms, peak minus the RSS before the
event) and the resume latency (event sent -> run completed). Baselines in the same run: the same workload with tiny
outputs, and both workloads under another source tree (``--baseline-src``:
e.g. main's eager loading, ``git archive main | tar -x -C DIR``).

    PYTHONPATH=$PWD:$PWD/bench .venv/bin/python bench/bench_state.py \\
        --baseline-src /tmp/main-src [--steps 999] [--size 100000] [--repeat 2]
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any


def rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class PeakRss:
    """The largest RSS seen by a sampling thread while the block runs."""

    def __enter__(self) -> PeakRss:
        self.peak, self._stop = rss_bytes(), threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, rss_bytes())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())


def status(db: str, run_id: str) -> str:
    """Read straight from the file: ``app.runs.get`` would read every output."""
    with sqlite3.connect(db) as conn:
        return str(conn.execute("SELECT status FROM runs WHERE id = ?", (run_id,)).fetchone()[0])


def until(predicate: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError
        time.sleep(0.005)


def make_app(db: str, steps: int, size: int) -> Any:
    import stepstone as ss

    app = ss.App("bench-state", database_url=f"sqlite:///{db}")
    options: dict[str, Any] = {}
    if "max_state" in inspect.signature(app.function).parameters:
        options["max_state"] = None  # the history is past the 32 MB default on purpose

    @app.function(id="long", trigger=ss.on_event("go"), **options)
    async def long(ctx: ss.Context) -> int:
        total = 0
        for i in range(steps):
            total += len(await ctx.step.run(f"s{i}", lambda: "x" * size))
        await ctx.step.wait_for_event("more", event="more", timeout="1h")
        return total

    return app


def record(db: str, steps: int, size: int) -> dict[str, Any]:
    """Phase one, in its own process: the run records its steps and waits."""
    import stepstone as ss

    app = make_app(db, steps, size)
    app.start()
    [event_id] = app.send(ss.Event("go"))
    [run] = app.runs.list(event_id=event_id)
    until(lambda: status(db, run.id) == "waiting", 600)
    app.stop()
    app.close()
    return {"run_id": run.id}


def resume(db: str, run_id: str, steps: int, size: int) -> dict[str, Any]:
    """Phase two, in a fresh process (RSS not inflated by recording): resume."""
    import stepstone as ss

    app = make_app(db, steps, size)
    app.start()
    gc.collect()
    before = rss_bytes()
    with PeakRss() as peak:
        sent = time.perf_counter()
        app.send(ss.Event("more"))
        until(lambda: status(db, run_id) == "completed", 600)
        latency = time.perf_counter() - sent
    app.stop()
    app.close()
    return {"rss_growth_mb": (peak.peak - before) / 2**20, "resume_s": latency}


def run_case(src: str, steps: int, size: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, str(Path(__file__).parent)])}
    db = os.path.join(tempfile.mkdtemp(), "state.db")

    def phase(*extra: str) -> dict[str, Any]:
        args = [sys.executable, __file__, "--steps", str(steps), "--size", str(size), "--db", db, *extra]
        out = subprocess.run(args, env=env, cwd=src, capture_output=True, text=True, check=True).stdout
        return dict(json.loads(out.strip().splitlines()[-1]))

    run_id = phase("--record")["run_id"]
    return phase("--resume", run_id)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--record", action="store_true")
    parser.add_argument("--resume", default=None, help="the run to resume")
    parser.add_argument("--db", default=None)
    parser.add_argument("--steps", type=int, default=999)
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--tiny", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--baseline-src", default=None, help="another source tree (e.g. main's)")
    args = parser.parse_args()
    if args.record:
        print(json.dumps(record(args.db, args.steps, args.size)))
        return
    if args.resume:
        print(json.dumps(resume(args.db, args.resume, args.steps, args.size)))
        return
    here = str(Path(__file__).resolve().parents[1])
    trees = {"this tree": here, **({"baseline": args.baseline_src} if args.baseline_src else {})}
    results: dict[tuple[str, int], list[dict[str, float]]] = {}
    for _ in range(args.repeat):  # interleaved: each case once per round
        for name, src in trees.items():
            for size in (args.size, args.tiny):
                results.setdefault((name, size), []).append(run_case(src, args.steps, size))
    print(f"resume of a {args.steps}-step run (then a wait), best of {args.repeat}, SQLite")
    best: dict[tuple[str, int], dict[str, float]] = {}
    for (name, size), runs in results.items():
        best[(name, size)] = {k: min(r[k] for r in runs) for k in runs[0]}
        row = best[(name, size)]
        history = args.steps * size / 2**20
        print(
            f"  {name:10} outputs {size:>7} B (history {history:7.1f} MB): "
            f"RSS growth {row['rss_growth_mb']:7.1f} MB, resume {row['resume_s'] * 1000:8.1f} ms"
        )
    large, tiny = best[("this tree", args.size)], best[("this tree", args.tiny)]
    print(
        f"  this tree, large vs tiny outputs: RSS growth {large['rss_growth_mb'] - tiny['rss_growth_mb']:+.1f} MB,"
        f" resume x{large['resume_s'] / tiny['resume_s']:.2f}"
    )
    if args.baseline_src:
        base = best[("baseline", args.size)]
        print(
            f"  large outputs, this tree vs baseline: RSS growth x{large['rss_growth_mb'] / base['rss_growth_mb']:.2f},"
            f" resume x{large['resume_s'] / base['resume_s']:.2f}"
        )


if __name__ == "__main__":
    main()
