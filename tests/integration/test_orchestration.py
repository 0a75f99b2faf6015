"""Orchestration with real workers and real time: sleeps, waits, invoke,
send_event, cancellation, timeouts, idempotency, singleton, system events."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import stepstone as ss

from ..conftest import FAST, query, run_of, send_and_wait
from ..polling import wait_for


def wait_status(app: ss.App, run_id: str, status: str, timeout: float = 10) -> ss.Run:
    deadline = time.monotonic() + timeout
    while True:
        run = app.runs.get(run_id)
        if run.status == status:
            return run
        assert time.monotonic() < deadline, f"run stayed {run.status}, expected {status}"
        time.sleep(0.01)


def start(app: ss.App, event: ss.Event, function_id: str | None = None) -> str:
    [eid] = app.send(event)
    return run_of(app, eid, function_id).id


# -- sleeps ------------------------------------------------------------------------------------


def test_sleep_pauses_without_a_slot_and_resumes_on_time(app: ss.App) -> None:
    woke: list[float] = []

    def wake() -> str:
        woke.append(time.monotonic())
        return "up"

    @app.function(id="sleeper", trigger=ss.on_event("nap"))
    async def sleeper(ctx: ss.Context) -> str:
        await ctx.step.run("before", lambda: "x")
        await ctx.step.sleep("nap", "1500ms")
        return str(await ctx.step.run("after", wake))

    @app.function(id="quick", trigger=ss.on_event("quick"))
    def quick(ctx: ss.Context) -> str:
        return "done"

    app.start(concurrency=1)  # one slot: the sleeping run must not hold it
    t0 = time.monotonic()
    run_id = start(app, ss.Event("nap"))
    wait_status(app, run_id, "sleeping")
    assert send_and_wait(app, ss.Event("quick")).status == "completed"
    assert time.monotonic() - t0 < 1.4  # the quick run did not wait for the sleeper
    run = app.runs.wait(run_id)
    assert run.output == "up"
    assert 1.5 <= woke[0] - t0 < 2.5  # resumed no more than ~1 s late
    assert [(s.id, s.kind, s.status) for s in run.steps] == [
        ("before", "run", "completed"),
        ("nap", "sleep", "completed"),
        ("after", "run", "completed"),
    ]


def test_sleep_until_and_limits(app: ss.App) -> None:
    @app.function(id="until", trigger=ss.on_event("until"))
    def until(ctx: ss.Context) -> str:
        ctx.step.sleep_until("past", datetime.now(UTC) - timedelta(seconds=5))
        ctx.step.sleep_until("soon", datetime.now(UTC) + timedelta(milliseconds=200))
        return "ok"

    @app.function(id="too-long", trigger=ss.on_event("long"), retries=0)
    def too_long(ctx: ss.Context) -> None:
        ctx.step.sleep("forever", "367d")

    app.start()
    assert send_and_wait(app, ss.Event("until")).output == "ok"
    run = send_and_wait(app, ss.Event("long"))
    assert run.status == "failed" and run.error is not None and "366 days" in run.error.message


# -- waits ------------------------------------------------------------------------------------


def test_wait_for_event_matches_on_data(app: ss.App) -> None:
    @app.function(id="onboard", trigger=ss.on_event("user.signup"))
    async def onboard(ctx: ss.Context) -> Any:
        got = await ctx.step.wait_for_event(
            "verified", event="user.verified", if_="async.data.user_id == event.data.user_id", timeout="30s"
        )
        return got.data if got else None

    app.start()
    run_a = start(app, ss.Event("user.signup", {"user_id": "a"}))
    run_b = start(app, ss.Event("user.signup", {"user_id": "b"}))
    wait_status(app, run_a, "waiting")
    wait_status(app, run_b, "waiting")
    app.send(ss.Event("user.verified", {"user_id": "b", "via": "email"}))
    assert app.runs.wait(run_b).output == {"user_id": "b", "via": "email"}
    assert app.runs.get(run_a).status == "waiting"
    app.send(ss.Event("user.verified", {"user_id": "a", "via": "sms"}))
    assert app.runs.wait(run_a).output == {"user_id": "a", "via": "sms"}


def test_wait_with_compound_and_unindexed_conditions(app: ss.App) -> None:
    @app.function(id="big-order", trigger=ss.on_event("cart"))
    async def big(ctx: ss.Context) -> Any:
        got = await ctx.step.wait_for_event(
            "paid", event="payment", if_="async.data.cart == event.data.cart && async.data.amount > 100"
        )
        other = await ctx.step.wait_for_event(
            "any-refund", event="refund", if_="async.data.amount >= event.data.min_refund"
        )
        return [got.data["amount"] if got else None, other.data["amount"] if other else None]

    app.start()
    run_id = start(app, ss.Event("cart", {"cart": "c1", "min_refund": 5}))
    wait_status(app, run_id, "waiting")
    app.send(
        [
            ss.Event("payment", {"cart": "c1", "amount": 50}),  # too small
            ss.Event("payment", {"cart": "c2", "amount": 500}),  # another cart
            ss.Event("payment", {"cart": "c1", "amount": 150}),
        ]
    )  # the one
    # The refunds only once the second wait is registered (no lookback: sent
    # before it, they would match nothing).
    wait_for(lambda: any(s.id == "any-refund" for s in app.runs.get(run_id).steps), 10, "the second wait")
    app.send([ss.Event("refund", {"amount": 1}), ss.Event("refund", {"amount": 7})])
    assert app.runs.wait(run_id).output == [150, 7]


def test_two_waits_one_event_and_event_before_wait(app: ss.App) -> None:
    @app.function(id="w", trigger=ss.on_event("start"))
    async def w(ctx: ss.Context) -> Any:
        await ctx.step.sleep("settle", "300ms")  # events sent meanwhile must not count
        got = await ctx.step.wait_for_event("go", event="go", timeout="20s")
        return got.data["n"] if got else None

    app.start()
    first = start(app, ss.Event("start", {"k": 1}))
    second = start(app, ss.Event("start", {"k": 2}))
    app.send(ss.Event("go", {"n": "early"}))  # before either wait began
    wait_status(app, first, "waiting")
    wait_status(app, second, "waiting")
    app.send(ss.Event("go", {"n": "on time"}))
    assert app.runs.wait(first).output == "on time"
    assert app.runs.wait(second).output == "on time"


def test_wait_timeout_returns_none(app: ss.App) -> None:
    @app.function(id="w", trigger=ss.on_event("start"))
    def w(ctx: ss.Context) -> Any:
        return ctx.step.wait_for_event("never", event="nope", timeout="300ms")

    app.start()
    run = send_and_wait(app, ss.Event("start"))
    assert run.status == "completed" and run.output is None
    assert run.steps[0].status == "completed" and run.steps[0].kind == "wait"


def test_timeout_racing_an_event_has_exactly_one_outcome(app: ss.App) -> None:
    outcomes: Counter[str] = Counter()

    @app.function(id="race", trigger=ss.on_event("race"))
    async def race(ctx: ss.Context) -> str:
        got = await ctx.step.wait_for_event(
            "w", event="ping", if_="async.data.k == event.data.k", timeout="400ms"
        )
        result = "event" if got else "timeout"
        await ctx.step.run("record", lambda: outcomes.update([result]))
        return result

    app.start()
    runs = [start(app, ss.Event("race", {"k": i})) for i in range(20)]
    for run_id in runs:  # parked; under load an early one may already have timed out, which is fine
        wait_for(
            lambda: app.runs.get(run_id).status in ("waiting", "completed"),
            timeout=10,
            what=f"run {run_id} to park",
        )
    time.sleep(0.35)
    app.send([ss.Event("ping", {"k": i}) for i in range(20)])  # lands around the timeouts
    results = [app.runs.wait(r).output for r in runs]
    assert sum(outcomes.values()) == 20  # each run recorded exactly one outcome
    assert Counter(results) == outcomes


def test_bad_wait_condition_fails_clearly(app: ss.App) -> None:
    @app.function(id="w", trigger=ss.on_event("start"), retries=0)
    async def w(ctx: ss.Context) -> None:
        await ctx.step.wait_for_event("w", event="x", if_="async.data. ==")

    app.start()
    run = send_and_wait(app, ss.Event("start"))
    assert run.status == "failed" and run.error is not None and "if_" in run.error.message


# -- invoke and send_event ------------------------------------------------------------------


def test_invoke_returns_the_child_output(app: ss.App) -> None:
    @app.function(id="child", trigger=ss.on_event("never.sent"))
    async def child(ctx: ss.Context) -> int:
        return int(await ctx.step.run("double", lambda: ctx.event.data["x"] * 2))

    @app.function(id="parent", trigger=ss.on_event("parent"))
    async def parent(ctx: ss.Context) -> Any:
        by_ref = await ctx.step.invoke("by-ref", function=child, data={"x": 21})
        by_id = await ctx.step.invoke("by-id", function="child", data={"x": 5})
        return [by_ref, by_id]

    app.start(concurrency=1)  # the waiting parent must not hold the only slot
    run = send_and_wait(app, ss.Event("parent"))
    assert run.output == [42, 10]
    children = app.runs.list(function_id="child")
    assert len(children) == 2 and all(c.status == "completed" for c in children)


def test_invoke_raises_step_error_on_failure_and_timeout(app: ss.App) -> None:
    @app.function(id="bad-child", trigger=ss.on_event("never"), retries=0)
    def bad_child(ctx: ss.Context) -> None:
        raise ss.NonRetriableError("child says no")

    @app.function(id="slow-child", trigger=ss.on_event("never2"))
    def slow_child(ctx: ss.Context) -> None:
        ctx.step.sleep("long", "1h")

    @app.function(id="parent", trigger=ss.on_event("parent"))
    def parent(ctx: ss.Context) -> list[str]:
        errors = []
        for ref, timeout in (("bad-child", None), ("slow-child", "300ms")):
            try:
                ctx.step.invoke(f"call-{ref}", function=ref, data={}, timeout=timeout)
            except ss.StepError as err:
                errors.append(f"{err.error_type}: {err.message}")
        return errors

    app.start()
    run = send_and_wait(app, ss.Event("parent"))
    assert run.output == [
        "NonRetriableError: child says no",
        "InvokeTimeout: step 'call-slow-child': the invoked run did not finish in time",
    ]


def test_invoke_unknown_function_fails(app: ss.App) -> None:
    @app.function(id="parent", trigger=ss.on_event("parent"))
    async def parent(ctx: ss.Context) -> None:
        await ctx.step.invoke("x", function="does-not-exist")

    app.start()
    run = send_and_wait(app, ss.Event("parent"))
    assert run.status == "failed" and run.error is not None and "does-not-exist" in run.error.message


def test_send_event_is_exactly_once_across_retries(app: ss.App) -> None:
    received: Counter[str] = Counter()
    attempts: Counter[str] = Counter()

    @app.function(id="fan-out", trigger=ss.on_event("order"), backoff=FAST)
    async def fan_out(ctx: ss.Context[ss.AsyncStep]) -> list[str]:
        ids = await ctx.step.send_event("notify", [ss.Event("order.item", {"i": i}) for i in range(3)])
        await ctx.step.run("flaky", _flaky(attempts))
        return ids

    @app.function(id="item", trigger=ss.on_event("order.item"))
    def item(ctx: ss.Context) -> None:
        ctx.step.run("count", lambda: received.update([str(ctx.event.data["i"])]))

    app.start()
    run = send_and_wait(app, ss.Event("order"))
    assert run.status == "completed" and len(run.output) == 3 and attempts["flaky"] == 3
    for run_ in app.runs.list(function_id="item"):
        app.runs.wait(run_.id)
    assert len(app.runs.list(function_id="item")) == 3
    assert received == {"0": 1, "1": 1, "2": 1}


def _flaky(attempts: Counter[str]) -> Any:
    def fn() -> str:
        attempts["flaky"] += 1
        if attempts["flaky"] < 3:
            raise RuntimeError("try again")
        return "ok"

    return fn


# -- cancellation ---------------------------------------------------------------------------


def test_cancel_during_a_long_step_finishes_it_and_runs_nothing_after(app: ss.App) -> None:
    started, release = threading.Event(), threading.Event()
    ran: list[str] = []

    def long_step() -> str:
        started.set()
        release.wait(10)
        ran.append("long")
        return "done"

    @app.function(id="job", trigger=ss.on_event("job"))
    def job(ctx: ss.Context) -> None:
        ctx.step.run("long", long_step)
        ctx.step.run("after", lambda: ran.append("after"))

    app.start()
    run_id = start(app, ss.Event("job"))
    assert started.wait(10)
    assert app.runs.cancel(run_id) == "running"  # flagged: takes effect between steps
    release.set()
    run = app.runs.wait(run_id)
    assert run.status == "cancelled"
    assert ran == ["long"]
    assert [(s.id, s.status) for s in run.steps] == [("long", "completed")]
    [cancelled_event] = [e for e in _events(app, "stepstone/function.cancelled")]
    assert cancelled_event["run_id"] == run_id


def _events(app: ss.App, name: str) -> list[dict[str, Any]]:
    import json

    rows = app.store.read_sync(lambda tx: tx.list_events(name, None, None, 100))
    return [json.loads(r.data) for r in rows]


def test_cancel_on_event(app: ss.App) -> None:
    @app.function(
        id="trial",
        trigger=ss.on_event("trial.started"),
        cancel_on=[ss.CancelOn(event="user.deleted", if_="async.data.user == event.data.user")],
    )
    async def trial(ctx: ss.Context) -> str:
        await ctx.step.sleep("wait-a-week", "7d")
        return "reminded"

    app.start()
    keep = start(app, ss.Event("trial.started", {"user": "keep"}))
    gone = start(app, ss.Event("trial.started", {"user": "gone"}))
    wait_status(app, keep, "sleeping")
    wait_status(app, gone, "sleeping")
    app.send(ss.Event("user.deleted", {"user": "gone"}))
    run = app.runs.get(gone)
    assert run.status == "cancelled" and run.error is not None and "user.deleted" in run.error.message
    assert app.runs.get(keep).status == "sleeping"


def test_cancel_many_with_filter(app: ss.App) -> None:
    @app.function(id="s", trigger=ss.on_event("s"))
    async def s(ctx: ss.Context) -> None:
        await ctx.step.sleep("z", "1h")

    app.start()
    ids = [start(app, ss.Event("s", {"tenant": t})) for t in ("a", "b", "a")]
    for run_id in ids:
        wait_status(app, run_id, "sleeping")
    assert app.runs.cancel_many(function_id="s", if_="event.data.tenant == 'a'") == 2
    assert [app.runs.get(r).status for r in ids] == ["cancelled", "sleeping", "cancelled"]


# -- timeouts, idempotency, singleton ---------------------------------------------------------


def test_finish_timeout_cancels_a_sleeping_run(app: ss.App) -> None:
    @app.function(id="t", trigger=ss.on_event("t"), timeouts=ss.Timeouts(finish="500ms"))
    async def t(ctx: ss.Context) -> None:
        await ctx.step.sleep("long", "1h")

    app.start()
    run = app.runs.wait(start(app, ss.Event("t")), timeout="5s")
    assert run.status == "cancelled" and run.error is not None and run.error.type == "Timeout"


def test_start_timeout_cancels_a_queued_run(make_app: Callable[..., ss.App]) -> None:
    app = make_app()

    @app.function(id="t", trigger=ss.on_event("t"), timeouts=ss.Timeouts(start="300ms"))
    def t(ctx: ss.Context) -> str:
        return "ran"

    run_id = start(app, ss.Event("t"))
    time.sleep(0.4)  # no worker yet: the run waits in the queue past its start timeout
    app.start()
    run = app.runs.wait(run_id, timeout="5s")
    assert run.status == "cancelled" and run.error is not None and "timeouts.start" in run.error.message


def test_idempotency_key_one_run_per_key(app: ss.App) -> None:
    app.function(id="pay", trigger=ss.on_event("pay"), idempotency="event.data.order")(lambda ctx: None)
    ids = app.send(
        [
            ss.Event("pay", {"order": 1}),
            ss.Event("pay", {"order": 1}),
            ss.Event("pay", {"order": 2}),
            ss.Event("pay", {}),
        ]
    )
    started = {r.event_ids[0] for r in app.runs.list(function_id="pay")}
    assert started == {ids[0], ids[2], ids[3]}  # the repeat of order 1 started nothing


def test_singleton_skip_and_cancel(app: ss.App) -> None:
    @app.function(
        id="skip", trigger=ss.on_event("skip"), singleton=ss.Singleton(key="event.data.u", mode="skip")
    )
    async def skip(ctx: ss.Context) -> None:
        await ctx.step.sleep("z", "1h")

    @app.function(
        id="replace",
        trigger=ss.on_event("replace"),
        singleton=ss.Singleton(key="event.data.u", mode="cancel"),
    )
    async def replace(ctx: ss.Context) -> None:
        await ctx.step.sleep("z", "1h")

    app.start()
    first = start(app, ss.Event("skip", {"u": 1}))
    wait_status(app, first, "sleeping")
    second = start(app, ss.Event("skip", {"u": 1}))
    other_key = start(app, ss.Event("skip", {"u": 2}))
    assert app.runs.get(second).status == "skipped"
    assert "singleton" in app.runs.get(second).meta["skipped"]
    wait_status(app, other_key, "sleeping")
    old = start(app, ss.Event("replace", {"u": 1}))
    wait_status(app, old, "sleeping")
    new = start(app, ss.Event("replace", {"u": 1}))
    assert app.runs.get(old).status == "cancelled"
    wait_status(app, new, "sleeping")
    app.runs.cancel(first)  # the key is free again
    third = start(app, ss.Event("skip", {"u": 1}))
    wait_status(app, third, "sleeping")


def test_system_events_trigger_other_functions(app: ss.App) -> None:
    seen: list[tuple[str, str]] = []

    @app.function(id="flaky", trigger=ss.on_event("go"), retries=0)
    def flaky(ctx: ss.Context) -> int:
        if ctx.event.data.get("fail"):
            raise ss.NonRetriableError("boom")
        return 1

    @app.function(
        id="watch",
        trigger=[
            ss.on_event("stepstone/function.failed"),
            ss.on_event("stepstone/function.finished", if_="event.data.function_id == 'flaky'"),
        ],
    )
    def watch(ctx: ss.Context) -> None:
        seen.append((ctx.event.name, ctx.event.data.get("status", "-")))

    app.start()
    send_and_wait(app, ss.Event("go"))
    send_and_wait(app, ss.Event("go", {"fail": True}))
    deadline = time.monotonic() + 10
    while len([r for r in app.runs.list(function_id="watch") if r.ended]) < 3:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert sorted(seen) == [
        ("stepstone/function.failed", "-"),
        ("stepstone/function.finished", "completed"),
        ("stepstone/function.finished", "failed"),
    ]


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_waits_and_invoke_from_both_handler_kinds(app: ss.App, mode: str) -> None:
    @app.function(id="echo", trigger=ss.on_event("never"))
    def echo(ctx: ss.Context) -> Any:
        return ctx.event.data

    if mode == "async":

        @app.function(id="h", trigger=ss.on_event("h"))
        async def h(ctx: ss.Context) -> Any:
            ids = await ctx.step.send_event("s", ss.Event("side", {"x": 1}))
            return [await ctx.step.invoke("i", function=echo, data={"v": 1}), len(ids)]
    else:

        @app.function(id="h", trigger=ss.on_event("h"))
        def h(ctx: ss.Context) -> Any:
            ids = ctx.step.send_event("s", ss.Event("side", {"x": 1}))
            return [ctx.step.invoke("i", function=echo, data={"v": 1}), len(ids)]

    app.start()
    assert send_and_wait(app, ss.Event("h")).output == [{"v": 1}, 1]


def _fail_if_asked(data: dict[str, Any], broken: dict[str, bool]) -> str:
    if data.get("fail") and broken["now"]:
        raise ss.NonRetriableError("asked to fail")
    return "ok"


def test_replay_and_rerun_respect_the_singleton_key(app: ss.App) -> None:
    """Issue 12 defect 7: replaying (or re-running) an ended run whose singleton
    key another active run holds would make two active runs for the key. They
    are refused, naming the holder; once the key is free, the replayed run holds
    it (a new event for the key is skipped)."""
    broken = {"now": True}

    @app.function(
        id="one", trigger=ss.on_event("one"), singleton=ss.Singleton(key="event.data.u", mode="skip")
    )
    async def one(ctx: ss.Context) -> None:
        await ctx.step.run("go", _fail_if_asked, ctx.event.data, broken)
        await ctx.step.sleep("z", "1h")

    app.start()
    failed = app.runs.wait(start(app, ss.Event("one", {"u": 1, "fail": True})), timeout="10s")
    assert failed.status == "failed"
    holder = start(app, ss.Event("one", {"u": 1}))
    wait_status(app, holder, "sleeping")

    with pytest.raises(ss.InvalidStateError, match=holder):
        app.runs.replay(failed.id)
    with pytest.raises(ss.InvalidStateError, match=holder):
        app.runs.rerun_from(failed.id, "go")
    assert app.runs.replay_many(function_id="one") == 0
    active = [r.id for r in app.runs.list(function_id="one") if not r.ended]
    assert active == [holder] and app.runs.get(failed.id).status == "failed"

    app.runs.cancel(holder)
    wait_status(app, holder, "cancelled")
    broken["now"] = False  # the fix is deployed: the replayed run goes on to its sleep
    app.runs.replay(failed.id)
    wait_status(app, failed.id, "sleeping")
    late = start(app, ss.Event("one", {"u": 1}))
    assert app.runs.get(late).status == "skipped"  # the replayed run holds the key


def test_a_rerun_keeps_the_flow_control_of_its_run(app: ss.App, db_url: str) -> None:
    """``rerun_from`` starts a new run of the same event: it is placed in the
    queue like the original (partition and concurrency key), so it obeys the
    function's concurrency limit rather than bypassing it."""

    @app.function(
        id="limited", trigger=ss.on_event("go"), concurrency=ss.Concurrency(limit=1, key="event.data.t")
    )
    async def limited(ctx: ss.Context) -> str:
        return str(await ctx.step.run("s", lambda: "done"))

    app.start()
    original = app.runs.wait(start(app, ss.Event("go", {"t": "acme"})), timeout="10s")
    assert original.status == "completed"
    app.stop()
    rerun = app.runs.rerun_from(original.id, "s")
    placement = query(db_url, f"SELECT partition_key, ckey1, limit1 FROM queue WHERE run_id = '{rerun}'")
    [(partition, ckey, limit)] = placement
    assert ckey is not None and "acme" in ckey and limit == 1 and partition.endswith(ckey)
