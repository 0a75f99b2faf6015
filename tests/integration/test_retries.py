"""Errors and retries: attempts, back-off, overrides, StepError, on_failure."""

from __future__ import annotations

import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import stepstone as ss
from stepstone.function import Backoff

from ..conftest import FAST, run_of, send_and_wait


def always_fails(counter: Counter[str], name: str) -> Any:
    def fn() -> None:
        counter[name] += 1
        raise RuntimeError(f"{name} broke")

    return fn


def test_default_is_five_attempts_per_step(app: ss.App) -> None:
    calls: Counter[str] = Counter()

    @app.function(id="f", trigger=ss.on_event("go"), backoff=FAST)
    def f(ctx: ss.Context) -> None:
        ctx.step.run("s", always_fails(calls, "s"))

    app.start()
    run = send_and_wait(app, ss.Event("go"))
    assert run.status == "failed"
    assert calls["s"] == 5
    assert run.steps[0].attempts == 5 and run.steps[0].status == "failed"
    assert run.error == ss.ErrorInfo("RuntimeError", "s broke", run.error.traceback if run.error else None)


def test_per_step_retries_override(app: ss.App) -> None:
    calls: Counter[str] = Counter()

    @app.function(id="f", trigger=ss.on_event("go"), retries=4, backoff=FAST)
    def f(ctx: ss.Context) -> None:
        ctx.step.run("once", always_fails(calls, "once"), retries=0)

    app.start()
    assert send_and_wait(app, ss.Event("go")).status == "failed"
    assert calls["once"] == 1


def test_non_retriable_error_fails_at_once(app: ss.App) -> None:
    calls: Counter[str] = Counter()

    def invalid() -> None:
        calls["invalid"] += 1
        raise ss.NonRetriableError("card declined")

    @app.function(id="f", trigger=ss.on_event("go"), backoff=FAST)
    def f(ctx: ss.Context) -> None:
        ctx.step.run("charge", invalid)

    app.start()
    run = send_and_wait(app, ss.Event("go"))
    assert (run.status, calls["invalid"]) == ("failed", 1)
    assert run.error is not None and run.error.message == "card declined"


def test_retry_after_error_sets_the_next_attempt_time(app: ss.App) -> None:
    times: list[float] = []

    def rate_limited() -> str:
        times.append(time.monotonic())
        if len(times) == 1:
            raise ss.RetryAfterError("429", retry_after="300ms")
        if len(times) == 2:
            raise ss.RetryAfterError("429", retry_after=datetime.now(UTC) + timedelta(milliseconds=200))
        return "ok"

    @app.function(id="f", trigger=ss.on_event("go"), backoff=Backoff(initial="1h", max="1h"))
    def f(ctx: ss.Context) -> str:
        return str(ctx.step.run("call", rate_limited))

    app.start()
    run = send_and_wait(app, ss.Event("go"))
    assert run.output == "ok"
    assert times[1] - times[0] >= 0.29  # not the 1h back-off, not immediately
    assert times[2] - times[1] >= 0.15


def test_backoff_grows_exponentially_with_jitter() -> None:
    backoff = ss.Backoff(initial="10s", factor=2, max="1h", jitter=0.2).validated()
    for failures, base in [(1, 10), (2, 20), (3, 40), (10, 3600)]:
        delays = [backoff.delay(failures) for _ in range(200)]
        assert all(base * 0.8 <= d <= base * 1.2 for d in delays)
        assert max(delays) - min(delays) > base * 0.1  # jitter spreads them


def test_backoff_delays_are_observed(app: ss.App) -> None:
    times: list[float] = []

    def flaky() -> str:
        times.append(time.monotonic())
        if len(times) < 3:
            raise RuntimeError("again")
        return "ok"

    @app.function(
        id="f", trigger=ss.on_event("go"), backoff=ss.Backoff(initial="100ms", factor=2, max="1s", jitter=0)
    )
    def f(ctx: ss.Context) -> str:
        return str(ctx.step.run("s", flaky))

    app.start()
    assert send_and_wait(app, ss.Event("go")).output == "ok"
    assert times[1] - times[0] >= 0.095
    assert times[2] - times[1] >= 0.195


def test_step_error_can_be_caught_to_compensate(app: ss.App) -> None:
    calls: Counter[str] = Counter()

    @app.function(id="f", trigger=ss.on_event("go"), retries=1, backoff=FAST)
    def f(ctx: ss.Context) -> dict[str, Any]:
        ctx.step.run("charge", lambda: calls.update(["charge"]) or "ch_1")
        try:
            ctx.step.run("provision", always_fails(calls, "provision"))
        except ss.StepError as err:
            ctx.step.run("refund", lambda: calls.update(["refund"]) or "refunded")
            return {"rolled_back": err.step_id, "type": err.error_type, "message": err.message}
        return {}

    app.start()
    run = send_and_wait(app, ss.Event("go"))
    assert run.status == "completed"
    assert run.output == {"rolled_back": "provision", "type": "RuntimeError", "message": "provision broke"}
    assert calls == {"charge": 1, "provision": 2, "refund": 1}


def test_uncaught_step_error_fails_the_run_with_the_step_error(app: ss.App) -> None:
    @app.function(id="f", trigger=ss.on_event("go"), retries=0)
    def f(ctx: ss.Context) -> None:
        ctx.step.run("boom", lambda: 1 / 0)

    app.start()
    run = send_and_wait(app, ss.Event("go"))
    assert run.status == "failed"
    assert run.error is not None and run.error.type == "ZeroDivisionError"
    assert run.attempt == 0  # the run itself did not retry: the step's retries were spent


def test_errors_outside_steps_retry_the_invocation(app: ss.App) -> None:
    calls: Counter[str] = Counter()

    @app.function(id="f", trigger=ss.on_event("go"), retries=2, backoff=FAST)
    def f(ctx: ss.Context) -> str:
        ctx.step.run("before", lambda: calls.update(["before"]))
        calls["handler"] += 1
        if calls["handler"] < 3:
            raise ValueError("bug between steps")
        return "done"

    app.start()
    run = send_and_wait(app, ss.Event("go"))
    assert run.output == "done"
    assert calls == {"before": 1, "handler": 3}


def test_errors_outside_steps_exhaust_retries(app: ss.App) -> None:
    calls: Counter[str] = Counter()

    @app.function(id="f", trigger=ss.on_event("go"), retries=2, backoff=FAST)
    def f(ctx: ss.Context) -> None:
        calls["handler"] += 1
        raise ValueError("always")

    app.start()
    run = send_and_wait(app, ss.Event("go"))
    assert run.status == "failed" and calls["handler"] == 3
    assert run.error is not None and run.error.type == "ValueError"


def test_on_failure_runs_once_with_original_event_and_error(app: ss.App) -> None:
    seen: list[dict[str, Any]] = []

    def notify_ops(ctx: ss.Context) -> None:
        info = ctx.step.run(
            "page",
            lambda: {
                "event": ctx.event.name,
                "data": ctx.event.data,
                "error": ctx.error.message if ctx.error else None,
                "failed_run": ctx.failed_run_id,
            },
        )
        seen.append(info)

    @app.function(id="f", trigger=ss.on_event("order.placed"), retries=1, backoff=FAST, on_failure=notify_ops)
    def f(ctx: ss.Context) -> None:
        ctx.step.run("ship", lambda: (_ for _ in ()).throw(RuntimeError("no stock")))

    app.start()
    [eid] = app.send(ss.Event("order.placed", {"order": 7}))
    failed = app.runs.wait(run_of(app, eid, "f").id)
    assert failed.status == "failed"
    handler_runs = app.runs.list(function_id="f-failure")
    assert len(handler_runs) == 1
    handled = app.runs.wait(handler_runs[0].id)
    assert handled.status == "completed"
    assert seen == [
        {"event": "order.placed", "data": {"order": 7}, "error": "no stock", "failed_run": failed.id}
    ]


def test_on_failure_not_run_for_successful_runs(app: ss.App) -> None:
    @app.function(id="ok", trigger=ss.on_event("go"), on_failure=lambda ctx: None)
    def ok(ctx: ss.Context) -> int:
        return 1

    app.start()
    assert send_and_wait(app, ss.Event("go")).status == "completed"
    assert app.runs.list(function_id="ok-failure") == []


@pytest.mark.parametrize("bad", [-1, 101, "3"])
def test_bad_step_retries_value_fails_clearly(app: ss.App, bad: Any) -> None:
    @app.function(id="f", trigger=ss.on_event("go"), retries=0)
    def f(ctx: ss.Context) -> None:
        ctx.step.run("s", lambda: 1, retries=bad)

    app.start()
    run = send_and_wait(app, ss.Event("go"))
    assert run.status == "failed" and run.error is not None and "retries" in run.error.message


def test_trace_has_every_attempt_in_order(app: ss.App) -> None:
    calls: Counter[str] = Counter()

    def flaky() -> str:
        calls["flaky"] += 1
        if calls["flaky"] < 3:
            raise RuntimeError(f"attempt {calls['flaky']}")
        return "ok"

    @app.function(id="f", trigger=ss.on_event("go"), backoff=FAST)
    def f(ctx: ss.Context) -> str:
        ctx.step.run("first", lambda: 1)
        return str(ctx.step.run("flaky", flaky))

    app.start()
    run = send_and_wait(app, ss.Event("go"))
    trace = app.runs.trace(run.id)
    assert [(s.kind, s.name, s.status, s.attempt) for s in trace] == [
        ("run", "f", "completed", 0),
        ("queued", "queue", "done", 0),
        ("step", "first", "completed", 1),
        ("step", "flaky", "retrying", 1),
        ("step", "flaky", "retrying", 2),
        ("step", "flaky", "completed", 3),
    ]
    assert trace[3].error is not None and trace[3].error.message == "attempt 1"
    assert trace[3].error.traceback and "RuntimeError: attempt 1" in trace[3].error.traceback
    assert all(s.ended_at is not None and s.ended_at >= s.started_at for s in trace)
