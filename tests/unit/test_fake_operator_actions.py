"""Operator actions meeting runs in flight, against the in-memory store:
replay, re-run from a step and cancel (actions.py), then the next invocation."""

from __future__ import annotations

import json
from typing import Any

import pytest

import stepstone as ss
from stepstone.actions import cancel_op, replay_op, rerun_op
from stepstone.errors import InvalidStateError, LeaseLostError
from stepstone.store.rows import Fence, RunStatus, StepStatus
from tests.fakes.world import World


@pytest.fixture
def world() -> World:
    return World()


def flaky_world(world: World, fail: dict[str, bool], calls: list[str]) -> str:
    def charge() -> str:
        calls.append("charge")
        return "charged"

    def ship() -> str:
        calls.append("ship")
        if fail["ship"]:
            raise ValueError("carrier down")
        return "shipped"

    @world.handler("order", retries=0)
    async def order(ctx: ss.Context) -> list[Any]:
        return [await ctx.step.run("charge", charge), await ctx.step.run("ship", ship)]

    [run_id] = world.send("order")
    return run_id


def test_a_replay_runs_the_failed_step_again_and_never_a_completed_one(world: World) -> None:
    fail, calls = {"ship": True}, list[str]()
    run_id = flaky_world(world, fail, calls)
    world.execute()
    assert world.run(run_id).status == RunStatus.FAILED
    fail["ship"] = False  # the fix is deployed
    world.apply(replay_op(run_id, world.now))
    world.execute()
    assert world.run(run_id).status == RunStatus.COMPLETED
    assert calls == ["charge", "ship", "ship"]  # charged exactly once
    assert json.loads(world.run(run_id).output or "null") == ["charged", "shipped"]


def test_a_replay_keeps_the_failed_attempt_in_the_trace(world: World) -> None:
    run_id = flaky_world(world, {"ship": True}, [])
    world.execute()
    world.apply(replay_op(run_id, world.now))
    spans = world.store.read_sync(lambda tx: tx.get_spans(run_id))
    assert any(s.name == "ship" and s.status == StepStatus.FAILED for s in spans)
    assert spans[-1].kind == "replay"


def test_only_failed_or_cancelled_runs_replay(world: World) -> None:
    run_id = flaky_world(world, {"ship": False}, [])
    world.execute()
    with pytest.raises(InvalidStateError):
        world.apply(replay_op(run_id, world.now))
    assert world.lease() == []  # the refused replay queued nothing


def test_a_rerun_from_a_step_keeps_the_steps_before_it(world: World) -> None:
    calls: list[str] = []
    run_id = flaky_world(world, {"ship": False}, calls)
    world.execute()
    new_run = world.apply(rerun_op(run_id, "ship", world.now))
    world.execute()
    assert world.run(new_run).status == RunStatus.COMPLETED
    assert calls == ["charge", "ship", "ship"]
    assert world.run(run_id).status == RunStatus.COMPLETED  # the original is untouched


def test_cancelling_a_sleeping_run_ends_it_and_its_wake_up_does_nothing(world: World) -> None:
    @world.handler("f")
    async def f(ctx: ss.Context) -> None:
        await ctx.step.sleep("nap", "10s")

    [run_id] = world.send("f")
    world.execute()
    assert world.apply(cancel_op(run_id, world.now, world.registry)) == RunStatus.CANCELLED
    world.now += 10
    assert world.lease() == []


def test_a_cancelled_run_replays_from_where_it_stopped(world: World) -> None:
    calls: list[str] = []

    @world.handler("f")
    async def f(ctx: ss.Context) -> str:
        await ctx.step.run("first", lambda: calls.append("first"))
        await ctx.step.sleep("nap", "10s")
        return "done"

    [run_id] = world.send("f")
    world.execute()
    world.apply(cancel_op(run_id, world.now, world.registry))
    world.apply(replay_op(run_id, world.now))
    outcome = world.execute()
    assert outcome is not None and outcome.status == RunStatus.SLEEPING  # the sleep starts again
    world.now += 10
    world.execute()
    assert (world.run(run_id).status, calls) == (RunStatus.COMPLETED, ["first"])


def test_a_fence_from_before_a_cancel_and_replay_never_commits_again(world: World) -> None:
    world.function("f")
    [run_id] = world.send("f")
    [old] = world.lease(ttl=5)
    world.apply(cancel_op(run_id, world.now + 6, world.registry))  # the lease lapsed: ended at once
    world.apply(replay_op(run_id, world.now + 6))
    world.now += 6
    [new] = world.lease()
    assert new.epoch > old.epoch
    stale = Fence(run_id=run_id, owner="w", epoch=old.epoch)
    with pytest.raises(LeaseLostError):
        world.apply(lambda tx: tx.checkpoint(stale, [], []))


def test_a_replay_is_refused_while_another_run_holds_the_singleton_key(world: World) -> None:
    world.function("f", singleton=ss.Singleton())
    [first] = world.send("f")
    world.apply(cancel_op(first, world.now, world.registry))
    [second] = world.send("f")  # the key is free: the first run ended
    assert world.run(second).status == RunStatus.QUEUED
    with pytest.raises(InvalidStateError):
        world.apply(replay_op(first, world.now))
    assert world.run(first).status == RunStatus.CANCELLED
