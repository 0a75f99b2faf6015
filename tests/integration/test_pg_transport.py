"""PostgreSQL's transport, counted rather than timed: the round trips and
statements of a write transaction (a group commit's batch in one pipelined
transaction, no savepoints unless an operation fails), what a failure costs
the writer's connection (kept, not replaced), and an event loop's read
answered before its ``COMMIT``'s round trip."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest

from stepstone.bulk import bulk_action
from stepstone.errors import LeaseLostError
from stepstone.store import pgwire
from stepstone.store.base import Tx
from stepstone.store.postgres import PostgresStore
from stepstone.store.rows import ACTIVE_STATUSES, Fence, RunStatus

from ..batches import (
    DEADLINE,
    checkpoint,
    group_commit,
    only_the_stale_one_lost,
    stale_in_the_middle,
    stored_steps,
)
from .test_large_payloads import leased
from .test_store_contract import NOW, add_runs, registry


@dataclass
class Transaction:
    """One write transaction as the wire saw it."""

    ops: int
    trips: int = 0
    statements: list[str] = field(default_factory=list)


class Wire:
    """Counts, per write transaction of ``store``, the statements sent and the
    round trips waited for: a statement run on psycopg's ordinary path (the
    savepoint fallback), and a sync point of the statement path
    (``pgwire.Wire.sync`` with statements outstanding). Also counts the
    writers' connections opened."""

    def __init__(self, store: PostgresStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.transactions: list[Transaction] = []
        self.connections = 0
        local = threading.local()
        execute, send, sync = psycopg.Connection.execute, pgwire.Wire.execute, pgwire.Wire.sync
        write, connect = store._write, store._writers.connect

        def counted_write(conn: Any, ops: list[Callable[[Any], Any]]) -> Any:
            local.now = Transaction(len(ops))
            try:
                return write(conn, ops)
            finally:
                self.transactions.append(local.now)
                local.now = None

        def counted_execute(conn: Any, query: Any, params: Any = None, **kwargs: Any) -> Any:
            now = getattr(local, "now", None)
            if now is not None:
                now.statements.append(query.decode() if isinstance(query, bytes) else str(query))
                now.trips += 1
            return execute(conn, query, params, **kwargs)

        def counted_send(wire: pgwire.Wire, query: str, params: Any = None) -> Any:
            now = getattr(local, "now", None)
            if now is not None:
                now.statements.append(query)
            return send(wire, query, params)

        def counted_sync(wire: pgwire.Wire) -> None:
            now = getattr(local, "now", None)
            if now is not None and wire.sent:
                now.trips += 1
            sync(wire)

        def counted_connect() -> Any:
            self.connections += 1
            return connect()

        monkeypatch.setattr(store, "_write", counted_write)
        monkeypatch.setattr(store._writers, "connect", counted_connect)
        monkeypatch.setattr(psycopg.Connection, "execute", counted_execute)
        monkeypatch.setattr(pgwire.Wire, "execute", counted_send)
        monkeypatch.setattr(pgwire.Wire, "sync", counted_sync)


@pytest.fixture
def store(pg_url: str) -> Iterator[PostgresStore]:
    """One writer, so that operations queued behind a held one form one batch."""
    store = PostgresStore.from_url(pg_url + "?writers=1")
    yield store
    store.close()


def test_a_group_commit_is_one_round_trip_without_savepoints(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    fences = leased(store, 8)
    wire = Wire(store, monkeypatch)
    for round_ in range(7):
        results = group_commit(store, [checkpoint(f, f"s{round_}") for f in fences])
        assert not [r for r in results if isinstance(r, BaseException)]
        batch = wire.transactions[-1]
        assert batch.ops == len(fences), "not one group commit"
        assert batch.trips == 1, batch
        assert not [s for s in batch.statements if "SAVEPOINT" in s]
    assert stored_steps(store, fences[0].run_id) == [f"s{n}" for n in range(7)]


def test_a_failing_operation_in_a_group_fails_alone_on_the_same_connection(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stale worker's checkpoint (its fence raises on the server) in the
    middle of a batch: the pipelined transaction is rolled back whole, then
    run again with a savepoint per operation; the others commit, on the
    writer's connection (its record of prepared statements stays right:
    every round commits on it)."""
    fences = leased(store, 3)
    wire = Wire(store, monkeypatch)
    for round_ in range(7):
        stale_in_the_middle(store, fences, round_)
        assert any("SAVEPOINT" in s for s in wire.transactions[-1].statements)  # the second attempt
    only_the_stale_one_lost(store, fences, 7)
    assert wire.connections == 0  # the writer's connection was kept throughout
    group_commit(store, [checkpoint(f, "after") for f in (fences[0], fences[2])])
    assert wire.transactions[-1].trips == 1


def test_a_refused_lone_commit_keeps_the_writers_connection(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    [fence] = leased(store, 1)
    stale = Fence(run_id=fence.run_id, owner="w", epoch=fence.epoch - 1)
    wire = Wire(store, monkeypatch)
    for n in range(7):
        with pytest.raises(LeaseLostError):
            store.transact_sync(checkpoint(stale, f"x{n}"))
        store.transact_sync(checkpoint(fence, f"s{n}"))
    assert stored_steps(store, fence.run_id) == [f"s{n}" for n in range(7)]
    assert wire.connections == 0


def test_a_loops_read_has_its_value_before_the_commits_round_trip(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The read's ``COMMIT`` is held on its reader thread: the loop still has
    the value (a read-only snapshot's results stand whatever the ``COMMIT``
    meets)."""
    add_runs(store, ["r"])
    holding, gate, released = threading.Event(), threading.Event(), threading.Event()
    execute = pgwire.Wire.execute

    def held(wire: pgwire.Wire, query: str, params: Any = None) -> Any:
        if query == "COMMIT" and threading.current_thread().name.startswith("stepstone-pg-read"):
            holding.set()
            gate.wait(DEADLINE)
            released.set()
        return execute(wire, query, params)

    monkeypatch.setattr(pgwire.Wire, "execute", held)

    async def read() -> Any:
        return await asyncio.wait_for(store.read(lambda tx: tx.get_run("r")), DEADLINE)

    try:
        run = asyncio.run(read())
        assert run is not None and run.id == "r"
        assert holding.wait(DEADLINE)  # the COMMIT is sent after the value is out
        assert not released.is_set()
    finally:
        gate.set()


def test_a_bulk_page_run_again_after_a_rollback_acts_on_the_same_page(store: PostgresStore) -> None:
    """A group commit in which another operation fails runs the whole batch
    again: a bulk action's page, rolled back once, still acts on its own runs
    and counts them once."""
    add_runs(store, ["a", "b", "c"])
    bulk = bulk_action(
        "cancel",
        NOW,
        registry("f"),
        function_id="f",
        status=ACTIVE_STATUSES,
        since=None,
        until=None,
        if_=None,
    )
    page = bulk.page_op()

    def rolled_back(tx: Tx) -> None:
        page(tx)
        raise RuntimeError("a neighbour failed: the batch is rolled back")

    with pytest.raises(RuntimeError):
        store.transact_sync(rolled_back)
    store.transact_sync(page)
    assert (bulk.done, bulk.examined, bulk.finished) == (3, 3, True)
    runs = store.read_sync(lambda tx: [tx.get_run(run_id) for run_id in "abc"])
    statuses = {run.id: run.status for run in runs if run is not None}
    assert statuses == dict.fromkeys("abc", RunStatus.CANCELLED)
