"""A signal meeting the wait that receives it, driven through the store with
explicit times (both stores): each order of "send" and "the wait's commit"
(check the buffer, then park) delivers the signal exactly once, and so do the
two interleavings where one transaction is still open when the other starts
(on PostgreSQL they are ordered by the run's queue row, which both lock)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from stepstone import mailbox
from stepstone.store import make_store
from stepstone.store.base import Store, Tx
from stepstone.store.rows import Fence, SignalRow, StepKind, StepRow, StepStatus

from ..conftest import query
from ..polling import wait_for
from .test_store_contract import NOW, add_runs, lease


@pytest.fixture
def other(db_url: str) -> Iterator[Store]:
    """A second store on the same database: its own connections, no shared group commit."""
    opened = make_store(db_url)
    yield opened
    opened.close()


def leased(store: Store) -> Fence:
    add_runs(store, ["r"])
    [run] = store.transact_sync(lambda tx: lease(tx, "w1", 1, NOW, NOW + 60))
    return Fence(run_id="r", owner="w1", epoch=run.epoch)


def signal(n: int, at: float = NOW + 1) -> SignalRow:
    return SignalRow(id=f"sig-{n}", run_id="r", name="s", data=str(n), sent_at=at)


def wait_commit(
    fence: Fence, step_id: str = "w", at: float = NOW + 1, expires: float | None = None
) -> object:
    """The transaction of ``wait_for_signal``: its memo (waiting), then receive."""
    row = StepRow(
        run_id="r",
        step_id=step_id,
        position=0,
        kind=StepKind.SIGNAL,
        status=StepStatus.WAITING,
        wake_at=expires,
        started_at=at,
    )

    def op(tx: Tx) -> str | None:
        tx.checkpoint(fence, [row], [])
        return mailbox.receive(tx, mailbox.wait_row("r", step_id, "s", at, expires))

    return op


def consumers(store: Store) -> list[str | None]:
    return [s.consumed_by for s in store.read_sync(lambda tx: tx.run_signals("r"))]


def test_a_signal_sent_first_is_taken_by_the_wait_commit_once(store: Store) -> None:
    fence = leased(store)
    store.transact_sync(lambda tx: mailbox.send(tx, signal(1)))
    store.transact_sync(lambda tx: mailbox.send(tx, signal(2)))
    receive = wait_commit(fence)
    assert store.transact_sync(receive) == "1"  # type: ignore[arg-type]
    assert store.transact_sync(receive) == "1"  # type: ignore[arg-type]  # a repeated commit takes no more
    assert consumers(store) == ["w", None]


def test_a_wait_committed_first_is_resolved_by_the_send_and_the_run_woken(store: Store, db_url: str) -> None:
    fence = leased(store)
    assert store.transact_sync(wait_commit(fence)) is None  # type: ignore[arg-type]  # parked
    store.transact_sync(lambda tx: mailbox.send(tx, signal(1)))
    step = store.read_sync(lambda tx: tx.get_step("r", "w"))
    assert step is not None and (step.status, step.output) == (StepStatus.COMPLETED, "1")
    assert consumers(store) == ["w"]
    assert query(db_url, "SELECT count(*) FROM waits") == [(0,)]
    assert query(db_url, "SELECT wake_requested FROM queue WHERE run_id = 'r'") == [
        (1,)
    ]  # held: due at its park
    # The commit repeated after an ambiguous COMMIT reads the delivery, takes nothing.
    assert store.transact_sync(wait_commit(fence)) == "1"  # type: ignore[arg-type]
    store.transact_sync(lambda tx: mailbox.send(tx, signal(2)))
    assert consumers(store) == ["w", None]


def test_a_wait_past_its_timeout_gets_no_signal_and_the_signal_stays_buffered(store: Store) -> None:
    fence = leased(store)
    store.transact_sync(wait_commit(fence, expires=NOW + 5))  # type: ignore[arg-type]
    store.transact_sync(lambda tx: mailbox.send(tx, signal(1, at=NOW + 6)))  # the wait has expired
    assert consumers(store) == [None]
    step = store.read_sync(lambda tx: tx.get_step("r", "w"))
    assert step is not None and step.status == StepStatus.WAITING  # the timeout will resolve it (None)
    assert store.transact_sync(wait_commit(fence, step_id="later", at=NOW + 7)) == "1"  # type: ignore[arg-type]


def _blocked_or_done(db_url: str, done: threading.Event) -> bool:
    if done.is_set() or not db_url.startswith("postgresql"):
        return True  # SQLite: writers are serial, the second waits for the first's BEGIN IMMEDIATE
    locked: int = query(db_url, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")[0][0]
    return locked > 0


def _interleave(first: Store, first_op: object, second: Store, second_op: object, db_url: str) -> None:
    """Run ``first_op`` and hold its transaction open; start ``second_op``; once it
    is blocked (or done), let the first commit."""
    held, release, done = threading.Event(), threading.Event(), threading.Event()

    def holding(tx: Tx) -> None:
        first_op(tx)  # type: ignore[operator]
        held.set()
        assert release.wait(10)

    opener = threading.Thread(target=lambda: first.transact_sync(holding))
    opener.start()
    assert held.wait(10)
    follower = threading.Thread(target=lambda: (second.transact_sync(second_op), done.set()))  # type: ignore[func-returns-value, arg-type]
    follower.start()
    wait_for(lambda: _blocked_or_done(db_url, done), 10, "the second transaction to block on the first")
    release.set()
    opener.join(10)
    follower.join(10)
    assert done.is_set()


def test_a_send_starting_while_the_wait_commit_is_open_delivers_after_it(
    store: Store, other: Store, db_url: str
) -> None:
    fence = leased(store)
    _interleave(store, wait_commit(fence), other, lambda tx: mailbox.send(tx, signal(1)), db_url)
    assert consumers(store) == ["w"]
    step = store.read_sync(lambda tx: tx.get_step("r", "w"))
    assert step is not None and step.output == "1"


def test_a_wait_commit_starting_while_the_send_is_open_takes_the_signal(
    store: Store, other: Store, db_url: str
) -> None:
    fence = leased(store)
    _interleave(store, lambda tx: mailbox.send(tx, signal(1)), other, wait_commit(fence), db_url)
    assert consumers(store) == ["w"]
    assert query(db_url, "SELECT count(*) FROM waits") == [(0,)]
    step = store.read_sync(lambda tx: tx.get_step("r", "w"))
    assert step is not None and step.output == "1"
