"""Step timeouts (issue 14, point 1): an attempt past its timeout fails with
``StepTimeoutError`` and is retried like any error; an async step is
cancelled, a sync step's thread abandoned (its late result never committed,
the abandoned threads bounded per worker); a timeout meets a cancel."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest

import stepstone as ss
from stepstone.testing import TestEnv

from ..conftest import FAST, query, run_of, send_and_wait
from ..polling import wait_for

LATE = "late-result-marker-5b1e"


def _worker(app: ss.App) -> Any:
    [worker] = app._local_workers
    return worker


def test_an_async_step_past_its_timeout_is_cancelled_and_retried(app: ss.App) -> None:
    cancelled = threading.Event()
    attempts: list[int] = []

    async def call_provider() -> str:
        attempts.append(len(attempts))
        if len(attempts) == 1:
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled.set()
                raise
        return "charged"

    @app.function(id="f", trigger=ss.on_event("go"), backoff=FAST)
    async def f(ctx: ss.Context) -> str:
        return str(await ctx.step.run("charge", call_provider, timeout="200ms"))

    app.start()
    run = send_and_wait(app, ss.Event("go"))
    assert (run.status, run.output) == ("completed", "charged")
    assert cancelled.is_set() and attempts == [0, 1]
    assert run.steps[0].attempts == 2
    [timed_out] = [s for s in app.runs.trace(run.id) if s.kind == "step" and s.status == "retrying"]
    assert timed_out.name == "charge" and timed_out.attempt == 1  # attempts count from 1
    assert timed_out.error is not None and timed_out.error.type == "StepTimeoutError"
    assert "200ms" not in timed_out.error.message and "0.2s" in timed_out.error.message


def test_a_sync_steps_late_result_is_never_committed(app: ss.App, db_url: str) -> None:
    """The step times out for good (no retries): the run fails. When the
    abandoned thread returns at last, its result is dropped: had it been
    committed, the step would read completed with the marker as its output."""
    release = threading.Event()

    def hangs() -> str:
        release.wait(30)
        return LATE

    @app.function(id="f", trigger=ss.on_event("go"), step_timeout="300ms", retries=0)
    def f(ctx: ss.Context) -> str:
        return str(ctx.step.run("hangs", hangs))

    app.start(max_abandoned_threads=4)
    worker = _worker(app)
    run = send_and_wait(app, ss.Event("go"))
    assert run.status == "failed" and run.error is not None
    assert run.error.type == "StepTimeoutError"
    assert worker.abandoned.count == 1
    release.set()
    wait_for(lambda: worker.abandoned.count == 0, 10, "the abandoned thread to return")
    app.send(ss.Event("after"))  # one more commit through the same worker's store
    run = app.runs.get(run.id)
    assert run.status == "failed" and run.steps[0].status == "failed" and run.steps[0].output is None
    for table in ("steps", "spans", "runs", "events"):
        assert LATE not in repr(query(db_url, f"SELECT * FROM {table}")), table


def test_a_late_result_never_replaces_the_retry_that_completed(app: ss.App) -> None:
    release = threading.Event()
    calls: list[int] = []

    def slow_then_fast() -> str:
        calls.append(len(calls))
        if len(calls) == 1:
            release.wait(30)
            return LATE
        return "second attempt"

    @app.function(id="f", trigger=ss.on_event("go"), backoff=FAST)
    async def f(ctx: ss.Context) -> str:
        return str(await ctx.step.run("s", slow_then_fast, timeout="200ms"))

    app.start()
    worker = _worker(app)
    run = send_and_wait(app, ss.Event("go"))
    assert (run.status, run.output, run.steps[0].output) == ("completed", "second attempt", "second attempt")
    release.set()
    wait_for(lambda: worker.abandoned.count == 0, 10, "the abandoned thread to return")
    run = app.runs.get(run.id)
    assert (run.output, run.steps[0].output) == ("second attempt", "second attempt")


def test_abandoned_threads_at_their_bound_stop_leasing_and_report_not_ready(app: ss.App) -> None:
    release = threading.Event()

    @app.function(id="hung", trigger=ss.on_event("hang"), step_timeout="200ms", retries=0)
    def hung(ctx: ss.Context) -> None:
        ctx.step.run("hangs", lambda: release.wait(30))

    @app.function(id="quick", trigger=ss.on_event("quick"))
    def quick(ctx: ss.Context) -> str:
        return str(ctx.step.run("s", lambda: "done"))

    app.start(max_abandoned_threads=1)
    worker = _worker(app)
    assert send_and_wait(app, ss.Event("hang")).status == "failed"
    health = worker.health()
    assert health["ready"] is False and "abandoned" in health["reason"]
    assert (health["abandoned_threads"], health["max_abandoned_threads"]) == (1, 1)
    [event_id] = app.send(ss.Event("quick"))
    run = run_of(app, event_id)
    with pytest.raises(ss.RunTimeoutError):
        app.runs.wait(run.id, timeout="500ms")  # not leased while the bound is reached
    assert app.runs.get(run.id).status == "queued"
    release.set()
    assert app.runs.wait(run.id, timeout="10s").output == "done"  # leasing resumed
    wait_for(lambda: worker.health()["ready"], 10, "the worker to report ready again")


def test_a_timeout_meeting_a_cancel_ends_the_run_cancelled(app: ss.App) -> None:
    """A cancel requested while the step hangs: the timed-out attempt is
    checkpointed and the park that follows honours the cancel (no retry runs)."""
    started, release = threading.Event(), threading.Event()
    calls: list[int] = []

    def hangs() -> None:
        calls.append(1)
        started.set()
        release.wait(30)

    # A back-off longer than any delay under load: the cancel lands before a retry could start
    @app.function(id="f", trigger=ss.on_event("go"), backoff=ss.Backoff(initial="5s", jitter=0), retries=3)
    def f(ctx: ss.Context) -> None:
        ctx.step.run("hangs", hangs, timeout="500ms")

    app.start()
    [event_id] = app.send(ss.Event("go"))
    run = run_of(app, event_id)
    assert started.wait(10)
    app.runs.cancel(run.id)
    ended = app.runs.wait(run.id, timeout="10s")
    assert ended.status == "cancelled" and calls == [1]
    assert ended.steps[0].attempts == 1
    release.set()


def test_step_timeouts_on_the_virtual_clock_retry_after_a_long_back_off(
    make_app: Callable[..., ss.App],
) -> None:
    """The timeout is the attempt's real running time; the back-off after it is
    the app's clock, so under ``TestEnv`` an hour's back-off passes at once."""
    app = make_app()
    calls: list[int] = []

    async def slow_once() -> int:
        calls.append(1)
        if len(calls) == 1:
            await asyncio.sleep(30)
        return len(calls)

    @app.function(id="f", trigger=ss.on_event("go"), step_timeout="100ms", backoff=ss.Backoff(initial="1h"))
    async def f(ctx: ss.Context) -> int:
        return int(await ctx.step.run("s", slow_once))

    with TestEnv(app) as env:
        [run] = env.send(ss.Event("go"))
        done = env.wait(run.id)
        assert (done.status, done.output, calls) == ("completed", 2, [1, 1])


def test_invalid_timeouts_name_their_field(app: ss.App) -> None:
    with pytest.raises(ss.ConfigError, match="step_timeout"):
        app.function(id="bad", trigger=ss.on_event("x"), step_timeout="soon")(lambda ctx: None)
    with pytest.raises(ss.ConfigError, match="step_timeout"):
        app.function(id="zero", trigger=ss.on_event("x"), step_timeout=0)(lambda ctx: None)

    @app.function(id="f", trigger=ss.on_event("go"), backoff=FAST)
    def f(ctx: ss.Context) -> None:
        ctx.step.run("s", lambda: None, timeout="later")

    app.start()
    run = send_and_wait(app, ss.Event("go"))
    assert run.status == "failed" and run.error is not None and "timeout" in run.error.message


def test_a_run_failed_by_a_timeout_replays_once_the_provider_answers(app: ss.App) -> None:
    slow = threading.Event()
    slow.set()
    before: list[int] = []

    async def provider() -> str:
        if slow.is_set():
            await asyncio.sleep(30)
        return "answered"

    def keep() -> str:
        before.append(1)
        return "kept"

    @app.function(id="f", trigger=ss.on_event("go"), step_timeout="200ms", retries=0)
    async def f(ctx: ss.Context) -> list[str]:
        first = await ctx.step.run("before", keep)
        return [first, await ctx.step.run("provider", provider)]

    app.start()
    run = send_and_wait(app, ss.Event("go"))
    assert run.status == "failed" and run.error is not None and run.error.type == "StepTimeoutError"
    slow.clear()  # the provider answers again
    app.runs.replay(run.id)
    done = app.runs.wait(run.id, timeout="10s")
    assert (done.status, done.output) == ("completed", ["kept", "answered"])
    assert before == [1]  # the completed step did not run again
