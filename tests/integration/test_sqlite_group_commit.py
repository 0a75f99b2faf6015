"""SQLite's group commit, counted rather than timed (issue 18, session 8): a
batch of operations is one transaction without a savepoint per operation
(two statements fewer per operation of a queued run); one that fails is
rolled back whole and runs again with savepoints, so only the failing
operation fails; a batch cut short leaves no transaction open."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stepstone.errors import LeaseLostError
from stepstone.store.base import Tx
from stepstone.store.rows import Fence
from stepstone.store.sqlite import SqliteStore

from ..batches import submitted_together
from .test_large_payloads import leased
from .test_pg_transport import checkpoint

DEADLINE = 30.0


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    store = SqliteStore(str(tmp_path / "group.db"))
    store.migrate()
    yield store
    store.close()


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every statement run on a connection the store opens from now on."""
    seen: list[str] = []
    connect = SqliteStore.connect

    def traced(self: SqliteStore) -> sqlite3.Connection:
        conn = connect(self)
        conn.set_trace_callback(seen.append)
        return conn

    monkeypatch.setattr(SqliteStore, "connect", traced)
    return seen


def stored_steps(store: SqliteStore, run_id: str) -> list[str]:
    return [s.step_id for s in store.read_sync(lambda tx: tx.get_steps(run_id))]


def group_commit(store: SqliteStore, ops: list[Callable[[Tx], Any]]) -> list[Any]:
    """``ops`` in one turn of a loop (one batch of its lane); their results or exceptions."""

    async def commit() -> list[Any]:
        futures = await submitted_together(store, ops, DEADLINE)
        return await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), DEADLINE)

    return asyncio.run(commit())


def transactions(statements: list[str]) -> list[list[str]]:
    """The statements grouped by write transaction (``BEGIN IMMEDIATE`` .. end)."""
    found: list[list[str]] = []
    for text in statements:
        if text == "BEGIN IMMEDIATE":
            found.append([])
        if found:
            found[-1].append(text)
    return found


def test_a_group_commit_is_one_transaction_without_savepoints(
    store: SqliteStore, statements: list[str]
) -> None:
    fences = leased(store, 8)
    for round_ in range(5):
        statements.clear()
        results = group_commit(store, [checkpoint(f, f"s{round_}") for f in fences])
        assert not [r for r in results if isinstance(r, BaseException)]
        [batch] = transactions(statements)
        assert batch[-1] == "COMMIT"
        assert not [s for s in batch if "SAVEPOINT" in s], batch
        assert len(batch) == 2 + 2 * len(fences)  # BEGIN, a fence check and an upsert each, COMMIT
    assert stored_steps(store, fences[0].run_id) == [f"s{n}" for n in range(5)]


def test_a_failing_operation_in_a_group_fails_alone(store: SqliteStore, statements: list[str]) -> None:
    """A stale worker's checkpoint in the middle of a batch: the transaction
    is rolled back whole, then run again with a savepoint per operation; the
    others commit once."""
    fences = leased(store, 3)
    stale = Fence(run_id=fences[1].run_id, owner="w", epoch=fences[1].epoch - 1)
    for round_ in range(3):
        statements.clear()
        ops = [
            checkpoint(fences[0], f"a{round_}"),
            checkpoint(stale, f"x{round_}"),
            checkpoint(fences[2], f"c{round_}"),
        ]
        first, refused, last = group_commit(store, ops)
        assert isinstance(refused, LeaseLostError)
        assert not isinstance(first, BaseException) and not isinstance(last, BaseException)
        optimistic, guarded = transactions(statements)
        assert optimistic[-1] == "ROLLBACK" and not [s for s in optimistic if "SAVEPOINT" in s]
        assert guarded[-1] == "COMMIT" and guarded.count("SAVEPOINT op") == 3
    assert stored_steps(store, fences[0].run_id) == [f"a{n}" for n in range(3)]
    assert stored_steps(store, fences[1].run_id) == []
    assert stored_steps(store, fences[2].run_id) == [f"c{n}" for n in range(3)]


def test_a_batch_cut_short_leaves_no_transaction_open(store: SqliteStore) -> None:
    """An operation raising a ``BaseException`` (not an operation's failure)
    ends the batch, rolled back: the connection's next batch begins anew."""
    fences = leased(store, 2)

    def cut_short(tx: Tx) -> None:
        raise KeyboardInterrupt

    conn = store.connect()
    try:
        with pytest.raises(KeyboardInterrupt):
            store.write_batch(conn, [checkpoint(fences[0], "lost"), cut_short])
        assert not conn.in_transaction
        [(ok, _), (ok2, _)] = store.write_batch(conn, [checkpoint(f, "kept") for f in fences])
        assert ok and ok2
    finally:
        conn.close()
    assert stored_steps(store, fences[0].run_id) == ["kept"]
