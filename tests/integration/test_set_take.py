"""A lease pass takes a partition's chosen items in one statement (issue 18,
throughput): it must still honour every concurrency limit exactly, however many
items are due, count a second key across partitions, and serve partitions in
turn. Driven through the store with explicit times, on both stores.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest

import stepstone as ss
from stepstone.clock import SystemClock
from stepstone.journal import RunJournal
from stepstone.registry import Registry
from stepstone.runtime import ingest, prepare
from stepstone.scheduler.leasing import RECHECK, lease, next_pass_at
from stepstone.signals import LeaseLostSignal
from stepstone.store.base import Store, Tx
from stepstone.store.rows import Fence, LeasedRun, RunEnd, RunStatus

from ..conftest import query
from .test_postgres import uncommitted
from .test_store_contract import step

NOW = 1_000_000.0
TTL = 60.0


def _registry(concurrency: ss.Concurrency | list[ss.Concurrency] | None = None) -> Registry:
    app = ss.App("take", database_url="sqlite:///never-opened.db")  # only its registry is used
    app.function(id="keyed", trigger=ss.on_event("keyed"), concurrency=concurrency)(lambda ctx: None)
    app.function(id="plain", trigger=ss.on_event("plain"))(lambda ctx: None)
    app.function(id="other", trigger=ss.on_event("other"))(lambda ctx: None)
    return app.registry


def _send(store: Store, registry: Registry, events: list[ss.Event]) -> None:
    prepared = prepare(events, NOW)
    store.transact_sync(lambda tx: ingest(tx, prepared, registry, NOW))


def _pass(store: Store, registry: Registry, wanted: int, at: float = NOW) -> list[LeasedRun]:
    return store.transact_sync(lambda tx: lease(tx, "w", registry, wanted, at, at + TTL))


def _tenants(leased: list[LeasedRun]) -> Counter[str]:
    """Leased runs per tenant (``keyed``) or per function (the others)."""
    return Counter(
        json.loads(lr.events[0].data)["t"] if lr.run.function_id == "keyed" else lr.run.function_id
        for lr in leased
    )


def test_one_pass_takes_exactly_each_keys_limit_however_many_are_due(store: Store) -> None:
    registry = _registry(concurrency=ss.Concurrency(limit=3, key="event.data.t"))
    _send(store, registry, [ss.Event("keyed", {"t": f"t{i % 3}"}) for i in range(60)])
    _send(store, registry, [ss.Event("plain") for _ in range(20)])
    first = _pass(store, registry, 100)
    assert _tenants(first) == {"t0": 3, "t1": 3, "t2": 3, "plain": 20}
    assert all(lr.run.status == RunStatus.RUNNING and lr.events for lr in first)
    assert len({lr.run.id for lr in first}) == len(first)
    assert _pass(store, registry, 100, NOW + 1) == []  # every key is full, the plain queue empty

    done = next(lr for lr in first if _tenants([lr]) == {"t1": 1})

    def finish(tx: Tx) -> None:
        fence = Fence(run_id=done.run.id, owner="w", epoch=done.epoch)
        assert tx.finish_run(
            RunEnd(
                fence=fence,
                run_id=done.run.id,
                status=RunStatus.COMPLETED,
                now=NOW + 2,
            )
        )

    store.transact_sync(finish)
    assert _tenants(_pass(store, registry, 100, NOW + 3)) == {"t1": 1}  # exactly the slot freed


def test_a_second_key_is_counted_across_the_partitions_of_one_pass(store: Store) -> None:
    limits = [ss.Concurrency(limit=5, key="event.data.t"), ss.Concurrency(limit=4, key="event.data.r")]
    registry = _registry(concurrency=limits)
    _send(store, registry, [ss.Event("keyed", {"t": f"t{i % 3}", "r": "eu"}) for i in range(30)])
    first = _pass(store, registry, 100)
    assert len(first) == 4  # the shared second key, though each tenant has room for 5
    assert max(_tenants(first).values()) <= 5
    assert _pass(store, registry, 100, NOW + 1) == []


def test_a_full_worker_serves_partitions_in_turn(store: Store) -> None:
    registry = _registry()
    _send(store, registry, [ss.Event("plain") for _ in range(10)])
    _send(store, registry, [ss.Event("other") for _ in range(10)])
    served = [_tenants(_pass(store, registry, 3, NOW + n)) for n in range(4)]
    # each pass fills the worker from one partition, then the other one's turn comes
    assert [set(c) for c in served] in ([{"plain"}, {"other"}] * 2, [{"other"}, {"plain"}] * 2)
    assert all(sum(c.values()) == 3 for c in served)


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_a_pass_that_finds_its_partition_held_waits_instead_of_spinning(db_url: str, store: Store) -> None:
    """Two worker processes, one partition: while one pass holds the partition
    row, the other takes nothing and must not be told its work is due now (it
    would pass again at once, in a loop, for as long as the first pass runs)."""
    registry = _registry()
    _send(store, registry, [ss.Event("plain") for _ in range(10)])
    ids = registry.ids()

    def second(tx: Tx) -> tuple[list[LeasedRun], float | None]:
        leased = lease(tx, "w2", registry, 5, NOW, NOW + TTL)
        return leased, next_pass_at(tx, ids, NOW, bool(leased))

    with uncommitted(db_url, lambda tx: lease(tx, "w1", registry, 5, NOW, NOW + TTL)):
        leased, due = store.transact_sync(second)
    assert leased == []
    assert due == NOW + RECHECK
    leased, due = store.transact_sync(second)  # the first pass committed: the rest is taken
    assert len(leased) == 5


def test_a_last_commit_without_its_own_fence_check_writes_nothing_once_the_lease_moved(
    store: Store,
) -> None:
    """The run's last commit (memos + end, or memos + park) checks the fence once,
    in the end or park itself: when another worker took the run meanwhile, the
    whole transaction rolls back: no memo, no end, the new owner's lease kept."""
    registry = _registry()
    _send(store, registry, [ss.Event("plain")])
    [old] = _pass(store, registry, 1)
    [new] = _pass(store, registry, 1, NOW + TTL + 1)  # the first lease lapsed
    run_id = old.run.id
    fence = Fence(run_id=run_id, owner="w", epoch=old.epoch)
    journal = RunJournal(store, fence, SystemClock())
    journal.stage(step(run_id, "last"), None)

    def end(tx: Tx, fence: Fence = fence, at: float = NOW + TTL + 2) -> bool:
        return tx.finish_run(
            RunEnd(fence=fence, run_id=run_id, status=RunStatus.COMPLETED, output="1", now=at)
        )

    with pytest.raises(LeaseLostSignal):
        asyncio.run(journal.finish(end))
    assert store.read_sync(lambda tx: tx.get_steps(run_id)) == []
    run = store.read_sync(lambda tx: tx.get_run(run_id))
    assert run is not None and run.status == RunStatus.RUNNING and run.ended_at is None
    assert new.epoch > old.epoch
    # the new owner's lease is intact: its own end commits
    new_fence = Fence(run_id=run_id, owner="w", epoch=new.epoch)
    assert store.transact_sync(lambda tx: end(tx, new_fence, NOW + TTL + 3))


def test_runs_taken_together_under_different_epochs_each_record_their_own(db_url: str, store: Store) -> None:
    """One pass takes a run leased before (its lease lapsed) beside fresh ones:
    each run records the epoch its queue item was given, which fences its
    writes and which a replay's new item starts from."""
    registry = _registry()
    _send(store, registry, [ss.Event("plain")])
    [first] = _pass(store, registry, 1)
    _send(store, registry, [ss.Event("plain") for _ in range(2)])
    taken = _pass(store, registry, 5, NOW + TTL + 1)
    epochs = {lr.run.id: lr.epoch for lr in taken}
    assert len(epochs) == 3 and epochs[first.run.id] == first.epoch + 1
    assert sorted(epochs.values()) == [1, 1, first.epoch + 1]
    stored = dict(query(db_url, "SELECT id, epoch FROM runs"))
    assert stored == epochs
    fences = [Fence(run_id=lr.run.id, owner="w", epoch=lr.epoch) for lr in taken]

    def finish_all(tx: Tx) -> list[bool]:
        return [
            tx.finish_run(
                RunEnd(
                    fence=f,
                    run_id=f.run_id,
                    status=RunStatus.COMPLETED,
                    now=NOW + TTL + 2,
                )
            )
            for f in fences
        ]

    assert store.transact_sync(finish_all) == [True, True, True]


def test_a_pass_that_took_nothing_but_left_due_partitions_unvisited_passes_again_at_once(
    store: Store,
) -> None:
    """Forty tenants at their limit ahead of a plain queue: a pass for one slot
    visits only its limit of partitions (all full) and takes nothing; the
    worker must look further at once, not wait as it does for a held partition."""
    registry = _registry(concurrency=ss.Concurrency(limit=1, key="event.data.t"))
    _send(store, registry, [ss.Event("keyed", {"t": f"t{i % 40}"}) for i in range(80)])
    assert len(_pass(store, registry, 100)) == 40  # one per tenant: every key is now full
    _send(store, registry, [ss.Event("plain") for _ in range(5)])
    assert _tenants(_pass(store, registry, 1, NOW + 1)) == {"plain": 1}  # served after the tenants
    ids, later = registry.ids(), NOW + 6  # the tenants' partitions are due for a re-check

    def one_slot(tx: Tx) -> tuple[list[LeasedRun], float | None]:
        leased = lease(tx, "w", registry, 1, later, later + TTL)
        return leased, next_pass_at(tx, ids, later, bool(leased))

    leased, due = store.transact_sync(one_slot)
    assert leased == [] and due is not None and due <= later  # more due partitions: pass again now
    for _ in range(3):
        leased, due = store.transact_sync(one_slot)
        if leased:
            break
    assert _tenants(leased) == {"plain": 1}
