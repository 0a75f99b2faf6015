"""Signals (issue 14, point 2): ``app.runs.signal`` and ``step.wait_for_signal``
on both stores, with real workers: buffered before the wait (queued, sleeping,
waiting on something else), after it began, in order, by name, timeouts,
ended runs, cancel, replay and re-run, encryption, and signals racing parks."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Callable
from typing import Any

import pytest

import stepstone as ss
from stepstone.store import faults
from stepstone.store.rows import SignalRow
from stepstone.testing import TestEnv

from ..conftest import query
from ..faultrun import Driver, virtual_app
from ..polling import wait_for
from .test_ambiguous_commits import ended
from .test_orchestration import start, wait_status


def signals_of(app: ss.App, run_id: str) -> list[SignalRow]:
    return app.store.read_sync(lambda tx: tx.run_signals(run_id))


def waiting_on(app: ss.App, run_id: str, step_id: str) -> None:
    def parked() -> bool:
        run = app.runs.get(run_id)
        return run.status == "waiting" and any(s.id == step_id and s.status == "waiting" for s in run.steps)

    wait_for(parked, 10, f"run {run_id} parked on {step_id!r}")


def test_a_signal_sent_while_the_run_is_queued_is_received_when_the_wait_begins(app: ss.App) -> None:
    @app.function(id="approve", trigger=ss.on_event("order"))
    async def approve(ctx: ss.Context) -> Any:
        await ctx.step.run("prepare", lambda: "ready")
        return await ctx.step.wait_for_signal("approval", "approved", timeout="20s")

    run_id = start(app, ss.Event("order"))  # no worker yet: the run is queued
    assert app.runs.get(run_id).status == "queued"
    signal_id = app.runs.signal(run_id, "approved", {"by": "ana"})
    app.start()
    run = app.runs.wait(run_id)
    assert run.status == "completed" and run.output == {"by": "ana"}
    [signal] = signals_of(app, run_id)
    assert (signal.id, signal.consumed_by) == (signal_id, "approval")
    trace = [(s.kind, s.name, s.status) for s in app.runs.trace(run_id) if s.kind == "signal"]
    assert ("signal", "approved", "sent") in trace
    assert ("signal", "approved", "consumed") in trace
    assert ("signal", "approval", "completed") in trace  # the wait step itself


def test_a_signal_sent_while_sleeping_or_after_the_wait_began_is_received(app: ss.App) -> None:
    @app.function(id="flow", trigger=ss.on_event("go"))
    def flow(ctx: ss.Context) -> Any:  # a plain def handler: the sync face
        ctx.step.sleep("nap", "300ms")
        first = ctx.step.wait_for_signal("first", "s", "20s")
        second = ctx.step.wait_for_signal("second", "s", "20s")
        return [first, second]

    app.start()
    run_id = start(app, ss.Event("go"))
    wait_status(app, run_id, "sleeping")
    app.runs.signal(run_id, "s", 1)  # while sleeping
    waiting_on(app, run_id, "second")
    app.runs.signal(run_id, "s", 2)  # after the wait began
    assert app.runs.wait(run_id).output == [1, 2]


def test_two_signals_go_to_two_waits_in_order_and_other_names_stay_buffered(app: ss.App) -> None:
    @app.function(id="pair", trigger=ss.on_event("go"))
    async def pair(ctx: ss.Context) -> Any:
        a = await ctx.step.wait_for_signal("a", "pick")
        b = await ctx.step.wait_for_signal("b", "pick")
        return [a, b]

    run_id = start(app, ss.Event("go"))
    app.runs.signal(run_id, "other", "not for these waits")
    app.runs.signal(run_id, "pick", "first")
    app.runs.signal(run_id, "pick", {"n": "second"})
    app.runs.signal(run_id, "pick", "third")
    app.start()
    assert app.runs.wait(run_id).output == ["first", {"n": "second"}]
    consumed = {s.name + ":" + s.data: s.consumed_by for s in signals_of(app, run_id)}
    assert consumed == {
        'other:"not for these waits"': None,
        'pick:"first"': "a",
        'pick:{"n":"second"}': "b",
        'pick:"third"': None,
    }


def test_a_timed_out_wait_returns_none_and_a_later_signal_waits_for_a_later_wait(app: ss.App) -> None:
    @app.function(id="late", trigger=ss.on_event("go"))
    async def late(ctx: ss.Context) -> Any:
        early = await ctx.step.wait_for_signal("early", "x", timeout="200ms")
        await ctx.step.wait_for_event("gate", event="gate", timeout="20s")
        return [early, await ctx.step.wait_for_signal("later", "x", timeout="20s")]

    app.start()
    run_id = start(app, ss.Event("go"))
    waiting_on(app, run_id, "gate")  # "early" timed out
    app.runs.signal(run_id, "x", "kept")  # while waiting for the gate event
    app.send(ss.Event("gate"))
    assert app.runs.wait(run_id).output == [None, "kept"]
    assert [s.consumed_by for s in signals_of(app, run_id)] == ["later"]


def test_signalling_an_ended_or_unknown_run_is_refused(app: ss.App) -> None:
    @app.function(id="quick", trigger=ss.on_event("go"))
    async def quick(ctx: ss.Context) -> str:
        return "done"

    app.start()
    run_id = start(app, ss.Event("go"))
    app.runs.wait(run_id)
    with pytest.raises(ss.InvalidStateError, match="completed"):
        app.runs.signal(run_id, "late", 1)
    with pytest.raises(ss.NotFoundError):
        app.runs.signal("no-such-run", "late", 1)
    with pytest.raises(ss.ConfigError, match="name"):
        app.runs.signal(run_id, "", 1)
    assert signals_of(app, run_id) == []


def test_cancelling_a_run_waiting_for_a_signal_ends_it_and_refuses_later_signals(
    app: ss.App, db_url: str
) -> None:
    @app.function(id="hold", trigger=ss.on_event("go"))
    async def hold(ctx: ss.Context) -> Any:
        return await ctx.step.wait_for_signal("w", "x")

    app.start()
    run_id = start(app, ss.Event("go"))
    waiting_on(app, run_id, "w")
    app.runs.cancel(run_id)
    assert app.runs.wait(run_id).status == "cancelled"
    assert query(db_url, f"SELECT count(*) FROM waits WHERE run_id = '{run_id}'") == [(0,)]
    with pytest.raises(ss.InvalidStateError):
        app.runs.signal(run_id, "x", 1)
    # Replayed, it waits again (a fresh wait), and a new signal reaches it.
    app.runs.replay(run_id)
    waiting_on(app, run_id, "w")
    app.runs.signal(run_id, "x", "after replay")
    assert app.runs.wait(run_id).output == "after replay"


def test_a_replayed_run_keeps_the_signal_its_wait_consumed(app: ss.App) -> None:
    broken = threading.Event()
    broken.set()

    def charge(approval: Any) -> Any:
        if broken.is_set():
            raise ss.NonRetriableError("provider down")
        return {"charged": approval}

    @app.function(id="pay", trigger=ss.on_event("go"), retries=0)
    async def pay(ctx: ss.Context) -> Any:
        approval = await ctx.step.wait_for_signal("approval", "ok")
        return await ctx.step.run("charge", charge, approval)

    app.start()
    run_id = start(app, ss.Event("go"))
    app.runs.signal(run_id, "ok", "v1")
    assert app.runs.wait(run_id).status == "failed"
    broken.clear()
    app.runs.replay(run_id)
    run = app.runs.wait(run_id)
    assert run.output == {"charged": "v1"}  # the memo, not a new signal
    [signal] = signals_of(app, run_id)
    assert signal.consumed_by == "approval"
    # A re-run from the wait is a new run with an empty mailbox: it waits anew.
    fork = app.runs.rerun_from(run_id, "approval")
    waiting_on(app, fork, "approval")
    app.runs.signal(fork, "ok", "v2")
    assert app.runs.wait(fork).output == {"charged": "v2"}
    assert [s.consumed_by for s in signals_of(app, run_id)] == ["approval"]  # the old run's, untouched


def test_encrypted_signal_data_never_reaches_the_store_in_plaintext(
    make_app: Callable[..., ss.App], db_url: str
) -> None:
    vault_key = ss.EncryptionMiddleware("a long random test secret")
    app = make_app(middleware=[vault_key])

    @app.function(id="vault", trigger=ss.on_event("go"))
    async def vault(ctx: ss.Context) -> Any:
        got = await ctx.step.wait_for_signal("w", "card")
        return got["encrypted"]["pan"][-4:]

    run_id = start(app, ss.Event("go"))
    app.runs.signal(run_id, "card", {"encrypted": {"pan": "4111-PLAINTEXT-1111"}, "kind": "visa"})
    app.start()
    assert vault_key.reveal(app.runs.wait(run_id).output, "output") == "1111"  # outputs are encrypted too
    stored = query(db_url, "SELECT data FROM signals") + query(db_url, "SELECT output FROM steps")
    assert stored and not any("PLAINTEXT" in str(row) for row in stored)


def test_signals_racing_the_waits_that_receive_them_are_never_lost(app: ss.App) -> None:
    """Signals sent at random moments around each run's check of its buffer and
    its park (real workers, real commits): each is received exactly once."""

    @app.function(id="race", trigger=ss.on_event("go"))
    async def race(ctx: ss.Context) -> Any:
        await ctx.step.run("before", lambda: None)
        got = [await ctx.step.wait_for_signal(f"w{i}", "s", timeout="30s") for i in range(2)]
        return got

    app.start(concurrency=8)
    runs = [start(app, ss.Event("go", {"i": i})) for i in range(24)]
    rng = random.Random(14)
    for n in range(2):
        for run_id in rng.sample(runs, len(runs)):
            app.runs.signal(run_id, "s", [run_id, n])
    for run_id in runs:
        run = app.runs.wait(run_id, timeout="30s")
        assert run.output == [[run_id, 0], [run_id, 1]], run
        assert [s.consumed_by for s in signals_of(app, run_id)] == ["w0", "w1"]


def test_on_the_virtual_clock_a_long_signal_timeout_passes_at_once(tmp_path: Any) -> None:
    app = ss.App("virtual", database_url=f"sqlite:///{tmp_path / 'v.db'}")

    @app.function(id="slow", trigger=ss.on_event("go"))
    async def slow(ctx: ss.Context) -> Any:
        first = await ctx.step.wait_for_signal("w1", "x", timeout="7d")
        return [first, await ctx.step.wait_for_signal("w2", "x", timeout="7d")]

    with TestEnv(app) as env:
        [run] = env.send(ss.Event("go"))
        env.runs.signal(run.id, "x", "now")
        assert env.wait(run.id).output == ["now", None]
    app.close()


RECEIVE_SITE = "journal(checkpoint+wait_for_signal.receive_signal)"


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_failed_or_ambiguous_receive_commit_consumes_one_signal_once(
    db_url: str, when: faults.When
) -> None:
    """The commit that takes a buffered signal fails before it commits (rolled
    back) or after (the client saw an error; its retry must take no second one)."""
    app = virtual_app(db_url)

    @app.function(id="once", trigger=ss.on_event("go"), retries=0)
    async def once(ctx: ss.Context) -> Any:
        got = await ctx.step.wait_for_signal("w", "s")
        return [got, await ctx.step.run("after", lambda: "x")]

    async def main() -> str:
        driver = Driver(app)
        [event_id] = await driver.send([ss.Event("go", {}, id="go-1")])
        [run] = await app.runs.list_async(event_id=event_id)
        await app.runs.signal_async(run.id, "s", "first")
        await app.runs.signal_async(run.id, "s", "second")
        with faults.inject(RECEIVE_SITE, when) as plan:
            await driver.settle(lambda: ended(app, run.id))
        assert plan.fired, plan.sites
        done = await app.runs.get_async(run.id)
        assert (done.status, done.output) == ("completed", ["first", "x"])
        return run.id

    try:
        run_id = asyncio.run(main())
        assert [s.consumed_by for s in signals_of(app, run_id)] == ["w", None]
    finally:
        app.close()


def test_parallel_waits_of_one_name_each_receive_one_signal_in_the_order_they_began(app: ss.App) -> None:
    @app.function(id="both", trigger=ss.on_event("go"))
    async def both(ctx: ss.Context) -> Any:
        first = ctx.step.wait_for_signal("first", "s", timeout="20s")
        second = ctx.step.wait_for_signal("second", "s", timeout="20s")
        return await asyncio.gather(first, second)

    app.start()
    run_id = start(app, ss.Event("go"))
    waiting_on(app, run_id, "first")
    waiting_on(app, run_id, "second")
    app.runs.signal(run_id, "s", 1)
    app.runs.signal(run_id, "s", 2)
    assert app.runs.wait(run_id).output == [1, 2]
    assert [s.consumed_by for s in signals_of(app, run_id)] == ["first", "second"]
