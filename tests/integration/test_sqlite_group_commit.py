"""SQLite's group commit, counted rather than timed (issue 18, session 8): a
batch of operations is one transaction without a savepoint per operation
(two statements fewer per operation of a queued run); one that fails is
rolled back whole and runs again with savepoints, so only the failing
operation fails; a batch cut short leaves no transaction open. A lease pass
alone in its batch commits without the fsync (``batching.Unsynced``); a
step's checkpoint never does."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import stepstone as ss
from stepstone.store.base import Tx
from stepstone.store.batching import Unsynced
from stepstone.store.sqlite import SqliteStore

from ..batches import checkpoint, group_commit, only_the_stale_one_lost, stale_in_the_middle, stored_steps
from ..polling import wait_for
from .test_large_payloads import leased

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
    for round_ in range(3):
        statements.clear()
        stale_in_the_middle(store, fences, round_)
        optimistic, guarded = transactions(statements)
        assert optimistic[-1] == "ROLLBACK" and not [s for s in optimistic if "SAVEPOINT" in s]
        assert guarded[-1] == "COMMIT" and guarded.count("SAVEPOINT op") == 3
    only_the_stale_one_lost(store, fences, 3)


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


def _synced_spans(statements: list[str]) -> list[tuple[bool, list[str]]]:
    """Each write transaction's statements, with whether it committed synced
    (not between ``PRAGMA synchronous = NORMAL`` and the setting's return)."""
    spans: list[tuple[bool, list[str]]] = []
    relaxed = False
    for text in statements:
        if text.startswith("PRAGMA synchronous = "):
            relaxed = text.endswith("NORMAL")
        elif text == "BEGIN IMMEDIATE":
            spans.append((not relaxed, []))
        if spans:
            spans[-1][1].append(text)
    return spans


def test_a_lease_pass_alone_commits_without_the_fsync_and_a_step_never_does(
    tmp_path: Path, statements: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker draining queued runs at ``synchronous=full``: its lease
    passes alone in their batches commit at ``NORMAL``; every batch with
    anything else (a checkpoint, an end) commits synced, and the connection
    is back at ``FULL`` after."""
    batches: list[tuple[bool, bool]] = []  # (every op a lease pass, committed synced)
    write = SqliteStore._write

    def recorded(self: SqliteStore, conn: sqlite3.Connection, ops: list[Any]) -> Any:
        begun = len(statements)
        try:
            return write(self, conn, ops)
        finally:
            [(synced, _)] = _synced_spans(statements[begun:]) or [(True, [])]
            batches.append((all(isinstance(op, Unsynced) for op in ops), synced))

    monkeypatch.setattr(SqliteStore, "_write", recorded)
    app = ss.App("unsynced", database_url=f"sqlite:///{tmp_path}/u.db")

    async def one() -> int:
        return 1

    @app.function(id="two", trigger=ss.on_event("two"))
    async def two(ctx: ss.Context) -> int:
        return int(await ctx.step.run("a", one)) + int(await ctx.step.run("b", one))

    try:
        app.send([ss.Event("two") for _ in range(30)])
        app.start(concurrency=10)
        wait_for(lambda: len(app.runs.list(status="completed", limit=100)) == 30, 30, "30 runs completed")
        app.stop()
    finally:
        app.close()
    assert (True, False) in batches and (False, True) in batches
    assert all(synced != passes for passes, synced in batches), batches
    assert statements.count("PRAGMA synchronous = NORMAL") == statements.count("PRAGMA synchronous = FULL")


def test_a_lease_pass_batched_with_a_checkpoint_commits_synced(
    store: SqliteStore, statements: list[str]
) -> None:
    fences = leased(store, 1)
    conn = store.connect()
    statements.clear()
    try:
        outcomes = store.write_batch(conn, [Unsynced(lambda tx: None), checkpoint(fences[0], "s")])
        assert all(ok for ok, _ in outcomes)
        alone = store.write_batch(conn, [Unsynced(lambda tx: tx.get_run(fences[0].run_id))])
        assert alone[0][0]
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL again
    finally:
        conn.close()
    [(mixed, _), (relaxed, _)] = _synced_spans(statements)
    assert mixed and not relaxed
