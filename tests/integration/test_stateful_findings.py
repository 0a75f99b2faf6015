"""Standalone reproductions of what the stateful test (test_stateful.py) found
beyond the defects issue 12 listed, on both stores.

A fenced-out checkpoint on PostgreSQL: the fence raises on the server
(SQLSTATE SS001) inside a pipelined transaction, so the statements sent after
it are skipped. When one of them crossed psycopg's prepare threshold in that
pipeline, psycopg records it as prepared although the server never prepared
it: every later transaction on that writer connection that uses the statement
fails with ``prepared statement "_pg3_N" does not exist`` (a ``StoreError``,
not retried), so every checkpoint it carries fails, for good.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from stepstone.errors import LeaseLostError, StoreError
from stepstone.store.base import Store, Tx
from stepstone.store.rows import CancelFlag, Fence

from .test_store_contract import NOW, add_run, add_runs, lease, step


def test_refused_checkpoints_leave_the_writer_able_to_commit(store: Store) -> None:
    """Two workers alternate on one writer connection: the one that lost its
    lease is refused, the owner's checkpoints all commit. (Pairs of refusals,
    so that whichever statement count reaches psycopg's prepare threshold, it
    does so inside a refused transaction at some point.)"""
    add_runs(store, ["r"])
    [old] = store.transact_sync(lambda tx: lease(tx, "w1", 1, NOW, NOW + 1))
    [new] = store.transact_sync(lambda tx: lease(tx, "w2", 1, NOW + 2, NOW + 10))
    stale, fence = (
        Fence(run_id="r", owner="w1", epoch=old.epoch),
        Fence(run_id="r", owner="w2", epoch=new.epoch),
    )

    def checkpoint(as_of: Fence, step_id: str, position: int) -> Callable[[Tx], CancelFlag]:
        return lambda tx: tx.checkpoint(as_of, [step("r", step_id, position=position)], [])

    for n in range(6):
        for attempt in range(2):
            with pytest.raises(LeaseLostError):
                store.transact_sync(checkpoint(stale, f"stale{n}.{attempt}", n))
        store.transact_sync(checkpoint(fence, f"s{n}", n))
    assert [s.step_id for s in store.read_sync(lambda tx: tx.get_steps("r"))] == [f"s{n}" for n in range(6)]


class Refused(Exception):
    """An operation's own failure after it sent statements."""


def _fails_after_a_statement(tx: Tx) -> None:
    tx.get_run("r")  # sent (pipelined), then the operation gives up
    raise Refused()


def _duplicate_run(tx: Tx) -> None:
    add_run(tx, "r")  # a unique violation on the server, mid-transaction


FAILURES: dict[str, tuple[Callable[[Tx], object], type[BaseException]]] = {
    "python error": (_fails_after_a_statement, Refused),
    "unique violation": (_duplicate_run, StoreError),
}


@pytest.mark.parametrize("kind", sorted(FAILURES))
def test_any_failed_transaction_leaves_the_writer_able_to_commit(store: Store, kind: str) -> None:
    """The class: whatever makes a lone (pipelined) transaction fail, the
    operations after it on the same writer commit."""
    add_runs(store, ["r"])
    [held] = store.transact_sync(lambda tx: lease(tx, "w1", 1, NOW, NOW + 10))
    fence = Fence(run_id="r", owner="w1", epoch=held.epoch)
    failing, error = FAILURES[kind]
    for n in range(7):  # every statement crosses the prepare threshold at some point
        with pytest.raises(error):
            store.transact_sync(failing)
        store.transact_sync(lambda tx: tx.checkpoint(fence, [step("r", f"s{n}", position=n)], []))
    assert [s.step_id for s in store.read_sync(lambda tx: tx.get_steps("r"))] == [f"s{n}" for n in range(7)]
