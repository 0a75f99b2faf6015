"""A send's direct start of its one run written already taken (issue 18,
session 10): with a local worker's lease offered (``Sent.offer``), the run's
row, its queue item and its partition's hint are inserted as the take and
its settle would leave them (``record_event_starting`` with a lease), so no
UPDATE follows the INSERT; with a due item of its partition waiting before
it, they are inserted queued as before (queue order, fairness) and the other
workers are woken. What a take does is still true: lease owner and expiry,
epoch (fencing), deadlines, status and start time, the partition's hint.
SQLite, PostgreSQL and (the behaviour) the in-memory fake."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

import pytest

import stepstone as ss
from stepstone.errors import LeaseLostError
from stepstone.ids import new_id
from stepstone.registry import Registry
from stepstone.runtime import Sent, ingest, prepare
from stepstone.scheduler.leasing import lease, take_direct
from stepstone.store import postgres
from stepstone.store.base import Store, Tx
from stepstone.store.rows import (
    Fence,
    LeasedRun,
    LeaseTerms,
    NewEvent,
    NewRun,
    QueueSpec,
    RunFilter,
    RunStatus,
)
from tests.conftest import query, run_of
from tests.polling import wait_for

from .test_pg_notify import heard
from .test_statement_counts import SQL_ONLY, _sql, _stored_events, db_url, round_trips, statements
from .test_store_contract import NOW, step

__all__ = ["db_url", "heard", "round_trips", "statements"]  # (fixtures, used by name)

TTL = 60.0
WRITTEN_TAKEN = {  # a send of one event starting one run its local worker takes
    "sqlite": [
        "wait_keys",
        "claim_key",
        "insert_event",
        "due_ahead",  # (main: after the queue item; then take_items, mark_running, start_clock,
        "insert_started_run",  # settle_taken, and lower_partition, set_queue_spec: 13 in all)
        "insert_run_event",
        "insert_taken_item",
        "settle_started",
    ],
    "postgres": [
        "record_event_started",  # main: record_event_starting, insert_queue_item,
        "notify_untaken",  # take_runs_in_order, settle_taken, notify_untaken
    ],
}


def _registry() -> Registry:
    app = ss.App("taken", database_url="sqlite:///never-opened.db")  # only its registry is used
    for fid in ("plain", "other", "third"):
        app.function(id=fid, trigger=ss.on_event(fid))(lambda ctx: None)
    return app.registry


def _terms(now: float, owner: str = "w") -> LeaseTerms:
    return LeaseTerms(owner=owner, now=now, until=now + TTL, app_version="v1")


def _send(store: Store, event: ss.Event, at: float = NOW, *, offered: bool = True) -> list[LeasedRun]:
    """``App.send``'s transaction for one event with a free local worker (``_Direct``):
    its run written taken (``offered``), else queued then taken (main's way)."""
    prepared, registry = prepare([event], at), _registry()

    def op(tx: Tx) -> Callable[[], list[LeasedRun]]:
        sent = Sent(offer=lambda now, run: _terms(now)) if offered else Sent()
        ingest(tx, prepared, registry, at, sent=sent, at_once=True)
        if sent.started is not None:
            tx.taken_here([run.id for run in sent.queued])
            return sent.started
        asked, taken = take_direct(tx, "w", sent.queued, 5, at, at + TTL, "v1")
        tx.taken_here(asked)
        return taken

    return store.transact_sync(op)()


@SQL_ONLY
def test_a_run_written_taken_costs_no_update_after_its_insert(
    store: Store, statements: list[str], round_trips: Callable[[str], list[int]]
) -> None:
    """The send's statements: the take's UPDATEs (queue item, run, clocks) and
    the settle are gone; on PostgreSQL one statement and the conditional
    ``NOTIFY``, in one round trip (the ``COMMIT``'s)."""
    statements.clear()
    [taken] = _send(store, ss.Event("plain", id="e1", data={"n": 1}))
    assert statements == WRITTEN_TAKEN[store.dialect]
    if store.dialect == "postgres":
        assert round_trips(_sql("record_event_started")) == [0]
    assert taken.run == store.read_sync(lambda tx: tx.get_run(taken.run.id))
    assert taken.events == _stored_events(store, taken.run.id) and taken.events[0].id == "e1"
    assert taken.epoch == 1 and taken.steps == [] and taken.start_deadline is None
    assert store.read_sync(lambda tx: tx.queue_spec(taken.run.id)) == QueueSpec(partition_key="plain")


_RUN = "SELECT status, started_at, ended_at, attempt, epoch, app_version FROM runs WHERE id = '{}'"
_ITEM = (
    "SELECT owner, epoch, available_at, sort_at, fresh, start_deadline, finish_timeout, finish_deadline, "
    "wake_requested, cancel_requested FROM queue WHERE run_id = '{}'"
)
_PARTITION = "SELECT next_at, last_served FROM partitions WHERE key = '{}'"


def _new_run(function_id: str, at: float) -> NewRun:
    """A run of a send's shape, with a start deadline and a finish timeout (the
    take's clocks: ``clock_started``)."""
    return NewRun(
        id=new_id(at),
        function_id=function_id,
        event_seqs=[],
        event_ids=[f"e-{function_id}-{at}"],
        available_at=at,
        sort_at=at,
        created_at=at,
        start_deadline=at + 10,
        finish_timeout=30.0,
    )


def _record(
    store: Store, run: NewRun, at: float, terms: LeaseTerms | None, *, take: bool = True
) -> list[LeasedRun]:
    """The run's event and row, written taken on ``terms``; or (``None``)
    queued, then (``take``) taken by its send's take (``take_in_order_later``,
    settled)."""
    event = NewEvent(id=run.event_ids[0], name=run.function_id, data="{}", ts=int(at), received_at=at)

    def op(tx: Tx) -> Callable[[], list[LeasedRun]]:
        recorded = tx.record_event_starting(event, at + 3600, run, terms)
        if terms is not None or not take:
            return lambda: [] if (leased := recorded()[2]) is None else [leased]
        took = tx.take_in_order_later(_terms(at), run.function_id, [run.id], [run.id], settle=True)
        return lambda: took() or []

    return store.transact_sync(op)()


@SQL_ONLY
def test_a_run_written_taken_is_stored_as_a_take_leaves_it(db_url: str, store: Store) -> None:
    """Field by field, against the same run queued then taken by its send
    (main's direct start: take, clocks, settle) and by a lease pass: the
    run's status, start time, version and epoch; its item's owner, lease,
    epoch, freshness and deadlines; the partition's hint and service time.
    And what the send hands over is what a take returned."""
    at = NOW
    later = NOW + 100.0  # a leased item of "plain" whose lease ends after the new one's
    _record(store, _new_run("plain", at - 1), at - 1, LeaseTerms(owner="x", now=at - 1, until=later))
    written, queued, passed = _new_run("plain", at), _new_run("other", at), _new_run("third", at)
    [mine] = _record(store, written, at, _terms(at))
    [theirs] = _record(store, queued, at, None)
    assert _record(store, passed, at, None, take=False) == []
    [pass_took] = store.transact_sync(lambda tx: lease(tx, "w", _registry(), 5, at, at + TTL, "v1"))
    assert pass_took.run.id == passed.id

    def rows(run: NewRun) -> list[tuple[Any, ...]]:
        return [*query(db_url, _RUN.format(run.id)), *query(db_url, _ITEM.format(run.id))]

    assert rows(written) == rows(queued) == rows(passed)
    assert query(db_url, _RUN.format(written.id)) == [(RunStatus.RUNNING, at, None, 0, 1, "v1")]
    assert query(db_url, _ITEM.format(written.id)) == [("w", 1, at + TTL, at, 0, None, 30.0, at + 30, 0, 0)]
    assert query(db_url, _PARTITION.format("plain")) == [(at + TTL, at)]  # its earliest item's time
    assert query(db_url, _PARTITION.format("other")) == [(at + TTL, at)]
    for leased in (theirs, pass_took):  # what the send hands over: what a take returns
        assert (mine.epoch, mine.steps, mine.cancel_requested) == (leased.epoch, leased.steps, False)
        assert (mine.start_deadline, mine.output_bytes) == (leased.start_deadline, leased.output_bytes)
        assert (
            dataclasses.replace(
                mine.run, id=leased.run.id, function_id=leased.run.function_id, event_ids=leased.run.event_ids
            )
            == leased.run
        )
    assert mine.start_deadline == at + 10


def test_a_direct_start_with_a_due_item_ahead_writes_its_run_queued(store: Store) -> None:
    """Queue order: a due item of the partition waits, so the new run is
    written queued (never leased, its partition due) and a lease pass takes
    the earlier item first. All three stores."""
    _send(store, ss.Event("plain", id="e0"), NOW - TTL, offered=False)  # its lease lapses at NOW
    ahead = run_of_event(store, "e0")
    assert _send(store, ss.Event("plain", id="e1"), NOW + 1) == []
    late = run_of_event(store, "e1")
    run = store.read_sync(lambda tx: tx.get_run(late))
    assert run is not None and run.status == RunStatus.QUEUED and run.started_at is None
    assert store.transact_sync(lambda tx: tx.due_partitions(["plain"], NOW + 1, 10)) == ["plain"]
    took = store.transact_sync(lambda tx: lease(tx, "w2", _registry(), 1, NOW + 1, NOW + 61))
    assert [leased.run.id for leased in took] == [ahead]
    took = store.transact_sync(lambda tx: lease(tx, "w2", _registry(), 1, NOW + 1, NOW + 61))
    assert [(leased.run.id, leased.epoch) for leased in took] == [(late, 1)]  # never leased before


def run_of_event(store: Store, event_id: str) -> str:
    [run] = store.read_sync(lambda tx: tx.list_runs(RunFilter(event_id=event_id)))
    return run.id


def test_a_lapsed_lease_of_a_run_written_taken_is_fenced(store: Store) -> None:
    """The epoch a written-taken run carries is the one the fence checks: once
    its lease lapses, another worker's pass takes it (epoch 2) and the first
    owner's checkpoint raises, writing nothing. All three stores."""
    [taken] = _send(store, ss.Event("plain", id="e1"))
    run_id = taken.run.id
    assert store.transact_sync(lambda tx: lease(tx, "w2", _registry(), 5, NOW + 1, NOW + 61)) == []  # held
    [again] = store.transact_sync(lambda tx: lease(tx, "w2", _registry(), 5, NOW + TTL + 1, NOW + 200))
    assert (again.run.id, again.epoch) == (run_id, 2)
    mine = Fence(run_id=run_id, owner="w", epoch=taken.epoch, token="t")
    with pytest.raises(LeaseLostError):
        store.transact_sync(lambda tx: tx.checkpoint(mine, [step(run_id, "a")], []))
    assert store.read_sync(lambda tx: tx.get_steps(run_id)) == []
    theirs = Fence(run_id=run_id, owner="w2", epoch=again.epoch, token="t2")
    store.transact_sync(lambda tx: tx.checkpoint(theirs, [step(run_id, "a")], []))
    assert [s.step_id for s in store.read_sync(lambda tx: tx.get_steps(run_id))] == ["a"]


@pytest.mark.parametrize("taken", [True, False], ids=["taken", "due-item-ahead"])
def test_a_run_written_taken_notifies_no_one_and_one_written_queued_does(
    pg_url: str, heard: Callable[[], list[str]], taken: bool
) -> None:
    """PostgreSQL: the send's conditional ``NOTIFY`` (``notify_untaken``) still
    tells: no one is woken for a run its send took; other processes are for
    one written queued behind a due item."""
    store = postgres.PostgresStore.from_url(pg_url)
    try:
        if not taken:
            _send(store, ss.Event("plain", id="e0"), NOW - TTL - 1, offered=False)  # lapsed at NOW - 1
        heard()
        leased = _send(store, ss.Event("plain", id="e1"))
        assert heard() == ([] if taken else [""])
        assert len(leased) == (1 if taken else 0)
    finally:
        store.close()


@SQL_ONLY
def test_an_app_send_with_a_local_worker_writes_its_run_taken(
    make_app: Callable[..., ss.App], statements: list[str]
) -> None:
    """``App.send`` with a free local worker: the run is written taken (no take
    statement), handed over, and ends; the list by event is answered from the
    send's rows, the same as a read gives."""
    app = make_app()
    gate = threading.Event()

    @app.function(id="one", trigger=ss.on_event("go"))
    async def one(ctx: ss.Context) -> int:
        done: int = await ctx.step.run("a", lambda: int(gate.wait(10)))
        return done

    app.start(concurrency=2)
    try:
        statements.clear()
        [event_id] = app.send(ss.Event("go"))
        [listed] = app.runs.list(event_id=event_id)
        assert not {"take_items", "take_runs", "take_runs_in_order", "settle_taken"} & set(statements)
        wait_for(lambda: app.runs.get(listed.id).status == "running", 10, "the run")
        stored = app.runs.get(listed.id)
        assert (stored.status, stored.started_at, stored.app_version) == (
            listed.status,
            listed.started_at,
            listed.app_version,
        )
        gate.set()
        assert app.runs.wait(listed.id, timeout="10s").output == 1
        assert run_of(app, event_id).id == listed.id
    finally:
        gate.set()
        app.stop()


def test_a_lowered_hint_keeps_the_partitions_service_time(store: Store) -> None:
    """Fairness: lowering a partition's hint (a new item, a wake-up) leaves its
    last service time as a pass or a direct start set it, so the least
    recently served partition still comes first. (``partition_lowered`` and
    ``partition_settled`` are fragments side by side: only the second sets
    ``last_served``.) All three stores."""
    _send(store, ss.Event("plain", id="e1"), NOW - 10)  # "plain" served first
    _send(store, ss.Event("other", id="e2"), NOW)  # "other" after it (its key sorts first)
    store.transact_sync(lambda tx: tx.lower_partition("plain", "plain", None, NOW + 1))
    store.transact_sync(lambda tx: tx.lower_partition("other", "other", None, NOW + 1))
    due = store.transact_sync(lambda tx: tx.due_partitions(["plain", "other"], NOW + 1, 10))
    assert due == ["plain", "other"]  # the least recently served first


@SQL_ONLY
def test_a_send_offered_a_lease_writes_nothing_for_a_duplicate_or_an_awaited_event(
    db_url: str, store: Store
) -> None:
    """A duplicate id, or an event a wait is on, with a local worker's lease
    offered (on PostgreSQL the one statement ``record_event_started``): no
    row of any table changes, no run is taken, and the awaited event's name
    comes back (the caller sends it again the usual way). On PostgreSQL the
    awaited send's statement still returns a row (its name), so a store
    counting commits counts that empty transaction: an artefact of the
    count, not a second write."""
    from .stateful_harness import TABLES
    from .test_store_contract import wait

    def tables() -> dict[str, list[tuple[Any, ...]]]:
        return {t: sorted(query(db_url, f"SELECT * FROM {t}"), key=repr) for t in TABLES}

    def sent_taking(event: ss.Event) -> tuple[list[LeasedRun], str | None]:
        prepared, registry = prepare([event], NOW), _registry()

        def op(tx: Tx) -> Sent:
            sent = Sent(offer=lambda now, run: _terms(now))
            ingest(tx, prepared, registry, NOW, sent=sent, at_once=True)
            tx.taken_here([run.id for run in sent.queued])
            return sent

        sent = store.transact_sync(op)
        assert sent.started is not None
        return sent.started(), sent.awaited()

    [first] = _send(store, ss.Event("plain", id="e1"))
    before = tables()
    assert sent_taking(ss.Event("plain", id="e1")) == ([], None)
    assert tables() == before
    store.transact_sync(lambda tx: tx.insert_wait(wait(first.run.id, "w", event_name="plain")))
    before = tables()
    assert sent_taking(ss.Event("plain", id="e2")) == ([], "plain")
    assert tables() == before
