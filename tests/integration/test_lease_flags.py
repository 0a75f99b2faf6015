"""The queue row's lease, fence and flags under races, at the store level with
explicit ``now`` values (issue 12, defects 1-3), on both backends.

A flag left for a run's current owner (cancel requested, wake requested) must
be honoured by every way an invocation can end and in every lease state (held,
expired but not re-taken, re-taken); an epoch must never match an older
invocation of the same run. The regression tests replay each reported race;
the matrix and the hypothesis test check the class.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import stepstone as ss
from stepstone.errors import ErrorInfo, LeaseLostError
from stepstone.lifecycle import cancel_run, park_run
from stepstone.registry import Registry
from stepstone.scheduler.maintenance import timeouts_op
from stepstone.store.base import Store, Tx, make_store
from stepstone.store.rows import (
    CANCELLED,
    COMPLETED,
    RUNNING,
    SLEEPING,
    WAITING,
    Fence,
    LeasedRun,
    NewRun,
    StepRow,
)

NOW = 1_000_000.0
TTL = 10.0


def _registry() -> Registry:
    app = ss.App("flags", database_url="sqlite:///never-opened.db")  # only its registry is used
    app.function(id="f")(lambda ctx: None)
    return app.registry


MATCHER = _registry()


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    opened = make_store(db_url)
    opened.migrate()
    yield opened
    opened.close()


def add_run(store: Store, run_id: str, at: float = NOW, finish_timeout: float | None = None) -> None:
    def op(tx: Tx) -> None:
        seq = tx.insert_event(f"ev-{run_id}", "go", "{}", 7, at)
        tx.create_run(NewRun(id=run_id, function_id="f", event_seqs=[seq], event_ids=[f"ev-{run_id}"],
                             available_at=at, created_at=at, finish_timeout=finish_timeout))

    store.transact_sync(op)


def take(store: Store, run_id: str, owner: str, now: float) -> LeasedRun:
    """A worker's lease of ``run_id`` at ``now`` (which must be due then)."""
    def op(tx: Tx) -> LeasedRun:
        assert due_at(tx, run_id, now), f"run {run_id} is not due at {now}"
        leased = tx.take(owner, run_id, now, now + TTL)
        assert leased is not None
        return leased

    return store.transact_sync(op)


def due_at(tx: Tx, run_id: str, now: float) -> bool:
    item = queue_row(tx, run_id)
    return item is not None and item["available_at"] is not None and item["available_at"] <= now


def queue_row(tx: Tx, run_id: str) -> dict[str, Any] | None:
    row = tx._one("queue_item", {"run_id": run_id})  # type: ignore[attr-defined]
    return None if row is None else dict(row)


def fence_of(leased: LeasedRun, owner: str) -> Fence:
    return Fence(leased.run.id, owner, leased.epoch)


def status(store: Store, run_id: str) -> str:
    run = store.read_sync(lambda tx: tx.get_run(run_id))
    assert run is not None
    return run.status


def memo(run_id: str, step_id: str, output: str) -> StepRow:
    return StepRow(run_id, step_id, 0, "run", COMPLETED, 1, output, None, None, NOW, NOW)


def park(store: Store, fence: Fence, state: str, wake_at: float | None, now: float) -> str:
    """The invocation's park (sleep, wait, back-off), as the executor commits it."""
    def op(tx: Tx) -> str:
        run = tx.get_run(fence.run_id)
        assert run is not None
        return park_run(tx, run, fence, state, wake_at, None, now, MATCHER)

    return store.transact_sync(op)


def cancel(store: Store, run_id: str, now: float, reason: ErrorInfo | None = None) -> str:
    return store.transact_sync(lambda tx: cancel_run(tx, run_id, now, MATCHER, reason))


def replay(store: Store, run_id: str, now: float) -> None:
    store.transact_sync(lambda tx: tx.requeue_run(run_id, now, []))


def wake(store: Store, run_id: str, now: float) -> None:
    store.transact_sync(lambda tx: tx.wake_run(run_id, now))


# -- regressions ------------------------------------------------------------------------


def test_an_epoch_never_repeats_across_cancel_and_replay(store: Store) -> None:
    """Defect 1: a worker paused past its lease; the run is cancelled and replayed
    and leased again by the same process: the paused invocation stays fenced out."""
    add_run(store, "r")
    old = take(store, "r", "w", NOW)
    t = NOW + TTL + 1  # paused past its lease
    assert cancel(store, "r", t) == CANCELLED  # nobody holds it: cancelled at once
    replay(store, "r", t + 1)
    new = take(store, "r", "w", t + 1)  # the same owner (one per process) takes it again
    assert new.epoch > old.epoch
    with pytest.raises(LeaseLostError):
        store.transact_sync(lambda tx: tx.checkpoint(fence_of(old, "w"), [memo("r", "b", '"stale"')], []))
    with pytest.raises(LeaseLostError):
        store.transact_sync(lambda tx: tx.finish_run(fence_of(old, "w"), "r", COMPLETED, "1", None, t + 2))
    assert store.read_sync(lambda tx: tx.get_steps("r")) == []
    store.transact_sync(lambda tx: tx.checkpoint(fence_of(new, "w"), [memo("r", "b", '"new"')], []))
    assert status(store, "r") == RUNNING


@pytest.mark.parametrize("state, wake_at", [(WAITING, None), (SLEEPING, NOW + 3600)])
def test_a_park_honours_a_cancel_requested_while_the_run_was_held(
        store: Store, state: str, wake_at: float | None) -> None:
    """Defect 2: the cancel arrives while the invocation is about to park (here
    without a checkpoint in between): the park ends the run cancelled."""
    add_run(store, "r")
    leased = take(store, "r", "w", NOW)
    assert cancel(store, "r", NOW + 1) == RUNNING  # held: flagged for the owner
    assert park(store, fence_of(leased, "w"), state, wake_at, NOW + 2) == CANCELLED
    assert status(store, "r") == CANCELLED
    assert store.read_sync(lambda tx: queue_row(tx, "r")) is None


def test_a_finish_timeout_flagged_before_a_park_keeps_its_reason(store: Store) -> None:
    """Defect 2 (timeouts): the duty flags a held run past timeouts.finish and
    clears its deadlines; the park that follows cancels it with the Timeout reason."""
    add_run(store, "r", finish_timeout=5.0)
    leased = take(store, "r", "w", NOW)
    assert store.transact_sync(timeouts_op(NOW + 6, MATCHER)) == 1
    assert status(store, "r") == RUNNING  # flagged, not ended: a step may be running
    assert park(store, fence_of(leased, "w"), WAITING, None, NOW + 7) == CANCELLED
    run = store.read_sync(lambda tx: tx.get_run("r"))
    assert run is not None and run.status == CANCELLED and run.error is not None
    assert ErrorInfo.from_json(__import__("json").loads(run.error)) == ErrorInfo(
        "Timeout", "the run exceeded timeouts.finish")


def test_a_wake_on_an_expired_lease_survives_the_owners_return(store: Store) -> None:
    """Defect 3: the owner pauses past its lease, the awaited event arrives, the
    owner resumes, heartbeats and parks the run waiting: the run is due."""
    add_run(store, "r")
    leased = take(store, "r", "w", NOW)
    t = NOW + TTL + 1
    wake(store, "r", t)  # the wait completed while the lease had lapsed
    kept = store.transact_sync(lambda tx: tx.extend_leases("w", ["r"], t + 1 + TTL, t + 1))
    assert kept == []  # a lapsed lease is not brought back
    assert park(store, fence_of(leased, "w"), WAITING, None, t + 2) == WAITING
    assert store.read_sync(lambda tx: due_at(tx, "r", t + 2))


def test_a_heartbeat_extends_only_live_leases(store: Store) -> None:
    add_run(store, "live")
    add_run(store, "lapsed")
    take(store, "live", "w", NOW + 5)
    take(store, "lapsed", "w", NOW)
    kept = store.transact_sync(lambda tx: tx.extend_leases("w", ["live", "lapsed"], NOW + 30, NOW + TTL + 1))
    assert kept == ["live"]
    assert store.read_sync(lambda tx: due_at(tx, "lapsed", NOW + TTL + 1))
    assert not store.read_sync(lambda tx: due_at(tx, "live", NOW + 29))
