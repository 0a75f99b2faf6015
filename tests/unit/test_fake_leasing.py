"""Leasing against the in-memory store: queue order, concurrency keys,
fairness across partitions, throttles and fencing (scheduler/leasing.py)."""

from __future__ import annotations

import pytest

import stepstone as ss
from stepstone.errors import LeaseLostError
from stepstone.scheduler.leasing import BLOCKED_RECHECK, RECHECK
from stepstone.store.rows import Fence, RunStatus
from tests.fakes.world import World


@pytest.fixture
def world() -> World:
    return World()


def test_nothing_to_lease_without_runs(world: World) -> None:
    world.function("f")
    assert world.lease() == []


def test_wanting_nothing_leases_nothing(world: World) -> None:
    world.function("f")
    world.send("f")
    assert world.lease(wanted=0) == []
    assert world.leased_ids() != []


def test_runs_are_leased_in_the_order_they_were_created(world: World) -> None:
    world.function("f")
    ids = []
    for _ in range(3):
        ids += world.send("f")
        world.now += 1
    assert world.leased_ids() == ids


def test_a_lease_marks_the_run_running_with_epoch_one(world: World) -> None:
    world.function("f")
    [run_id] = world.send("f")
    [leased] = world.lease()
    assert (leased.run.id, leased.epoch, leased.run.status) == (run_id, 1, RunStatus.RUNNING)
    assert leased.run.started_at == world.now
    assert [e.name for e in leased.events] == ["f"]


def test_a_held_run_is_not_leased_twice(world: World) -> None:
    world.function("f")
    world.send("f")
    assert len(world.lease("a")) == 1
    assert world.lease("b") == []


def test_an_expired_lease_is_taken_over_with_a_higher_epoch(world: World) -> None:
    world.function("f")
    world.send("f")
    [first] = world.lease("a", ttl=5)
    world.now += 5
    [second] = world.lease("b")
    assert second.run.id == first.run.id and second.epoch == first.epoch + 1


def test_the_old_owner_is_fenced_out_after_a_take_over(world: World) -> None:
    world.function("f")
    world.send("f")
    [first] = world.lease("a", ttl=5)
    world.now += 6
    world.lease("b")
    with pytest.raises(LeaseLostError):
        world.finish(first, owner="a")
    assert world.run(first.run.id).status == RunStatus.RUNNING


def test_the_new_owner_may_finish_after_a_take_over(world: World) -> None:
    world.function("f")
    world.send("f")
    world.lease("a", ttl=5)
    world.now += 6
    [second] = world.lease("b")
    assert world.finish(second, owner="b") is True
    assert world.run(second.run.id).status == RunStatus.COMPLETED


def test_a_wanted_count_caps_the_pass(world: World) -> None:
    world.function("f")
    for _ in range(5):
        world.send("f")
    assert len(world.lease(wanted=2)) == 2
    assert len(world.lease(wanted=10)) == 3


def test_only_the_workers_functions_are_leased(world: World) -> None:
    world.function("f")
    other = World()
    other.store = world.store
    other.function("g")
    world.send("f")
    other.send("g")
    assert [lr.run.function_id for lr in world.lease()] == ["f"]


def test_a_concurrency_limit_holds_back_runs_beyond_it(world: World) -> None:
    world.function("f", concurrency=ss.Concurrency(limit=2))
    for _ in range(4):
        world.send("f")
    assert len(world.lease()) == 2
    assert world.lease() == []


def test_finishing_a_run_frees_its_concurrency_slot_at_once(world: World) -> None:
    world.function("f", concurrency=ss.Concurrency(limit=1))
    world.send("f")
    world.send("f")
    [first] = world.lease()
    assert world.lease() == []
    world.finish(first)
    assert len(world.lease()) == 1  # the release woke the parked partition


def test_a_full_key_parks_its_partition_until_the_blocked_recheck(world: World) -> None:
    world.function("f", concurrency=ss.Concurrency(limit=1))
    world.send("f")
    world.send("f")
    world.lease()
    due = world.store.read_sync(lambda tx: tx.next_due(["f"]))
    assert due == world.now + BLOCKED_RECHECK


def test_a_recheck_of_a_full_key_counts_the_live_leases(world: World) -> None:
    world.function("f", concurrency=ss.Concurrency(limit=2))
    for _ in range(3):
        world.send("f")
    world.lease("a", ttl=60)
    world.now += BLOCKED_RECHECK  # the partition is looked at again; both slots still held
    assert world.lease("b") == []


def test_a_release_by_another_worker_frees_a_slot_for_the_next_pass(world: World) -> None:
    world.function("f", concurrency=ss.Concurrency(limit=2))
    for _ in range(4):
        world.send("f")
    world.lease("a", wanted=1, ttl=60)
    world.lease("b", wanted=1, ttl=60)
    world.apply(lambda tx: tx.release_leases("a", world.now))
    assert len(world.lease("c")) == 1  # b still holds one of the two slots


def test_an_expired_lease_frees_its_slot(world: World) -> None:
    world.function("f", concurrency=ss.Concurrency(limit=1))
    world.send("f")
    world.send("f")
    world.lease("a", ttl=5)
    world.now += 5
    assert len(world.lease("b")) == 1  # the lapsed one or the waiting one, not both


def test_concurrency_keys_limit_each_key_separately(world: World) -> None:
    world.function("f", concurrency=ss.Concurrency(limit=1, key="event.data.tenant"))
    for tenant in ("a", "a", "b", "b"):
        world.send("f", {"tenant": tenant})
    assert len(world.lease()) == 2  # one per tenant


def test_a_full_key_does_not_block_another_key(world: World) -> None:
    world.function("f", concurrency=ss.Concurrency(limit=1, key="event.data.tenant"))
    for _ in range(5):
        world.send("f", {"tenant": "busy"})
    [late] = world.send("f", {"tenant": "quiet"})
    assert late in world.leased_ids(wanted=2)


def test_a_second_key_skips_an_item_without_blocking_the_partition(world: World) -> None:
    world.function(
        "f",
        concurrency=[ss.Concurrency(limit=5), ss.Concurrency(limit=1, key="event.data.user")],
    )
    first = world.send("f", {"user": "u1"})
    blocked = world.send("f", {"user": "u1"})
    other = world.send("f", {"user": "u2"})
    taken = world.leased_ids()
    assert set(taken) == set(first + other)  # the blocked item is stepped over
    assert blocked[0] not in taken


def test_partitions_are_served_least_recently_first(world: World) -> None:
    world.function("f", concurrency=ss.Concurrency(limit=10, key="event.data.tenant"))
    for _ in range(3):
        world.send("f", {"tenant": "a"})
    for _ in range(3):
        world.send("f", {"tenant": "b"})
    tenants = []
    for _ in range(4):
        [leased] = world.lease(wanted=1)
        world.now += RECHECK
        tenants.append(world.store.state.queue[leased.run.id].ckey1)
    assert tenants[0] != tenants[1] and tenants[1] != tenants[2]  # alternating, no key starves


def test_priority_moves_a_run_ahead_in_its_partition(world: World) -> None:
    world.function("f", priority=ss.Priority(run="event.data.p"))
    [low] = world.send("f", {"p": 0})
    [high] = world.send("f", {"p": 60})
    assert world.leased_ids(wanted=1) == [high]
    assert world.leased_ids() == [low]


def test_a_throttle_spaces_out_starts(world: World) -> None:
    world.function("f", throttle=ss.Throttle(limit=1, period="10s"))
    for _ in range(3):
        world.send("f")
    assert len(world.lease()) == 1
    world.now += 9.9
    assert world.lease() == []
    world.now += 0.1
    assert len(world.lease()) == 1


def test_a_throttle_burst_allows_that_many_at_once(world: World) -> None:
    world.function("f", throttle=ss.Throttle(limit=1, period="10s", burst=2))
    for _ in range(3):
        world.send("f")
    assert len(world.lease()) == 2


def test_a_throttle_only_counts_fresh_starts(world: World) -> None:
    world.function("f", throttle=ss.Throttle(limit=1, period="10s"))
    world.send("f")
    [leased] = world.lease(ttl=1)
    world.now += 2  # the lease lapsed: the run is due again but was started before
    assert [lr.run.id for lr in world.lease()] == [leased.run.id]


def test_a_throttled_partition_is_next_due_when_the_throttle_allows(world: World) -> None:
    world.function("f", throttle=ss.Throttle(limit=1, period="10s"))
    world.send("f")
    world.send("f")
    world.lease()
    assert world.store.read_sync(lambda tx: tx.next_due(["f"])) == pytest.approx(world.now + 10)


def test_released_leases_are_due_again_at_once(world: World) -> None:
    world.function("f")
    world.send("f")
    world.send("f")
    world.lease("a")
    assert world.apply(lambda tx: tx.release_leases("a", world.now)) == 2
    assert len(world.lease("b")) == 2


def test_a_heartbeat_extends_only_live_leases_of_its_owner(world: World) -> None:
    world.function("f")
    [r1] = world.send("f")
    [r2] = world.send("f")
    world.lease("a", wanted=1, ttl=5)
    world.lease("b", wanted=1, ttl=5)
    assert world.apply(lambda tx: tx.extend_leases("a", [r1, r2], world.now + 60, world.now + 1)) == [r1]
    world.now += 6
    assert world.leased_ids("c") == [r2]  # a's lease was extended; b's lapsed


def test_a_lapsed_lease_is_never_extended(world: World) -> None:
    world.function("f")
    [r1] = world.send("f")
    world.lease("a", ttl=5)
    assert world.apply(lambda tx: tx.extend_leases("a", [r1], world.now + 60, world.now + 5)) == []


def test_a_parked_run_is_leased_again_when_it_wakes(world: World) -> None:
    world.function("f")
    world.send("f")
    [leased] = world.lease()
    fence = Fence(run_id=leased.run.id, owner="w", epoch=leased.epoch)
    world.apply(lambda tx: tx.reschedule(fence, RunStatus.SLEEPING, world.now + 60, None, world.now))
    assert world.run(leased.run.id).status == RunStatus.SLEEPING
    world.now += 59
    assert world.lease() == []
    world.now += 1
    [woken] = world.lease()
    assert (woken.run.status, woken.epoch) == (RunStatus.RUNNING, 2)


def test_a_wake_up_during_the_lease_makes_the_park_due_now(world: World) -> None:
    world.function("f")
    world.send("f")
    [leased] = world.lease()
    world.apply(lambda tx: tx.wake_run(leased.run.id, world.now))
    fence = Fence(run_id=leased.run.id, owner="w", epoch=leased.epoch)
    world.apply(lambda tx: tx.reschedule(fence, RunStatus.WAITING, None, None, world.now))
    assert len(world.lease()) == 1


def test_a_cancel_flag_on_a_held_run_ends_its_park(world: World) -> None:
    world.function("f")
    world.send("f")
    [leased] = world.lease()
    assert world.apply(lambda tx: tx.flag_cancel(leased.run.id, world.now, '{"r": 1}')) is True
    fence = Fence(run_id=leased.run.id, owner="w", epoch=leased.epoch)
    assert world.apply(lambda tx: tx.reschedule(fence, RunStatus.SLEEPING, world.now + 60, None, world.now))
    assert world.apply(lambda tx: tx.cancel_reason(leased.run.id)) == '{"r": 1}'
