"""Cron: time zones, one run per tick under several workers, no storm after downtime."""

from __future__ import annotations

import asyncio
import tempfile
import threading
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import stepstone as ss
from stepstone.function import FunctionDef
from stepstone.scheduler.cron import latest_tick, next_tick
from stepstone.scheduler.maintenance import (
    STALE_SCHEDULE,
    cron_op,
    next_duty_op,
    register_crons_op,
    schedules_of,
)
from stepstone.store import make_store
from stepstone.testing import VirtualClock
from stepstone.triggers import Trigger
from stepstone.worker import Worker
from tests.conftest import run_of


def ts(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def test_ticks_follow_the_time_zone_across_dst() -> None:
    # 09:00 in Paris is 08:00 UTC in winter and 07:00 UTC in summer (DST on 2026-03-29)
    assert next_tick("0 9 * * *", "Europe/Paris", ts("2026-03-27T12:00:00+00:00")) == ts(
        "2026-03-28T08:00:00+00:00"
    )
    assert next_tick("0 9 * * *", "Europe/Paris", ts("2026-03-28T12:00:00+00:00")) == ts(
        "2026-03-29T07:00:00+00:00"
    )
    assert latest_tick("*/5 * * * *", "UTC", ts("2026-01-01T10:07:30+00:00")) == ts(
        "2026-01-01T10:05:00+00:00"
    )
    assert latest_tick("*/5 * * * *", "UTC", ts("2026-01-01T10:05:00+00:00")) == ts(
        "2026-01-01T10:05:00+00:00"
    )


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

        def drain(worker: Worker, loop: asyncio.AbstractEventLoop) -> None:
            barrier.wait()
            loop.run_until_complete(worker.drain())

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


def test_a_changed_schedule_does_not_stop_a_worker_from_leasing(make_app: Callable[..., ss.App]) -> None:
    """Issue 12 defect 4: a deploy changes a cron expression. The old schedule's
    row stays behind, due and never advanced by the new code; a worker of the new
    code must still lease (an unrelated run completes) and its duties must not be
    due forever."""
    clock = VirtualClock(ts("2026-05-01T12:00:30+00:00"))
    old = make_app("cron", clock=clock)
    old.function(id="report", trigger=ss.on_cron("* * * * *"))(lambda ctx: "old")
    loop = asyncio.new_event_loop()
    loop.run_until_complete(old.worker(instance_id="old").drain())  # registers "* * * * *"
    old.close()
    clock.advance(120)  # the old schedule's next tick is now in the past

    new = make_app("cron", clock=clock)
    new.function(id="report", trigger=ss.on_cron("0 0 1 1 *"))(lambda ctx: "new")
    new.function(id="hello", trigger=ss.on_event("hi"))(lambda ctx: "hello")
    new.start()
    try:
        [event_id] = new.send(ss.Event("hi"))
        run = new.runs.wait(run_of(new, event_id).id, timeout="10s")
        assert run.status == "completed"
        due = new.store.read_sync(next_duty_op(schedules_of(new.registry)))
        assert due is not None and due > clock.now()  # the new code's next tick, not the old one
    finally:
        loop.close()


POOL = ("* * * * *", "*/5 * * * *", "0 * * * *", "0 0 1 1 *", "TZ=Europe/Paris 30 2 * * *")
deploys = st.lists(
    st.tuples(
        st.sets(st.sampled_from(POOL), max_size=3),  # the deploy's schedules
        st.booleans(),  # does the previous deploy stay alive beside it?
        st.floats(min_value=0, max_value=3 * 86400),
    ),  # then time passes
    min_size=1,
    max_size=6,
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=deploys)
def test_any_change_of_schedules_between_deploys_leaves_duties_not_due(history: list[Any]) -> None:
    """The class of defect 4: whatever schedules each deploy of a function has
    (added, changed, several, all removed), with the previous deploy's workers
    alive or gone, after a worker's duty pass none of its duties is still due
    (it goes back to leasing), its own schedules tick in the future, and a row
    no live code hosts is ignored, then removed once stale."""
    with tempfile.TemporaryDirectory() as folder:
        store = make_store(f"sqlite:///{folder}/s.db")
        store.migrate()
        now = ts("2026-05-01T12:00:30+00:00")
        live: list[list[FunctionDef]] = []
        try:
            for schedules, keep_previous, pause in history:
                deploy = ss.App("cron", database_url="sqlite:///never-opened.db")
                triggers: list[Trigger] = [ss.on_cron(s) for s in sorted(schedules)]
                deploy.function(id="f", trigger=triggers or None)(lambda ctx: None)
                live = [*live[-1:], list(deploy.registry)] if keep_previous else [list(deploy.registry)]
                for functions in live:
                    store.transact_sync(register_crons_op(functions, now))
                    store.transact_sync(
                        cron_op([fn for fn in functions if fn.cron_triggers], now, deploy.registry)
                    )
                    due = store.read_sync(next_duty_op(schedules_of(functions)))
                    assert due is None or due > now, (schedules_of(functions), due, now)
                hosted = {pair for functions in live for pair in schedules_of(functions)}
                rows = store.read_sync(lambda tx: tx.crons_of(["f"]))
                assert hosted <= {(f, s) for f, s, _ in rows}
                for function_id, schedule, next_at in rows:
                    assert (function_id, schedule) in hosted or next_at >= now - STALE_SCHEDULE
                now += pause
        finally:
            store.close()
