"""Admission cost on SQLite: CPU microseconds (this process's CPU time, so that
other jobs on a shared host weigh less) per event that becomes a run, for a
function with flow options against a plain function measured in the same run
(the baseline). Events are sent in batches, so one commit is shared by many
admissions and the figure is the admission's own work (CEL keys, claims,
GCRA cells, placement), not the commit.

    .venv/bin/python bench/bench_admission.py [--events 4000] [--batch 200]

Runs against any checkout of the code (public API only), e.g. with
``PYTHONPATH=<checkout>`` to compare two versions in the same minutes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import stepstone as ss

SHAPES: dict[str, dict[str, Any]] = {
    "plain": {},
    "keyed": {
        "concurrency": [ss.Concurrency(limit=5, key="event.data.tenant")],
        "throttle": ss.Throttle(limit=100000, period="1s", key="event.data.tenant"),
        "priority": ss.Priority(run="event.data.vip ? 60 : 0"),
        "timeouts": ss.Timeouts(start="1h", finish="1h"),
    },
    "gated": {
        "idempotency": "event.data.n",
        "rate_limit": ss.RateLimit(limit=100000, period="1s", key="event.data.tenant"),
        "singleton": ss.Singleton(key="event.data.n"),
    },
    "debounced": {"debounce": ss.Debounce(period="1h", key="event.data.tenant")},
}


def per_event(folder: str, shape: str, events: int, batch: int) -> list[float]:
    """CPU seconds per event of each batch sent to a function of that shape."""
    app = ss.App("bench", database_url=f"sqlite:///{folder}/{shape}.db?synchronous=normal")
    app.function(id=shape, trigger=ss.on_event(shape), **SHAPES[shape])(lambda ctx: None)
    make: Callable[[int], ss.Event] = lambda n: ss.Event(  # noqa: E731
        shape, {"n": n, "tenant": f"t{n % 20}", "vip": n % 7 == 0}
    )
    app.send(make(-1))  # open and register before timing
    times = []
    for start in range(0, events, batch):
        chunk = [make(n) for n in range(start, min(events, start + batch))]
        t = time.process_time()
        app.send(chunk)
        times.append((time.process_time() - t) / len(chunk))
    app.close()
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=4000)
    parser.add_argument("--batch", type=int, default=200)
    args = parser.parse_args()
    print(
        f"python {sys.version.split()[0]}, {args.events} events per shape in batches of {args.batch};"
        " CPU time per event, p50 and least over batches"
    )
    times: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for shape in SHAPES:
            times[shape] = per_event(tmp, shape, args.events, args.batch)
    base_p50, base_min = statistics.median(times["plain"]), min(times["plain"])
    for shape, seconds in times.items():
        p50, least = statistics.median(seconds), min(seconds)
        options = ", ".join(SHAPES[shape]) or "no flow options (baseline)"
        print(
            f"  {shape:10} p50 {p50 * 1e6:6.1f} us ({p50 / base_p50:4.2f}x plain)"
            f"  min {least * 1e6:6.1f} us ({least / base_min:4.2f}x plain)   {options}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
