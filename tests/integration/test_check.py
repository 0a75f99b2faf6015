"""``app.check`` (issue 13): in-flight runs left by one ``App`` are replayed by
another holding changed code on the same database, on both stores. Every
reason of divergence, the compatible changes, parallel branches, ``patched``
across a deploy, and proof that a check executes and writes nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

import stepstone as ss

from ..conftest import run_of, table_rows
from ..polling import wait_for

Handler = Callable[[ss.Context], Any]
LEDGER: list[str] = []  # every step function that ran in this process, in order


def charge() -> dict[str, Any]:
    LEDGER.append("charge")
    return {"id": "ch_1", "amount": 5}


def email(payment: dict[str, Any]) -> str:
    LEDGER.append("email")
    return f"receipt for {payment.get('id')}"


def audit() -> str:
    LEDGER.append("audit")
    return "audited"


def provision() -> str:
    LEDGER.append("provision")
    return "provisioned"


async def v1(ctx: ss.Context) -> str:
    payment = await ctx.step.run("charge", charge)
    await ctx.step.run("email", email, payment)
    await ctx.step.sleep("cool-off", "1h")
    await ctx.step.run("provision", provision)
    return str(payment["id"])


def _deploy(make_app: Callable[..., ss.App], handler: Handler, **options: Any) -> ss.App:
    app = make_app("shop", **options)
    app.function(id="order", trigger=ss.on_event("order"), retries=0)(handler)
    return app


def _leave_sleeping_runs(make_app: Callable[..., ss.App], count: int = 2) -> list[str]:
    """Runs of v1, left sleeping at "cool-off" by a stopped worker."""
    app = _deploy(make_app, v1)
    app.start()
    ids = app.send([ss.Event("order", {"n": i}) for i in range(count)])
    runs = [run_of(app, event_id).id for event_id in ids]
    wait_for(lambda: all(app.runs.get(r).status == "sleeping" for r in runs), 10, "runs to sleep")
    app.stop()
    LEDGER.clear()
    return runs


def _check(make_app: Callable[..., ss.App], handler: Handler, **kwargs: Any) -> ss.CheckReport:
    report = _deploy(make_app, handler).check(**kwargs)
    assert LEDGER == [], "a check executed a step function"
    return report


def _only(
    report: ss.CheckReport, runs: list[str], checked: int | None = None
) -> tuple[str, str | None, list[str]]:
    """The one verdict every run of ``runs`` got, the only ones diverging: (reason, step_id, missing)."""
    assert report.runs_checked == (len(runs) if checked is None else checked) and not report.ok
    assert sorted(d.run_id for d in report.incompatible) == sorted(runs)
    verdicts = {(d.reason, d.step_id, tuple(d.missing)) for d in report.incompatible}
    assert len(verdicts) == 1, verdicts
    reason, step_id, missing = verdicts.pop()
    assert all(d.function_id == "order" and d.message for d in report.incompatible)
    return reason, step_id, list(missing)


# -- each reason of divergence ------------------------------------------------------------


def test_renaming_a_recorded_step_is_a_new_step(make_app: Callable[..., ss.App]) -> None:
    runs = _leave_sleeping_runs(make_app)

    async def renamed(ctx: ss.Context) -> str:
        payment = await ctx.step.run("charge-card", charge)
        await ctx.step.run("email", email, payment)
        await ctx.step.sleep("cool-off", "1h")
        return str(payment["id"])

    verdict = _only(_check(make_app, renamed), runs)
    assert verdict == ("new-step", "charge-card", ["charge", "email", "cool-off"])


def test_adding_a_step_before_recorded_ones_is_a_new_step(make_app: Callable[..., ss.App]) -> None:
    runs = _leave_sleeping_runs(make_app)

    async def audited(ctx: ss.Context) -> str:
        await ctx.step.run("audit", audit)
        return await v1(ctx)

    assert _only(_check(make_app, audited), runs) == ("new-step", "audit", ["charge", "email", "cool-off"])


def test_removing_a_recorded_step_leaves_it_missing(make_app: Callable[..., ss.App]) -> None:
    runs = _leave_sleeping_runs(make_app)

    async def no_email(ctx: ss.Context) -> str:
        payment = await ctx.step.run("charge", charge)
        await ctx.step.sleep("cool-off", "1h")
        return str(payment["id"])

    assert _only(_check(make_app, no_email), runs) == ("new-step", None, ["email"])


def test_moving_a_recorded_step_past_where_runs_are_parked_leaves_it_missing(
    make_app: Callable[..., ss.App],
) -> None:
    runs = _leave_sleeping_runs(make_app)

    async def email_later(ctx: ss.Context) -> str:
        payment = await ctx.step.run("charge", charge)
        await ctx.step.sleep("cool-off", "1h")
        await ctx.step.run("email", email, payment)
        return str(payment["id"])

    assert _only(_check(make_app, email_later), runs) == ("new-step", None, ["email"])


def test_a_recorded_step_reached_by_another_kind_of_call_is_kind_changed(
    make_app: Callable[..., ss.App],
) -> None:
    runs = _leave_sleeping_runs(make_app)

    async def charge_is_a_sleep(ctx: ss.Context) -> None:
        await ctx.step.sleep("charge", "1s")
        await ctx.step.run("email", email, {})

    reason, step_id, _ = _only(_check(make_app, charge_is_a_sleep), runs)
    assert (reason, step_id) == ("kind-changed", "charge")

    async def charge_calls_another_function(ctx: ss.Context) -> None:
        await ctx.step.run("charge", audit)

    report = _check(make_app, charge_calls_another_function)
    assert _only(report, runs)[:2] == ("kind-changed", "charge")
    assert "audit" in report.incompatible[0].message


def test_code_that_crashes_on_the_recorded_data_is_an_error(make_app: Callable[..., ss.App]) -> None:
    runs = _leave_sleeping_runs(make_app)

    async def reads_a_new_field(ctx: ss.Context) -> str:
        payment = await ctx.step.run("charge", charge)
        currency = payment["currency"]  # recorded payments have none
        await ctx.step.run("email", email, payment)
        await ctx.step.sleep("cool-off", "1h")
        return str(currency)

    report = _check(make_app, reads_a_new_field)
    assert _only(report, runs) == ("error", None, ["email", "cool-off"])
    assert "KeyError" in report.incompatible[0].message


# -- compatible changes ---------------------------------------------------------------------


def test_a_changed_step_body_and_steps_after_the_frontier_are_compatible(
    make_app: Callable[..., ss.App],
) -> None:
    runs = _leave_sleeping_runs(make_app, count=3)

    def fixed_charge() -> dict[str, Any]:  # a bug fix inside the step: same function name
        LEDGER.append("charge")
        return {"id": "ch_2", "amount": 5, "currency": "EUR"}

    fixed_charge.__qualname__ = "charge"

    async def v2(ctx: ss.Context) -> str:
        payment = await ctx.step.run("charge", fixed_charge)
        await ctx.step.run("email", email, payment)
        await ctx.step.sleep("cool-off", "1h")
        await ctx.step.run("audit", audit)  # new, after where every run stands
        await ctx.step.run("provision", provision)
        return str(payment["id"])

    report = _check(make_app, v2)
    assert report.ok and report.incompatible == []
    assert (report.runs_checked, report.functions) == (len(runs), {"order": len(runs)})


def test_recorded_steps_swapped_before_the_frontier_are_out_of_order(
    make_app: Callable[..., ss.App],
) -> None:
    runs = _leave_sleeping_runs(make_app)

    async def swapped(ctx: ss.Context) -> None:
        await ctx.step.run("email", email, {})
        await ctx.step.run("charge", charge)
        await ctx.step.sleep("cool-off", "1h")

    report = _check(make_app, swapped)
    assert _only(report, runs) == ("new-step", None, ["charge"])
    assert "only after 'email'" in report.incompatible[0].message

    def swapped_in_a_def_handler(ctx: ss.Context) -> None:
        ctx.step.run("email", email, {})
        ctx.step.run("charge", charge)
        ctx.step.sleep("cool-off", "1h")

    assert _only(_check(make_app, swapped_in_a_def_handler), runs) == ("new-step", None, ["charge"])


def test_queued_runs_without_history_and_ended_runs_are_not_checked(
    make_app: Callable[..., ss.App],
) -> None:
    app = _deploy(make_app, v1)
    app.send([ss.Event("order"), ss.Event("order")])  # queued: no worker
    report = app.check()
    assert (report.ok, report.runs_checked, report.functions) == (True, 0, {"order": 0})


def test_function_id_selects_the_runs_and_must_exist(make_app: Callable[..., ss.App]) -> None:
    runs = _leave_sleeping_runs(make_app)
    app = make_app("shop")
    app.function(id="order", trigger=ss.on_event("order"))(v1)
    app.function(id="other", trigger=ss.on_event("other"))(v1)
    assert app.check(function_id="other").runs_checked == 0
    assert app.check(function_id="order").runs_checked == len(runs)
    with pytest.raises(ss.ConfigError, match="function_id"):
        app.check(function_id="missing")


# -- parallel branches --------------------------------------------------------------------


def slow_a() -> str:
    LEDGER.append("a")
    return "a"


def fast_b() -> str:
    LEDGER.append("b")
    return "b"


async def branchy(ctx: ss.Context) -> list[Any]:
    async def left() -> list[str]:
        return [await ctx.step.run("a1", slow_a), await ctx.step.run("a2", slow_a)]

    async def right() -> list[str]:
        return [await ctx.step.run("b1", fast_b), await ctx.step.run("b2", fast_b)]

    both = await asyncio.gather(left(), right())
    await ctx.step.sleep("cool-off", "1h")
    return list(both)


def sync_branchy(ctx: ss.Context) -> list[Any]:
    def left() -> list[str]:
        return [ctx.step.run("a1", slow_a), ctx.step.run("a2", slow_a)]

    def right() -> list[str]:
        return [ctx.step.run("b1", fast_b), ctx.step.run("b2", fast_b)]

    both = ctx.step.parallel(left, right)
    ctx.step.sleep("cool-off", "1h")
    return list(both)


@pytest.mark.parametrize("handler", [branchy, sync_branchy], ids=["async", "sync"])
def test_parallel_branches_replay_in_any_interleaving(
    make_app: Callable[..., ss.App], handler: Handler
) -> None:
    app = _deploy(make_app, handler)
    app.start()
    ids = app.send([ss.Event("order") for _ in range(3)])
    runs = [run_of(app, event_id).id for event_id in ids]
    wait_for(lambda: all(app.runs.get(r).status == "sleeping" for r in runs), 10, "runs to sleep")
    app.stop()
    LEDGER.clear()
    if handler is branchy:  # recorded interleaved; a replay reaches a1, a2, then b1, b2
        assert [s.id for s in app.runs.get(runs[0]).steps][:2] == ["a1", "b1"]
    assert _check(make_app, handler).ok  # the same code: branches interleave freely

    if handler is branchy:

        async def one_branch_grows(ctx: ss.Context) -> None:
            async def left() -> None:
                await ctx.step.run("a1", slow_a)
                await ctx.step.run("a-new", slow_a)  # reached before recorded a2

            async def right() -> None:
                await ctx.step.run("b1", fast_b)
                await ctx.step.run("b2", fast_b)

            await asyncio.gather(left(), right())
            await ctx.step.sleep("cool-off", "1h")

        # b1 and b2 are still reached (no false report of them); a2 and the sleep are not.
        assert _only(_check(make_app, one_branch_grows), runs) == ("new-step", "a-new", ["a2", "cool-off"])


# -- read-only --------------------------------------------------------------------------------

TABLES = ("runs", "steps", "queue", "spans", "events", "run_events", "waits", "functions")


def test_a_check_executes_nothing_and_writes_nothing(db_url: str, make_app: Callable[..., ss.App]) -> None:
    runs = _leave_sleeping_runs(make_app)
    before = {table: sorted(table_rows(db_url, table), key=repr) for table in TABLES}

    async def diverging(ctx: ss.Context) -> None:
        await ctx.step.run("audit", audit)  # would run, and be recorded, by a worker
        await ctx.step.send_event("notify", ss.Event("notified"))
        await v1(ctx)

    report = _check(make_app, diverging)  # asserts the ledger stayed empty
    assert _only(report, runs)[0] == "new-step"
    assert _check(make_app, v1).ok
    after = {table: sorted(table_rows(db_url, table), key=repr) for table in TABLES}
    assert after == before


# -- patched ------------------------------------------------------------------------------------


def old_fulfil() -> str:
    LEDGER.append("old")
    return "old"


def new_fulfil() -> str:
    LEDGER.append("new")
    return "new"


def test_patched_is_false_for_runs_past_it_and_true_for_the_rest(make_app: Callable[..., ss.App]) -> None:
    async def before(ctx: ss.Context) -> list[Any]:
        got = [await ctx.step.run("old", old_fulfil)]
        await ctx.step.wait_for_event("resume", event="resume", timeout="1h")
        return got

    async def after(ctx: ss.Context) -> list[Any]:
        if await ctx.step.patched("new-fulfil"):
            got = await ctx.step.run("new", new_fulfil)
        else:
            got = await ctx.step.run("old", old_fulfil)
        await ctx.step.wait_for_event("resume", event="resume", timeout="1h")
        late = await ctx.step.patched("late-change")  # past every recorded step: True
        return [got, late]

    app = _deploy(make_app, before)
    app.start()
    [old_run] = [run_of(app, e).id for e in app.send([ss.Event("order")])]
    wait_for(lambda: app.runs.get(old_run).status == "waiting", 10, "the old run to wait")
    app.stop()
    LEDGER.clear()

    assert _check(make_app, after).ok  # False for the old run: its recorded "old" follows
    assert LEDGER == []
    deployed = _deploy(make_app, after)
    deployed.start()
    [new_run] = [run_of(deployed, e).id for e in deployed.send([ss.Event("order")])]
    wait_for(lambda: deployed.runs.get(new_run).status == "waiting", 10, "the new run to wait")
    assert LEDGER == ["new"]
    assert deployed.check().ok  # both runs fit the patched code

    async def patch_removed(ctx: ss.Context) -> list[Any]:  # the second deploy, too early
        got = await ctx.step.run("new", new_fulfil)
        await ctx.step.wait_for_event("resume", event="resume", timeout="1h")
        return [got, True]

    # The run from before the patch still needs the old branch; the new run's
    # recorded marker, no longer reached, is not reported missing.
    LEDGER.clear()
    assert _only(_check(make_app, patch_removed), [old_run], checked=2) == (
        "new-step",
        "new",
        ["old", "resume"],
    )
    deployed.send(ss.Event("resume"))
    assert deployed.runs.wait(old_run, timeout="10s").output == ["old", True]
    assert deployed.runs.wait(new_run, timeout="10s").output == ["new", True]
    assert LEDGER == []  # neither run re-executed a step
    markers = {s.id: s.kind for s in deployed.runs.get(new_run).steps if s.kind == "patch"}
    assert markers == {"new-fulfil": "patch", "late-change": "patch"}
    assert [s.id for s in deployed.runs.get(old_run).steps if s.kind == "patch"] == ["late-change"]


def test_patched_in_a_plain_def_handler(make_app: Callable[..., ss.App]) -> None:
    def before(ctx: ss.Context) -> str:
        got = str(ctx.step.run("old", old_fulfil))
        ctx.step.wait_for_event("resume", event="resume", timeout="1h")
        return got

    def after(ctx: ss.Context) -> str:
        patched = ctx.step.patched("new-fulfil")
        got = str(ctx.step.run("new", new_fulfil) if patched else ctx.step.run("old", old_fulfil))
        ctx.step.wait_for_event("resume", event="resume", timeout="1h")
        return got

    app = _deploy(make_app, before)
    app.start()
    [old_run] = [run_of(app, e).id for e in app.send([ss.Event("order")])]
    wait_for(lambda: app.runs.get(old_run).status == "waiting", 10, "the old run to wait")
    app.stop()
    LEDGER.clear()
    assert _check(make_app, after).ok
    deployed = _deploy(make_app, after)
    deployed.start()
    [new_run] = [run_of(deployed, e).id for e in deployed.send([ss.Event("order")])]
    wait_for(lambda: deployed.runs.get(new_run).status == "waiting", 10, "the new run to wait")
    deployed.send(ss.Event("resume"))
    assert deployed.runs.wait(old_run, timeout="10s").output == "old"
    assert deployed.runs.wait(new_run, timeout="10s").output == "new"
    assert LEDGER == ["new"]


def test_operator_actions_decide_which_runs_are_in_flight(make_app: Callable[..., ss.App]) -> None:
    kept, cancelled = _leave_sleeping_runs(make_app)
    operator = make_app("operator")
    operator.runs.cancel(cancelled)
    assert _check(make_app, v1).runs_checked == 1  # an ended run will not resume

    async def audited(ctx: ss.Context) -> None:
        await ctx.step.run("audit", audit)
        await v1(ctx)

    [found] = _check(make_app, audited).incompatible
    assert found.run_id == kept
    assert operator.runs.get(cancelled).status == "cancelled"
    operator.runs.replay(cancelled)  # due again, with its history: it will resume
    assert operator.runs.get(cancelled).status in ("queued", "running")
    report = _check(make_app, audited)
    assert sorted(d.run_id for d in report.incompatible) == sorted([kept, cancelled])


def flaky() -> str:
    LEDGER.append("flaky")
    raise RuntimeError("the provider is down")


async def retrying(ctx: ss.Context) -> None:
    await ctx.step.run("charge", charge)
    await ctx.step.run("flaky", flaky)


def test_a_run_backing_off_between_retries_is_checked_up_to_the_retrying_step(
    make_app: Callable[..., ss.App],
) -> None:
    app = make_app("shop")
    app.function(id="order", trigger=ss.on_event("order"), backoff=ss.Backoff(initial="1h"))(retrying)
    app.start()
    run_id = run_of(app, app.send(ss.Event("order"))[0]).id
    wait_for(
        lambda: [s.status for s in app.runs.get(run_id).steps] == ["completed", "retrying"], 10, "a retry"
    )
    app.stop()
    assert app.runs.get(run_id).status == "running"
    LEDGER.clear()
    assert _check(make_app, retrying).ok  # the retrying step is the frontier: not executed

    async def flaky_first(ctx: ss.Context) -> None:
        await ctx.step.run("flaky", flaky)
        await ctx.step.run("charge", charge)

    assert _only(_check(make_app, flaky_first), [run_id]) == ("new-step", None, ["charge"])
