"""``app.check`` with many live runs (issue 13): 10,000 sleeping runs, each with
three completed steps and a sleep, checked against the same code; the baseline,
measured in the same run, reads the same rows page by page without replaying.

    .venv/bin/python bench/bench_check.py [--runs 10000] [--database-url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import tempfile
import time
from typing import Any

import stepstone as ss
from stepstone.checking import _stored

FUNCTION = "order"


def charge(amount: int) -> dict[str, Any]:
    return {"id": f"ch_{amount}", "amount": amount}


def reserve(sku: str) -> str:
    return f"reserved {sku}"


def email(payment: dict[str, Any]) -> str:
    return f"receipt {payment['id']}"


async def order(ctx: ss.Context) -> str:
    payment = await ctx.step.run("charge", charge, ctx.event.data["amount"])
    await ctx.step.run("reserve", reserve, ctx.event.data["sku"])
    await ctx.step.run("email", email, payment)
    await ctx.step.sleep("cool-off", "7d")
    return str(payment["id"])


def make_app(url: str) -> ss.App:
    app = ss.App("bench-check", database_url=url)
    app.function(id=FUNCTION, trigger=ss.on_event("order"))(order)
    return app


def sleeping(app: ss.App) -> int:
    counts = app.store.read_sync(lambda tx: tx.count_active_runs())
    return sum(c.count for c in counts if c.status == "sleeping")


def seed(url: str, runs: int) -> None:
    app = make_app(url)
    app.start(concurrency=50)
    for start in range(0, runs, 500):
        app.send(
            [
                ss.Event("order", {"amount": i, "sku": f"sku-{i}"})
                for i in range(start, min(runs, start + 500))
            ]
        )
    began = time.monotonic()
    while sleeping(app) < runs:
        if time.monotonic() - began > 600:
            raise SystemExit(f"only {sleeping(app)} of {runs} runs asleep after 10 minutes")
        time.sleep(0.5)
    app.close()


async def read_only(url: str) -> int:
    app = make_app(url)
    count = 0
    async for _ in _stored(app.store, [FUNCTION]):
        count += 1
    app.close()
    return count


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args()
    url = args.database_url or f"sqlite:///{tempfile.mkdtemp()}/check.db"
    began = time.monotonic()
    seed(url, args.runs)
    print(f"seeded {args.runs} sleeping runs in {time.monotonic() - began:.1f} s ({url.split(':')[0]})")

    began = time.perf_counter()
    read = asyncio.run(read_only(url))
    read_s = time.perf_counter() - began
    began = time.perf_counter()
    report = make_app(url).check()
    check_s = time.perf_counter() - began
    assert report.ok and report.runs_checked == read == args.runs, (report.runs_checked, read)
    print(
        f"baseline: read {read} runs with their events and steps in {read_s:.2f} s ({read / read_s:,.0f} runs/s)"
    )
    print(
        f"check:    replayed {report.runs_checked} runs in {check_s:.2f} s ({report.runs_checked / check_s:,.0f} runs/s)"
    )
    print(f"ratio:    check takes {check_s / read_s:.2f}x the read alone")
    if url.startswith("sqlite:///"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            began = time.perf_counter()
            rows = conn.execute("SELECT * FROM steps").fetchall()
            raw_s = time.perf_counter() - began
        print(f"raw:      sqlite3 SELECT * FROM steps ({len(rows)} rows) in {raw_s:.2f} s")


if __name__ == "__main__":
    main()
