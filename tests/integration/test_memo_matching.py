"""A memo is returned only to a call like the one that recorded it (issue 12,
defect 12).

Step ids are matched by id; a repeated id gets ``id:1``, ``id:2``... in call
order. A deploy that inserts one more call of a repeated id shifts every
suffix: without a check, each call would get the value its predecessor
recorded. Memos record their kind and what was called (a fingerprint); a call
that does not match the memo its id points at fails the run with
``NondeterminismError`` instead of receiving another step's value.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import stepstone as ss
from stepstone.testing import TestEnv

from ..polling import wait_for


def get_org() -> str:
    return "org-value"


def get_plan() -> str:
    return "plan-value"


def get_user() -> str:
    return "user-value"


def _across_a_deploy(app: ss.App, handler: Callable[[ss.Context, bool], Any]) -> ss.Run:
    """Run ``handler`` (v1) until it waits for "resume", "deploy" v2, resume it."""
    deployed = {"v2": False}

    @app.function(id="f", trigger=ss.on_event("go"), retries=0)
    def f(ctx: ss.Context) -> Any:
        return handler(ctx, deployed["v2"])

    app.start()
    [event_id] = app.send(ss.Event("go"))
    [run] = app.runs.list(event_id=event_id)
    wait_for(lambda: app.runs.get(run.id).status == "waiting", 10, "the run to wait")
    deployed["v2"] = True
    app.send(ss.Event("resume"))
    return app.runs.wait(run.id, timeout="10s")


def test_an_inserted_repeated_id_never_hands_a_call_another_steps_memo(app: ss.App) -> None:
    executed: list[str] = []

    def tracked(fn: Callable[[], str]) -> Callable[[], str]:
        def call() -> str:
            executed.append(fn.__name__)
            return fn()

        call.__qualname__ = fn.__qualname__
        return call

    org, plan, user = tracked(get_org), tracked(get_plan), tracked(get_user)

    def handler(ctx: ss.Context, v2: bool) -> dict[str, str]:
        got = {}
        if v2:
            got["org"] = ctx.step.run("fetch", org)  # the deploy inserts this call first
        got["plan"] = ctx.step.run("fetch", plan)
        got["user"] = ctx.step.run("fetch", user)
        ctx.step.wait_for_event("pause", event="resume", timeout="1h")
        return got

    run = _across_a_deploy(app, handler)
    # No call got a value another function produced; the run stopped loudly.
    assert run.status == "failed", run.output
    assert run.error is not None and run.error.type == "NondeterminismError"
    assert "fetch" in run.error.message and "get_org" in run.error.message
    assert executed == ["get_plan", "get_user"]  # nothing executed after the mismatch
    warnings = [s for s in app.runs.trace(run.id) if s.kind == "warning"]
    assert [w.name for w in warnings] == ["nondeterminism"]


def test_a_step_whose_kind_changed_is_not_handed_the_old_memo(app: ss.App) -> None:

    def handler(ctx: ss.Context, v2: bool) -> Any:
        if v2:  # the deploy turned a step.run into a send_event under the same id
            ctx.step.send_event("notify", ss.Event("notified", {}))
        else:
            ctx.step.run("notify", lambda: {"sent": 1})
        ctx.step.wait_for_event("pause", event="resume", timeout="1h")
        return "done"

    run = _across_a_deploy(app, handler)
    assert not app.runs.list(function_id=None, limit=10, status="completed")
    assert run.status == "failed"
    assert run.error is not None and run.error.type == "NondeterminismError"
    assert "'notify'" in run.error.message and "run" in run.error.message and "send" in run.error.message


def test_a_step_function_fixed_in_place_keeps_its_memo(app: ss.App) -> None:
    """Replaying after a bug fix is the point: a function fixed in place (same
    name, new body) keeps the memo it recorded."""
    calls: list[str] = []
    version = {"v": "v1"}

    def charge() -> str:
        calls.append(version["v"])
        return f"charged by {version['v']}"

    def handler(ctx: ss.Context, v2: bool) -> str:
        version["v"] = "v2" if v2 else "v1"  # the body "changes" with the deploy
        value: str = ctx.step.run("charge", charge)
        ctx.step.wait_for_event("pause", event="resume", timeout="1h")
        return value

    run = _across_a_deploy(app, handler)
    assert run.status == "completed" and run.output == "charged by v1"
    assert calls == ["v1"]


def test_a_function_renamed_under_a_live_run_fails_it_loudly(app: ss.App) -> None:
    calls: list[str] = []

    def charge() -> str:
        calls.append("charge")
        return "charged"

    def charge_card() -> str:
        calls.append("charge_card")
        return "charged again"

    def handler(ctx: ss.Context, v2: bool) -> str:
        value: str = ctx.step.run("charge", charge_card if v2 else charge)
        ctx.step.wait_for_event("pause", event="resume", timeout="1h")
        return value

    run = _across_a_deploy(app, handler)
    assert run.status == "failed" and run.error is not None
    assert run.error.type == "NondeterminismError"
    assert "charge_card" in run.error.message and "renamed" in run.error.message
    assert calls == ["charge"]


def test_steps_record_their_kind_and_the_order_they_were_reached(app: ss.App) -> None:
    @app.function(id="g", trigger=ss.on_event("go"))
    async def g(ctx: ss.Context) -> None:
        async def slow() -> str:
            await asyncio.sleep(0.05)
            return "x"

        # reached in call order a, b; b completes before a does
        await ctx.step.parallel(lambda: ctx.step.run("a", slow), lambda: ctx.step.run("b", lambda: "y"))
        await ctx.step.send_event("s", ss.Event("sent", {}))

    app.start()
    [event_id] = app.send(ss.Event("go"))
    [run] = app.runs.list(event_id=event_id)
    run = app.runs.wait(run.id, timeout="10s")
    assert run.status == "completed", run.error
    kinds = {s.id: s.kind for s in run.steps}
    assert kinds["a"] == kinds["b"] == "run" and kinds["s"] == "send"
    assert [s.id for s in run.steps].index("a") < [s.id for s in run.steps].index("b")


# -- the class: any deploy between two invocations ----------------------------------------
# A program is a list of step calls drawn from a small pool of ids, so repeated
# ids, insertions, removals, reorders and kind changes all occur. Each step
# function returns its own name, so a value handed to the wrong call shows.

Call = tuple[str, str, str]  # (kind, step id, function name)
TAGS = ("f1", "f2", "f3")
calls = st.one_of(
    st.tuples(st.just("run"), st.sampled_from(["a", "b"]), st.sampled_from(TAGS)),
    st.tuples(st.sampled_from(["send", "sleep"]), st.sampled_from(["a", "b"]), st.just("")),
)


def _tagged(tag: str) -> Callable[[], str]:
    def fn() -> str:
        return tag

    fn.__qualname__ = tag
    return fn


STEP_FUNCTIONS = {tag: _tagged(tag) for tag in TAGS}


def _perform(ctx: ss.Context, program: list[Call], seen: list[tuple[Call, Any]]) -> None:
    for call in program:
        kind, step_id, tag = call
        if kind == "run":
            seen.append((call, ctx.step.run(step_id, STEP_FUNCTIONS[tag])))
        elif kind == "send":
            seen.append((call, ctx.step.send_event(step_id, ss.Event("noted", {}))))
        else:
            seen.append((call, ctx.step.sleep(step_id, 0)))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(v1=st.lists(calls, max_size=5), v2=st.lists(calls, max_size=5))
def test_no_deploy_hands_a_call_a_value_another_call_recorded(
    tmp_path_factory: pytest.TempPathFactory, v1: list[Call], v2: list[Call]
) -> None:
    app = ss.App("memo-class", database_url=f"sqlite:///{tmp_path_factory.mktemp('db')}/s.db")
    program = {"now": v1}
    seen: list[tuple[Call, Any]] = []

    @app.function(id="p", trigger=ss.on_event("go"), retries=0)
    def p(ctx: ss.Context) -> str:
        _perform(ctx, program["now"], seen)
        ctx.step.wait_for_event("pause", event="resume", timeout="1h")
        return "done"

    with TestEnv(app) as env:
        [run] = env.send(ss.Event("go"))
        program["now"] = v2
        env.send(ss.Event("resume"))
        run = env.wait(run.id)
    app.close()
    for (kind, _step_id, tag), value in seen:
        if kind == "run":
            assert value == tag  # executed, or the memo of the same function
        elif kind == "send":
            assert isinstance(value, list) and len(value) == 1
        else:
            assert value is None
    if run.status == "failed":
        assert run.error is not None and run.error.type == "NondeterminismError", run.error
    else:
        assert run.status == "completed"
    if v1 == v2:
        assert run.status == "completed"  # an unchanged program always replays
