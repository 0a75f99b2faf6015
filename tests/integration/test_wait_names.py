"""Waits on several event names, with lookback (issue 14, point 3): the first
matching event of any name resolves the wait, exactly once, and removes every
name's wait row; ``lookback`` also matches events committed up to that long
before the wait began (oldest first, only of the wait's names and condition);
a wait without a timeout is logged once."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest

import stepstone as ss
from stepstone.testing import TestEnv

from ..conftest import query, run_of
from ..polling import wait_for


def _waiting(app: ss.App, run_id: str) -> None:
    wait_for(lambda: app.runs.get(run_id).status == "waiting", 10, f"run {run_id} to wait")


def _wait_rows(db_url: str, run_id: str) -> int:
    return int(query(db_url, f"SELECT COUNT(*) FROM waits WHERE run_id = '{run_id}'")[0][0])


def _either(app: ss.App) -> None:
    @app.function(id="w", trigger=ss.on_event("start"))
    async def w(ctx: ss.Context) -> Any:
        got = await ctx.step.wait_for_event(
            "paid-or-failed",
            event=["payment.succeeded", "payment.failed"],
            if_="async.data.order == event.data.order",
            timeout="30s",
        )
        return got.name if got else None


@pytest.mark.parametrize("name", ["payment.succeeded", "payment.failed"])
def test_a_wait_on_two_names_resolves_with_either(app: ss.App, db_url: str, name: str) -> None:
    _either(app)
    app.start()
    [eid] = app.send(ss.Event("start", {"order": 1}))
    run_id = run_of(app, eid).id
    _waiting(app, run_id)
    assert _wait_rows(db_url, run_id) == 2  # one row per name
    app.send(ss.Event(name, {"order": 2}))  # another order's event: no match
    app.send(ss.Event(name, {"order": 1}))
    run = app.runs.wait(run_id, timeout="10s")
    assert (run.status, run.output) == ("completed", name)
    assert _wait_rows(db_url, run_id) == 0  # both names' rows went with the first match


def test_events_of_both_names_racing_resolve_the_wait_once(app: ss.App, db_url: str) -> None:
    """Twenty runs wait on two names; each gets both events at once, from two
    threads (two transactions racing), or in one send (one transaction). Each
    wait resolves once, with one of them, and leaves no row behind."""
    _either(app)
    app.start()
    runs = [run_of(app, app.send(ss.Event("start", {"order": i}))[0]).id for i in range(20)]
    for run_id in runs:
        _waiting(app, run_id)
    barrier = threading.Barrier(2)

    def send(name: str, order: int) -> None:
        barrier.wait()
        app.send(ss.Event(name, {"order": order}))

    for order in range(10):
        threads = [
            threading.Thread(target=send, args=(name, order))
            for name in ("payment.succeeded", "payment.failed")
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    app.send(
        [
            ss.Event(name, {"order": order})
            for order in range(10, 20)
            for name in ("payment.failed", "payment.succeeded")
        ]
    )
    for order, run_id in enumerate(runs):
        run = app.runs.wait(run_id, timeout="10s")
        assert run.status == "completed" and run.output in ("payment.succeeded", "payment.failed")
        [step] = run.steps
        assert step.output["name"] == run.output and step.output["data"] == {"order": order}
        if order >= 10:  # in one transaction, the first event of the list wins
            assert run.output == "payment.failed"
        assert _wait_rows(db_url, run_id) == 0


def _lookback_app(app: ss.App) -> None:
    @app.function(id="w", trigger=ss.on_event("start"))
    async def w(ctx: ss.Context) -> Any:
        got = await ctx.step.wait_for_event(
            "approved",
            event=["approved", "auto.approved"],
            if_="async.data.user == event.data.user",
            timeout="1d",
            lookback="1h",
        )
        return got.data["n"] if got else None


def test_lookback_matches_the_oldest_earlier_event_of_its_names_and_condition(
    make_app: Callable[..., ss.App],
) -> None:
    app = make_app()
    _lookback_app(app)
    with TestEnv(app) as env:
        env.send(ss.Event("approved", {"user": "u1", "n": "too old"}))
        env.advance("2h")  # outside the window when the wait begins
        env.send(ss.Event("approved", {"user": "u2", "n": "another user"}))
        env.send(ss.Event("rejected", {"user": "u1", "n": "another name"}))
        env.advance("10m")
        env.send(ss.Event("auto.approved", {"user": "u1", "n": "oldest match"}))
        env.advance("10m")
        env.send(ss.Event("approved", {"user": "u1", "n": "newer match"}))
        env.advance("10m")
        [run] = env.send(ss.Event("start", {"user": "u1"}))
        done = env.get(run.id)
        assert (done.status, done.output) == ("completed", "oldest match")


def test_lookback_outside_its_window_waits_for_a_new_event(make_app: Callable[..., ss.App]) -> None:
    app = make_app()
    _lookback_app(app)
    with TestEnv(app) as env:
        env.send(ss.Event("approved", {"user": "u1", "n": "before the window"}))
        env.advance("61m")
        [run] = env.send(ss.Event("start", {"user": "u1"}))
        assert env.get(run.id).status == "waiting"
        env.advance("5m")
        env.send(ss.Event("approved", {"user": "u1", "n": "new"}))
        assert env.wait(run.id).output == "new"


def test_lookback_on_a_real_clock_and_store(app: ss.App) -> None:
    _lookback_app(app)
    app.send(ss.Event("auto.approved", {"user": "u1", "n": "already there"}))
    app.start()
    [eid] = app.send(ss.Event("start", {"user": "u1"}))
    assert app.runs.wait(run_of(app, eid).id, timeout="10s").output == "already there"


def test_a_wait_without_a_timeout_is_logged_once_per_function_and_step(
    make_app: Callable[..., ss.App], caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app()
    untimed = f"untimed-waits-{uuid.uuid4().hex[:8]}"  # warned once per process: a fresh id

    @app.function(id=untimed, trigger=ss.on_event("start"))
    async def w(ctx: ss.Context) -> Any:
        await ctx.step.wait_for_event("forever", event="never")

    @app.function(id="timed-waits", trigger=ss.on_event("start"))
    async def t(ctx: ss.Context) -> Any:
        await ctx.step.wait_for_event("bounded", event="never", timeout="1h")

    with caplog.at_level(logging.WARNING, logger="stepstone.waits"), TestEnv(app) as env:
        env.send([ss.Event("start"), ss.Event("start")])
    warned = [r.getMessage() for r in caplog.records if r.name == "stepstone.waits"]
    assert len(warned) == 1 and f"'{untimed}'" in warned[0] and "'forever'" in warned[0]


def test_bad_names_and_lookbacks_fail_the_run_naming_the_field(make_app: Callable[..., ss.App]) -> None:
    app = make_app()

    @app.function(id="no-names", trigger=ss.on_event("a"), retries=0)
    async def a(ctx: ss.Context) -> Any:
        await ctx.step.wait_for_event("w", event=[], timeout="1s")

    @app.function(id="bad-lookback", trigger=ss.on_event("b"), retries=0)
    async def b(ctx: ss.Context) -> Any:
        await ctx.step.wait_for_event("w", event="x", timeout="1s", lookback="yesterday")

    with TestEnv(app) as env:
        [ra] = env.send(ss.Event("a"))
        [rb] = env.send(ss.Event("b"))
        for run_id, field in ((ra.id, "event"), (rb.id, "lookback")):
            run = env.get(run_id)
            assert run.status == "failed" and run.error is not None and run.error.message.startswith(field)


def _tagged(app: ss.App) -> None:
    @app.function(id="tagged", trigger=ss.on_event("start-tagged"))
    async def tagged(ctx: ss.Context) -> Any:
        got = await ctx.step.wait_for_event(
            "tag", event="tag", if_="async.data.tag in event.data.tags", timeout="30s"
        )
        return got.data["n"] if got else None


def test_a_wait_indexed_by_each_element_of_its_list_is_cancelled_replayed_and_resolved_once(
    app: ss.App, db_url: str
) -> None:
    """A wait on ``async.data.tag in event.data.tags`` has a row per distinct
    tag (migration 0024): every exit (a cancel, a match, events racing) takes
    them all, and a replay writes them again."""
    _tagged(app)
    app.start()
    run_id = run_of(app, app.send(ss.Event("start-tagged", {"tags": ["a", "b", "b", "c"]}))[0]).id
    _waiting(app, run_id)
    assert _wait_rows(db_url, run_id) == 3
    app.runs.cancel(run_id)
    assert app.runs.wait(run_id, timeout="10s").status == "cancelled"
    assert _wait_rows(db_url, run_id) == 0
    app.send(ss.Event("tag", {"tag": "a", "n": 0}))  # a cancelled run's wait is gone: no match
    app.runs.replay(run_id)
    wait_for(lambda: _wait_rows(db_url, run_id) == 3, 10, "the replayed run to wait again")
    app.send(ss.Event("tag", {"tag": "z", "n": 1}))
    barrier = threading.Barrier(2)

    def send(tag: str, n: int) -> None:
        barrier.wait()
        app.send(ss.Event("tag", {"tag": tag, "n": n}))

    threads = [threading.Thread(target=send, args=args) for args in (("b", 2), ("c", 3))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    run = app.runs.wait(run_id, timeout="10s")
    assert (run.status, run.output in (2, 3)) == ("completed", True)
    assert [s.status for s in run.steps] == ["completed"]
    assert _wait_rows(db_url, run_id) == 0
