"""``@app.function(max_state=...)``: the sum of a run's stored step outputs.

The step whose output would pass the cap fails at once (``LimitExceededError``
is non-retriable: the same output will not shrink), naming the run's total and
the cap; the run fails with it. The total is what the ``steps`` table holds:
counted from the recorded outputs at each invocation (so a replay, a rerun and
a resume start from the right sum), including what other parties wrote (a
wait's event), after middleware (encrypted outputs are larger), and never a
failed attempt's error.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any

import pytest

import stepstone as ss
from stepstone.errors import StoreUnavailableError
from stepstone.store import faults
from tests.polling import wait_for

from ..conftest import FAST, query, run_of, send_and_wait
from ..usertables import create_table, inserter, rows


def text(size: int) -> str:
    """A value whose JSON encoding is exactly ``size`` bytes."""
    return "x" * (size - 2)


def totals(message: str) -> tuple[int, int]:
    """The run's total and the cap named by a LimitExceededError message."""
    match = re.search(r"stored state to (\d+) bytes .* max_state of (\d+) bytes", message)
    assert match, message
    return int(match.group(1)), int(match.group(2))


def stored(db_url: str, run_id: str) -> dict[str, int]:
    """Each step's stored output size, straight from the database."""
    rows = query(db_url, f"SELECT step_id, output FROM steps WHERE run_id = '{run_id}'")
    return {step_id: len(output.encode()) for step_id, output in rows if output is not None}


def test_the_step_past_max_state_fails_the_run_naming_its_total_and_the_cap(app: ss.App) -> None:
    calls: list[str] = []

    def produce(step_id: str) -> str:
        calls.append(step_id)
        return text(300)

    @app.function(id="f", trigger=ss.on_event("go"), max_state=1000, backoff=FAST)
    def f(ctx: ss.Context) -> None:
        for step_id in "abcd":
            ctx.step.run(step_id, produce, step_id)

    app.start()
    run = send_and_wait(app, ss.Event("go"))
    assert run.status == "failed" and run.error is not None
    assert run.error.type == "LimitExceededError"
    assert totals(run.error.message) == (1200, 1000)
    assert "'d'" in run.error.message
    steps = {s.id: s for s in run.steps}
    assert [steps[s].status for s in "abc"] == ["completed"] * 3
    assert steps["d"].status == "failed" and steps["d"].attempts == 1  # not retried
    assert calls == ["a", "b", "c", "d"]


def test_max_state_accepts_sizes_and_none_is_no_cap(app: ss.App) -> None:
    @app.function(id="small", trigger=ss.on_event("small"), max_state="1KB")
    def small(ctx: ss.Context) -> int:
        return len(ctx.step.run("big", lambda: text(2000)))

    @app.function(id="free", trigger=ss.on_event("free"), max_state=None)
    def free(ctx: ss.Context) -> int:
        return len(ctx.step.run("big", lambda: text(2000)))

    app.start()
    capped = send_and_wait(app, ss.Event("small"))
    assert capped.status == "failed" and capped.error is not None
    assert totals(capped.error.message) == (2000, 1024)
    assert send_and_wait(app, ss.Event("free")).output == 1998


def test_the_total_carries_across_invocations_a_replay_and_a_rerun(app: ss.App, db_url: str) -> None:
    sizes = {"a": 400, "b": 400, "c": 400, "d": 200}

    @app.function(id="f", trigger=ss.on_event("go"), max_state=1000, backoff=FAST)
    async def f(ctx: ss.Context) -> str:
        await ctx.step.run("a", lambda: text(sizes["a"]))
        await ctx.step.sleep("nap", "10ms")  # the rest runs in a later invocation
        await ctx.step.run("b", lambda: text(sizes["b"]))
        await ctx.step.run("c", lambda: text(sizes["c"]))
        await ctx.step.run("d", lambda: text(sizes["d"]))
        return "done"

    app.start()
    first = send_and_wait(app, ss.Event("go"))
    assert first.error is not None and totals(first.error.message) == (1200, 1000)  # c: 800 recorded

    # Replayed with a smaller c: a and b (800 bytes) stay recorded, so c fits
    # (900) and d (1100) does not: the total started from the recorded memos.
    sizes["c"] = 100
    app.runs.replay(first.id)
    replayed = app.runs.wait(first.id, timeout="10s")
    assert replayed.status == "failed" and replayed.error is not None
    assert totals(replayed.error.message) == (1100, 1000)
    assert sum(stored(db_url, first.id).values()) == 900

    # A rerun from b starts with a's memo (400): b, c fit (900), d does not.
    fork_id = app.runs.rerun_from(first.id, "b")
    fork = app.runs.wait(fork_id, timeout="10s")
    assert fork.error is not None and totals(fork.error.message) == (1100, 1000)
    assert stored(db_url, fork_id).keys() >= {"a", "b", "c"}


def test_a_waits_event_counts_toward_the_total(app: ss.App, db_url: str) -> None:
    @app.function(id="f", trigger=ss.on_event("go"), max_state=1000)
    async def f(ctx: ss.Context) -> None:
        await ctx.step.wait_for_event("reply", event="reply", timeout="1m")
        await ctx.step.run("after", lambda: text(500))

    app.start()
    [event_id] = app.send(ss.Event("go"))
    run_id = run_of(app, event_id).id
    wait_for(lambda: app.runs.get(run_id).status == "waiting", 10, "the run waits")
    app.send(ss.Event("reply", {"blob": text(600)}))
    run = app.runs.wait(run_id, timeout="10s")
    assert run.error is not None and run.error.type == "LimitExceededError"
    recorded = stored(db_url, run_id)["reply"]
    assert recorded > 600
    assert totals(run.error.message) == (recorded + 500, 1000)


def test_encrypted_outputs_count_as_stored(make_app: Callable[..., ss.App], db_url: str) -> None:
    app = make_app(middleware=[ss.EncryptionMiddleware("a long random secret for tests")])

    @app.function(id="f", trigger=ss.on_event("go"), max_state=2000)
    async def f(ctx: ss.Context) -> None:
        await ctx.step.run("a", lambda: text(800))
        await ctx.step.run("b", lambda: text(800))  # 1600 in plain text, more encrypted

    app.start()
    run = send_and_wait(app, ss.Event("go"))
    assert run.status == "failed" and run.error is not None
    a = stored(db_url, run.id)["a"]
    assert a > 800
    total, cap = totals(run.error.message)
    assert cap == 2000 and total > 2000 and total - a > 800


def test_parallel_branches_cannot_both_pass_the_cap(app: ss.App) -> None:
    @app.function(id="f", trigger=ss.on_event("go"), max_state=1000)
    async def f(ctx: ss.Context) -> None:
        async def produce() -> str:
            await asyncio.sleep(0.01)
            return text(600)

        await ctx.step.parallel(lambda: ctx.step.run("left", produce), lambda: ctx.step.run("right", produce))

    app.start()
    run = send_and_wait(app, ss.Event("go"))
    assert run.status == "failed" and run.error is not None
    assert totals(run.error.message) == (1200, 1000)
    statuses = sorted(s.status for s in run.steps)
    assert statuses == ["completed", "failed"]


def test_failed_attempts_errors_are_not_state(app: ss.App) -> None:
    attempts: list[int] = []

    def flaky() -> str:
        attempts.append(1)
        if len(attempts) < 3:
            raise RuntimeError(text(2000))  # a large error, stored with the attempt
        return text(300)

    @app.function(id="f", trigger=ss.on_event("go"), max_state=1000, backoff=FAST)
    def f(ctx: ss.Context) -> int:
        return len(ctx.step.run("flaky", flaky)) + len(ctx.step.run("more", lambda: text(600)))

    app.start()
    run = send_and_wait(app, ss.Event("go"))
    assert run.status == "completed" and run.output == 298 + 598
    assert len(attempts) == 3


@pytest.mark.parametrize("bad", ["12XB", "", "-5MB", 0, 2.5, True])
def test_an_invalid_max_state_fails_at_decoration_naming_the_field(bad: Any) -> None:
    app = ss.App("caps", database_url="sqlite:///:memory:")
    with pytest.raises(ss.ConfigError, match="max_state"):

        @app.function(id="f", trigger=ss.on_event("go"), max_state=bad)
        def f(ctx: ss.Context) -> None: ...


def test_a_transaction_step_past_the_cap_rolls_its_writes_back(app: ss.App, db_url: str) -> None:
    create_table(db_url)
    insert = inserter(db_url)

    @app.function(id="f", trigger=ss.on_event("go"), max_state=1000, backoff=FAST)
    def f(ctx: ss.Context) -> None:
        ctx.step.run("a", lambda: text(600))

        def record(conn: Any) -> str:
            insert(conn, "u1")
            return text(600)

        ctx.step.transaction("record", record)

    app.start()
    run = send_and_wait(app, ss.Event("go"))
    assert run.status == "failed" and run.error is not None
    assert totals(run.error.message) == (1200, 1000)
    assert [s.status for s in run.steps if s.id == "record"] == ["failed"]
    assert rows(db_url) == []  # the user's write rolled back with the step


def test_parallel_transactions_cannot_both_pass_the_cap(app: ss.App, db_url: str) -> None:
    """Each transaction's check runs in the writer, before the event loop
    counts the other's committed output: the check must also charge it."""
    create_table(db_url)
    insert = inserter(db_url)

    def record(conn: Any, name: str) -> str:
        insert(conn, name)
        return text(600)

    @app.function(id="f", trigger=ss.on_event("go"), max_state=1000, backoff=FAST)
    async def f(ctx: ss.Context) -> None:
        await ctx.step.parallel(
            lambda: ctx.step.transaction("left", record, "l"),
            lambda: ctx.step.transaction("right", record, "r"),
        )

    app.start()
    run = send_and_wait(app, ss.Event("go"))
    assert run.status == "failed" and run.error is not None
    assert totals(run.error.message) == (1200, 1000)
    assert sorted(s.status for s in run.steps) == ["completed", "failed"]
    assert len(rows(db_url)) == 1  # the failed one's write rolled back


def test_a_transaction_commit_rolled_back_and_retried_counts_its_output_once(
    app: ss.App, db_url: str
) -> None:
    """The commit fails after the function ran and its output was charged:
    the retry runs it again, and the first charge is taken back."""
    create_table(db_url)
    insert = inserter(db_url)

    def record(conn: Any) -> str:
        insert(conn, "u1")
        return text(600)

    @app.function(id="f", trigger=ss.on_event("go"), max_state=1000, backoff=FAST)
    def f(ctx: ss.Context) -> int:
        ctx.step.transaction("record", record)
        return len(ctx.step.run("more", lambda: text(300)))

    def connection_dies() -> None:
        raise StoreUnavailableError("connection lost inside the transaction")

    with faults.inject("journal(checkpoint+transaction)", "inside", during=connection_dies) as plan:
        app.start()
        run = send_and_wait(app, ss.Event("go"))
    assert plan.fired
    assert run.status == "completed", run.error
    assert rows(db_url) == [("u1", 0)]


def test_a_deploy_lowering_max_state_fails_the_next_step_and_operators_still_act(
    make_app: Callable[..., ss.App],
) -> None:
    """A run recorded under a larger cap is over the new one: its next step
    fails naming both; an operator can still cancel a waiting one and
    replay a failed one (which fails again at the same step, clearly)."""

    def deploy(cap: int | None) -> ss.App:
        app = make_app("caps")

        @app.function(id="f", trigger=ss.on_event("go"), max_state=cap, backoff=FAST)
        async def f(ctx: ss.Context) -> None:
            await ctx.step.run("a", lambda: text(600))
            await ctx.step.wait_for_signal("w", "go", timeout="1h")
            await ctx.step.run("b", lambda: text(10))

        return app

    v1 = deploy(None)
    v1.start()
    runs = [run_of(v1, e).id for e in v1.send([ss.Event("go"), ss.Event("go")])]
    wait_for(lambda: all(v1.runs.get(r).status == "waiting" for r in runs), 10, "both wait")
    v1.stop()
    v2 = deploy(500)
    v2.start()
    signalled, cancelled = runs
    v2.runs.signal(signalled, "go", 1)
    failed = v2.runs.wait(signalled, timeout="10s")
    assert failed.status == "failed" and failed.error is not None
    assert failed.error.type == "LimitExceededError" and "'b'" in failed.error.message
    total, cap = totals(failed.error.message)
    assert cap == 500 and total > 600
    v2.runs.cancel(cancelled)
    assert v2.runs.wait(cancelled, timeout="10s").status == "cancelled"
    v2.runs.replay(signalled)
    again = v2.runs.wait(signalled, timeout="10s")
    assert again.status == "failed" and again.error is not None and "'b'" in again.error.message


def test_an_invoked_childs_output_counts_in_the_parent(app: ss.App, db_url: str) -> None:
    app.function(id="child", trigger=ss.on_event("child"))(lambda ctx: text(600))

    @app.function(id="parent", trigger=ss.on_event("go"), max_state=1000)
    async def parent(ctx: ss.Context) -> None:
        await ctx.step.invoke("call", function="child", data={})
        await ctx.step.run("after", lambda: text(500))

    app.start()
    run = send_and_wait(app, ss.Event("go"))
    assert run.status == "failed" and run.error is not None and "'after'" in run.error.message
    recorded = stored(db_url, run.id)["call"]
    assert recorded >= 600
    assert totals(run.error.message) == (recorded + 500, 1000)
