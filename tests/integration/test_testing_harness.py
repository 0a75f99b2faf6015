"""``ss.testing`` used exactly as a user would: a 7-day sleep, a long back-off,
a wait answered by the test, cron on a virtual clock."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest

import stepstone as ss
from stepstone.testing import TestEnv

app = ss.App("harness-demo", database_url="sqlite:////nonexistent/never-used.db")
reminders: list[str] = []
attempts: Counter[str] = Counter()


@app.function(id="trial", trigger=ss.on_event("trial.started"))
def trial(ctx: ss.Context) -> dict[str, Any]:
    user = ctx.event.data["user"]
    ctx.step.sleep("wait-7-days", "7d")
    upgraded = ctx.step.wait_for_event(
        "upgrade", event="plan.upgraded", if_="async.data.user == event.data.user", timeout="3d"
    )
    if upgraded is None:
        ctx.step.run("send-reminder", reminders.append, user)
    return {"user": user, "upgraded": upgraded is not None}


def flaky_sync() -> str:
    attempts["sync"] += 1
    if attempts["sync"] < 4:
        raise ConnectionError("partner API down")
    return "synced"


@app.function(id="sync", trigger=ss.on_event("sync"), backoff=ss.Backoff(initial="1h", factor=2, max="1d"))
def sync(ctx: ss.Context) -> str:
    return str(ctx.step.run("push", flaky_sync))


@app.function(id="daily", trigger=ss.on_cron("TZ=Europe/Paris 0 9 * * *"))
def daily(ctx: ss.Context) -> str:
    return str(ctx.event.data["tick"])


def test_a_week_long_sleep_and_a_reminder() -> None:
    reminders.clear()
    with TestEnv(app) as env:
        [run] = env.send(ss.Event("trial.started", {"user": "u1"}))
        assert env.get(run.id).status == "sleeping"
        done = env.wait(run.id)  # jumps 7 days, then 3 days of waiting
    assert done.output == {"user": "u1", "upgraded": False}
    assert reminders == ["u1"]
    assert [s.id for s in done.steps] == ["wait-7-days", "upgrade", "send-reminder"]


def test_sending_the_event_a_run_waits_for() -> None:
    reminders.clear()
    with TestEnv(app) as env:
        [run] = env.send(ss.Event("trial.started", {"user": "u2"}))
        env.advance("7d")
        assert env.get(run.id).status == "waiting"
        env.send(ss.Event("plan.upgraded", {"user": "someone-else"}))
        assert env.get(run.id).status == "waiting"
        env.send(ss.Event("plan.upgraded", {"user": "u2"}))
        done = env.get(run.id)
    assert done.output == {"user": "u2", "upgraded": True}
    assert reminders == []


def test_long_backoff_completes_at_once() -> None:
    attempts.clear()
    with TestEnv(app) as env:
        [run] = env.send(ss.Event("sync"))
        start = env.now
        done = env.wait(run.id)
        elapsed = (env.now - start).total_seconds()
    assert done.output == "synced" and attempts["sync"] == 4
    assert 7 * 3600 * 0.8 <= elapsed <= 7 * 3600 * 1.2  # 1h + 2h + 4h of virtual back-off


def test_wait_explains_a_run_stuck_on_an_event() -> None:
    with TestEnv(app) as env:
        [run] = env.send(ss.Event("trial.started", {"user": "u3"}))
        env.advance("7d")
        with pytest.raises(ss.RunTimeoutError, match="still waiting"):
            env.wait(run.id, timeout="1d")


def test_cron_ticks_on_the_virtual_clock() -> None:
    start = datetime(2026, 3, 1, 7, 0, tzinfo=UTC)  # 08:00 in Paris
    with TestEnv(app, start=start) as env:
        env.advance("2d")
        runs = env.runs.list(function_id="daily")
    ticks = sorted(r.output for r in runs)
    assert ticks == ["2026-03-01T08:00:00+00:00", "2026-03-02T08:00:00+00:00"]  # 09:00 Paris


def test_the_app_is_left_untouched() -> None:
    before = (app.database_url, app.clock)
    with TestEnv(app):
        assert app.database_url != before[0]
    assert (app.database_url, app.clock) == before


def create_with_retries(conn: Any, user: str) -> str:
    attempts["txn"] += 1
    conn.execute("INSERT INTO accounts (user_id) VALUES (?)", (user,))
    if attempts["txn"] < 3:
        raise ConnectionError("lock contention, say")  # rolled back, retried after a 1h back-off
    return user


@app.function(id="account", trigger=ss.on_event("account"), backoff=ss.Backoff(initial="1h", factor=1))
def account(ctx: ss.Context) -> str:
    return str(ctx.step.transaction("create-account", create_with_retries, ctx.event.data["user"]))


def test_a_transaction_step_on_the_virtual_clock_writes_one_row() -> None:
    import sqlite3

    attempts["txn"] = 0
    with TestEnv(app) as env:
        with sqlite3.connect(env.database_url.removeprefix("sqlite:///")) as conn:
            conn.execute("CREATE TABLE accounts (user_id TEXT)")
        [run] = env.send(ss.Event("account", {"user": "u1"}))
        run = env.wait(run.id)  # two back-offs of an hour, at once
        assert run.status == "completed" and run.output == "u1"
        with sqlite3.connect(env.database_url.removeprefix("sqlite:///")) as conn:
            assert conn.execute("SELECT user_id FROM accounts").fetchall() == [("u1",)]
    assert attempts["txn"] == 3
