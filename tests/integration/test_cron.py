"""Cron: time zones, one run per tick under several workers, no storm after downtime."""

from __future__ import annotations

import asyncio
import threading
from datetime import datetime
from pathlib import Path

import stepstone as ss
from stepstone.scheduler.cron import latest_tick, next_tick
from stepstone.testing import VirtualClock


def ts(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def test_ticks_follow_the_time_zone_across_dst() -> None:
    # 09:00 in Paris is 08:00 UTC in winter and 07:00 UTC in summer (DST on 2026-03-29)
    assert next_tick("0 9 * * *", "Europe/Paris", ts("2026-03-27T12:00:00+00:00")) == ts("2026-03-28T08:00:00+00:00")
    assert next_tick("0 9 * * *", "Europe/Paris", ts("2026-03-28T12:00:00+00:00")) == ts("2026-03-29T07:00:00+00:00")
    assert latest_tick("*/5 * * * *", "UTC", ts("2026-01-01T10:07:30+00:00")) == ts("2026-01-01T10:05:00+00:00")
    assert latest_tick("*/5 * * * *", "UTC", ts("2026-01-01T10:05:00+00:00")) == ts("2026-01-01T10:05:00+00:00")


def _cron_app(url: str, clock: VirtualClock) -> ss.App:
    app = ss.App("cron", database_url=url, clock=clock)
    app.function(id="tick", trigger=ss.on_cron("* * * * *"))(lambda ctx: ctx.event.data["tick"])
    return app


def test_two_workers_start_one_run_per_tick(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/cron.db"
    clock = VirtualClock(ts("2026-05-01T12:00:30+00:00"))
    apps = [_cron_app(url, clock) for _ in range(2)]
    workers = [a.worker(instance_id=f"w{i}") for i, a in enumerate(apps)]
    loops = [asyncio.new_event_loop() for _ in workers]
    for worker, loop in zip(workers, loops, strict=True):
        loop.run_until_complete(worker.drain())  # registers the schedule

    for _minute in range(15):
        clock.advance(60)
        barrier = threading.Barrier(2)

        def drain(worker: object, loop: asyncio.AbstractEventLoop) -> None:
            barrier.wait()
            loop.run_until_complete(worker.drain())  # type: ignore[attr-defined]

        threads = [threading.Thread(target=drain, args=pair) for pair in zip(workers, loops, strict=True)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    runs = apps[0].runs.list(function_id="tick", limit=100)
    assert len(runs) == 15
    assert len({r.output for r in runs}) == 15 and all(r.status == "completed" for r in runs)
    for loop in loops:
        loop.close()
    for app in apps:
        app.close()


def test_downtime_runs_the_latest_missed_tick_once(tmp_path: Path) -> None:
    clock = VirtualClock(ts("2026-05-01T12:00:30+00:00"))
    app = _cron_app(f"sqlite:///{tmp_path}/cron.db", clock)
    worker = app.worker()
    loop = asyncio.new_event_loop()
    loop.run_until_complete(worker.drain())
    clock.advance(3 * 3600)  # three hours down: 180 missed ticks
    loop.run_until_complete(worker.drain())
    runs = app.runs.list(function_id="tick")
    assert [r.output for r in runs] == ["2026-05-01T15:00:00+00:00"]
    clock.advance(60)
    loop.run_until_complete(worker.drain())
    assert len(app.runs.list(function_id="tick")) == 2  # and the schedule goes on
    loop.close()
    app.close()


def test_cron_jitter_delays_the_run(tmp_path: Path) -> None:
    clock = VirtualClock(ts("2026-05-01T12:00:30+00:00"))
    app = ss.App("cron", database_url=f"sqlite:///{tmp_path}/c.db", clock=clock)
    app.function(id="j", trigger=ss.on_cron("* * * * *", jitter="30s"))(lambda ctx: "ran")
    worker = app.worker()
    loop = asyncio.new_event_loop()
    loop.run_until_complete(worker.drain())
    clock.advance(60)
    loop.run_until_complete(worker.drain())
    [run] = app.runs.list(function_id="j")
    assert run.status == "queued"  # due up to 30 s after the tick
    clock.advance(31)
    loop.run_until_complete(worker.drain())
    assert app.runs.get(run.id).status == "completed"
    loop.close()
    app.close()


