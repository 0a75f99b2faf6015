"""The replay interpreter against the in-memory store, one invocation at a
time as a worker runs it (executor + interpreter + journal): memo replay, step
id claiming, nondeterminism detection, parallel steps, sleeps and waits."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

import stepstone as ss
from stepstone.store.rows import RunStatus, StepKind, StepStatus, WaitKind
from tests.fakes.world import World


@pytest.fixture
def world() -> World:
    return World()


def one_run(world: World, function_id: str, data: dict[str, Any] | None = None) -> str:
    [run_id] = world.send(function_id, data)
    return run_id


def memos(world: World, run_id: str) -> dict[str, Any]:
    return {s.step_id: s for s in world.store.read_sync(lambda tx: tx.get_steps(run_id))}


def output(world: World, run_id: str) -> Any:
    raw = world.run(run_id).output
    return None if raw is None else json.loads(raw)


def test_a_run_of_steps_completes_in_one_invocation(world: World) -> None:
    @world.handler("f")
    async def f(ctx: ss.Context) -> int:
        a = await ctx.step.run("a", lambda: 1)
        b = await ctx.step.run("b", lambda: a + 1)
        return int(b) * 10

    run_id = one_run(world, "f")
    outcome = world.execute()
    assert outcome is not None and outcome.status == RunStatus.COMPLETED
    assert output(world, run_id) == 20
    assert [s.status for s in memos(world, run_id).values()] == [StepStatus.COMPLETED] * 2


def test_memos_record_the_order_steps_were_first_reached(world: World) -> None:
    @world.handler("f")
    async def f(ctx: ss.Context) -> None:
        for name in ("z", "y", "x"):
            await ctx.step.run(name, lambda: None)

    run_id = one_run(world, "f")
    world.execute()
    assert sorted(memos(world, run_id).values(), key=lambda s: s.position)[0].step_id == "z"
    assert [m.position for m in memos(world, run_id).values()] == [0, 1, 2]


def test_a_repeated_step_id_gets_numbered_suffixes(world: World) -> None:
    @world.handler("f")
    async def f(ctx: ss.Context) -> list[int]:
        return [await ctx.step.run("tick", lambda i=i: i) for i in range(3)]

    run_id = one_run(world, "f")
    world.execute()
    assert set(memos(world, run_id)) == {"tick", "tick:1", "tick:2"}
    assert output(world, run_id) == [0, 1, 2]


def test_a_completed_step_is_not_executed_again_on_replay(world: World) -> None:
    calls: list[str] = []

    def record(name: str) -> str:
        calls.append(name)
        return name.upper()

    @world.handler("f")
    async def f(ctx: ss.Context) -> str:
        first = await ctx.step.run("a", record, "a")
        await ctx.step.sleep("nap", "1m")
        return str(first) + str(await ctx.step.run("b", record, "b"))

    run_id = one_run(world, "f")
    outcome = world.execute()
    assert outcome is not None and outcome.status == RunStatus.SLEEPING
    world.now += 60
    world.execute()
    assert calls == ["a", "b"]  # "a" ran once, its memo replayed
    assert output(world, run_id) == "AB"


def test_a_replayed_value_is_the_json_round_tripped_one(world: World) -> None:
    seen: list[Any] = []

    @world.handler("f")
    async def f(ctx: ss.Context) -> None:
        seen.append(await ctx.step.run("a", lambda: (1, 2)))
        await ctx.step.sleep("nap", "1s")

    one_run(world, "f")
    world.execute()
    world.now += 1
    world.execute()
    assert seen == [[1, 2], [1, 2]]  # a list on first execution too


def test_a_sleep_parks_the_run_until_its_wake_time(world: World) -> None:
    @world.handler("f")
    async def f(ctx: ss.Context) -> None:
        await ctx.step.sleep("nap", "10s")

    run_id = one_run(world, "f")
    outcome = world.execute()
    assert outcome is not None and outcome.wake_at == world.now + 10
    assert world.run(run_id).status == RunStatus.SLEEPING
    memo = memos(world, run_id)["nap"]
    assert (memo.kind, memo.status, memo.wake_at) == (StepKind.SLEEP, StepStatus.SLEEPING, world.now + 10)
    world.now += 9
    assert world.lease() == []


def test_a_woken_sleep_completes_and_the_run_goes_on(world: World) -> None:
    @world.handler("f")
    async def f(ctx: ss.Context) -> str:
        await ctx.step.sleep("nap", "10s")
        return "awake"

    run_id = one_run(world, "f")
    world.execute()
    world.now += 10
    outcome = world.execute()
    assert outcome is not None and outcome.status == RunStatus.COMPLETED
    assert output(world, run_id) == "awake"
    assert memos(world, run_id)["nap"].status == StepStatus.COMPLETED


def test_a_changed_function_behind_a_step_id_is_nondeterminism(world: World) -> None:
    version = {"v": 1}

    def fetch_user() -> str:
        return "u"

    def fetch_org() -> str:
        return "o"

    @world.handler("f", retries=0)
    async def f(ctx: ss.Context) -> None:
        await ctx.step.run("load", fetch_user if version["v"] == 1 else fetch_org)
        await ctx.step.sleep("nap", "1s")

    run_id = one_run(world, "f")
    world.execute()
    version["v"] = 2  # a deploy points the id at another call
    world.now += 1
    outcome = world.execute()
    assert outcome is not None and outcome.status == RunStatus.FAILED
    assert "NondeterminismError" in (world.run(run_id).error or "")


def test_a_step_turned_into_another_kind_is_nondeterminism(world: World) -> None:
    version = {"v": 1}

    @world.handler("f", retries=0)
    async def f(ctx: ss.Context) -> None:
        if version["v"] == 1:
            await ctx.step.run("s", lambda: 1)
        else:
            await ctx.step.send_event("s", ss.Event("x"))
        await ctx.step.sleep("nap", "1s")

    run_id = one_run(world, "f")
    world.execute()
    version["v"] = 2
    world.now += 1
    world.execute()
    assert world.run(run_id).status == RunStatus.FAILED
    assert "NondeterminismError" in (world.run(run_id).error or "")


def test_an_unchanged_handler_replays_without_nondeterminism(world: World) -> None:
    def fetch() -> str:
        return "v"

    @world.handler("f", retries=0)
    async def f(ctx: ss.Context) -> str:
        value = await ctx.step.run("load", fetch)
        await ctx.step.sleep("nap", "1s")
        return str(value)

    run_id = one_run(world, "f")
    world.execute()
    world.now += 1
    world.execute()
    assert world.run(run_id).status == RunStatus.COMPLETED


def test_a_failing_step_is_retried_after_a_backoff(world: World) -> None:
    attempts: list[int] = []

    def flaky() -> str:
        attempts.append(1)
        if len(attempts) < 2:
            raise ValueError("not yet")
        return "ok"

    @world.handler("f", retries=3, backoff=ss.Backoff(initial="1s", factor=1, max="1s", jitter=0))
    async def f(ctx: ss.Context) -> Any:
        return await ctx.step.run("flaky", flaky)

    run_id = one_run(world, "f")
    outcome = world.execute()
    assert outcome is not None and outcome.wake_at == world.now + 1
    world.now += 1
    world.execute()
    assert (len(attempts), output(world, run_id)) == (2, "ok")
    assert memos(world, run_id)["flaky"].attempts == 2


def test_a_step_out_of_retries_fails_the_run_and_stays_failed_on_replay(world: World) -> None:
    @world.handler("f", retries=0)
    async def f(ctx: ss.Context) -> None:
        await ctx.step.run("boom", lambda: 1 / 0)

    run_id = one_run(world, "f")
    outcome = world.execute()
    assert outcome is not None and outcome.status == RunStatus.FAILED
    assert memos(world, run_id)["boom"].status == StepStatus.FAILED
    assert "ZeroDivisionError" in (world.run(run_id).error or "")


def test_a_non_retriable_error_fails_at_once(world: World) -> None:
    def refuse() -> None:
        raise ss.NonRetriableError("no")

    @world.handler("f", retries=5)
    async def f(ctx: ss.Context) -> None:
        await ctx.step.run("s", refuse)

    run_id = one_run(world, "f")
    world.execute()
    assert world.run(run_id).status == RunStatus.FAILED


def test_parallel_steps_all_complete_with_their_own_memos(world: World) -> None:
    @world.handler("f")
    async def f(ctx: ss.Context) -> list[Any]:
        return list(await asyncio.gather(*(ctx.step.run(f"p{i}", lambda i=i: i * i) for i in range(4))))

    run_id = one_run(world, "f")
    world.execute()
    assert output(world, run_id) == [0, 1, 4, 9]
    assert set(memos(world, run_id)) == {"p0", "p1", "p2", "p3"}


def test_parallel_sleeps_park_until_the_earliest_and_resume_the_rest(world: World) -> None:
    @world.handler("f")
    async def f(ctx: ss.Context) -> str:
        await asyncio.gather(ctx.step.sleep("short", "5s"), ctx.step.sleep("long", "20s"))
        return "both"

    run_id = one_run(world, "f")
    outcome = world.execute()
    assert outcome is not None and outcome.wake_at == world.now + 5
    world.now += 5
    world.execute()
    assert world.run(run_id).status == RunStatus.SLEEPING
    world.now += 15
    world.execute()
    assert output(world, run_id) == "both"


def test_a_wait_parks_the_run_with_a_wait_row(world: World) -> None:
    @world.handler("f")
    async def f(ctx: ss.Context) -> Any:
        return await ctx.step.wait_for_event("pay", event="paid", timeout="1h")

    run_id = one_run(world, "f")
    outcome = world.execute()
    assert outcome is not None and outcome.status == RunStatus.WAITING
    [wait] = world.store.state.waits.values()
    assert (wait.run_id, wait.step_id, wait.kind, wait.event_name) == (run_id, "pay", WaitKind.EVENT, "paid")
    assert memos(world, run_id)["pay"].status == StepStatus.WAITING


def test_an_event_resolves_a_wait_and_wakes_the_run(world: World) -> None:
    @world.handler("f")
    async def f(ctx: ss.Context) -> Any:
        got = await ctx.step.wait_for_event("pay", event="paid", timeout="1h")
        return None if got is None else got.data

    run_id = one_run(world, "f")
    world.execute()
    world.send("paid", {"amount": 5})
    assert world.store.state.waits == {}
    world.execute()
    assert output(world, run_id) == {"amount": 5}


def test_a_wait_condition_picks_its_event(world: World) -> None:
    @world.handler("f")
    async def f(ctx: ss.Context) -> Any:
        got = await ctx.step.wait_for_event("pay", event="paid", if_="async.data.order == event.data.order")
        return None if got is None else got.data["order"]

    run_id = one_run(world, "f", {"order": 7})
    world.execute()
    world.send("paid", {"order": 8})
    assert world.run(run_id).status == RunStatus.WAITING
    world.send("paid", {"order": 7})
    world.execute()
    assert output(world, run_id) == 7


def test_a_wait_times_out_to_none(world: World) -> None:
    @world.handler("f")
    async def f(ctx: ss.Context) -> Any:
        return await ctx.step.wait_for_event("pay", event="paid", timeout="10s")

    run_id = one_run(world, "f")
    world.execute()
    world.now += 10
    world.execute()
    assert world.run(run_id).status == RunStatus.COMPLETED and output(world, run_id) is None
    assert world.store.state.waits == {}  # the timeout claimed the wait: a late event finds nothing


def test_an_event_before_the_wait_began_does_not_resolve_it(world: World) -> None:
    @world.handler("f")
    async def f(ctx: ss.Context) -> Any:
        return await ctx.step.wait_for_event("pay", event="paid", timeout="1h")

    run_id = one_run(world, "f")
    world.send("paid")
    world.execute()
    assert world.run(run_id).status == RunStatus.WAITING


def test_send_event_ingests_once_even_when_the_run_replays(world: World) -> None:
    world.function("listener", event="hello")

    @world.handler("f")
    async def f(ctx: ss.Context) -> None:
        await ctx.step.send_event("greet", ss.Event("hello"))
        await ctx.step.sleep("nap", "1s")

    one_run(world, "f")
    world.execute()
    world.now += 1
    world.execute()
    assert len(world.runs_of("listener")) == 1


def test_invoke_starts_the_child_once_and_returns_its_output(world: World) -> None:
    @world.handler("child", event="never")
    async def child(ctx: ss.Context) -> int:
        return int(ctx.event.data["n"]) * 2

    @world.handler("parent")
    async def parent(ctx: ss.Context) -> Any:
        return await ctx.step.invoke("call", function="child", data={"n": 21})

    run_id = one_run(world, "parent")
    world.execute()  # the parent parks, the child is queued
    [child_run] = world.runs_of("child")
    world.execute()  # the child
    assert world.run(child_run.id).status == RunStatus.COMPLETED
    world.execute()  # the parent, woken
    assert output(world, run_id) == 42
    assert len(world.runs_of("child")) == 1


def test_a_cancel_flagged_while_running_ends_the_run_at_its_next_step(world: World) -> None:
    flagged: list[bool] = []

    def flag() -> None:
        # an operator cancels while the step runs (the store is free between commits)
        flagged.append(world.store.transact_sync(lambda tx: tx.flag_cancel(run_id, world.now, None)))

    @world.handler("f")
    async def f(ctx: ss.Context) -> None:
        await ctx.step.run("a", flag)
        await ctx.step.run("b", lambda: None)

    run_id = one_run(world, "f")
    world.execute()
    assert flagged == [True]
    assert world.run(run_id).status == RunStatus.CANCELLED
    assert "b" not in memos(world, run_id)


def test_a_worker_whose_lease_was_taken_over_writes_nothing_more(world: World) -> None:
    def lose_lease() -> None:
        world.now += 31  # the lease lapses; another worker takes the run
        world.store.transact_sync(lambda tx: world_lease(tx))

    def world_lease(tx: Any) -> Any:
        from stepstone.scheduler.leasing import lease

        return lease(tx, "other", world.registry, 1, world.now, world.now + 30)

    @world.handler("f")
    async def f(ctx: ss.Context) -> None:
        await ctx.step.run("a", lose_lease)
        await ctx.step.run("b", lambda: None)

    run_id = one_run(world, "f")
    assert world.execute() is None  # the lease was lost
    assert memos(world, run_id) == {}  # not even "a": its checkpoint was fenced out
    assert world.run(run_id).status == RunStatus.RUNNING
