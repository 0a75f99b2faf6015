"""A send of one event that starts one run of a function without flow rules
(``ingest``'s ``at_once``, what ``App.send`` does): on PostgreSQL nothing is
read before its ``COMMIT`` (``record_event_starting``: the event and the run's
row in one statement; its queue item, take, settle and conditional ``NOTIFY``
behind it), one round trip in all; what it does not write (a duplicate, an
event a wait is on) it does not write at all, and an awaited event is sent
again the usual way. SQLite, PostgreSQL and (the behaviour) the in-memory fake."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import stepstone as ss
from stepstone.runtime import Sent, ingest, prepare
from stepstone.scheduler.leasing import take_direct
from stepstone.store.base import Store, Tx
from stepstone.store.rows import LeasedRun, NewEvent, QueueSpec, RunFilter
from tests.conftest import run_of
from tests.polling import wait_for

from .test_statement_counts import (
    SEND,
    SQL_ONLY,
    _registry,
    _sql,
    _stored_events,
    db_url,
    round_trips,
    statements,
)
from .test_store_contract import NOW, wait

__all__ = ["db_url", "round_trips", "statements"]  # (fixtures, used by name)

SEND_AT_ONCE = {  # the same, its one event starting one run: ingest's at_once
    "sqlite": [
        "wait_keys",
        "claim_key",
        "insert_event",
        *SEND["sqlite"][3:],
    ],
    "postgres": [
        "record_event_starting",  # event, run (with its spec), hint; nothing read before the COMMIT
        "insert_queue_item",
        "take_runs_in_order",
        "settle_taken",
        "notify_untaken",  # (taken_here: a NOTIFY only for a run left untaken)
    ],
}


def _send_at_once(store: Store, event: ss.Event, at: float = NOW) -> tuple[list[LeasedRun], str | None]:
    """``App.send``'s transaction for one event with a free local worker: the
    runs taken and, if nothing was written for a wait on it, the event's name."""
    prepared, registry = prepare([event], at), _registry()

    def op(tx: Tx) -> tuple[Callable[[], list[LeasedRun]], Sent]:
        sent = Sent()
        ingest(tx, prepared, registry, at, sent=sent, at_once=True)
        asked, taken = take_direct(tx, "w", sent.queued, 5, at, at + 60)
        tx.taken_here(asked)
        return taken, sent

    taken, sent = store.transact_sync(op)
    return taken(), sent.awaited()


@SQL_ONLY
def test_a_send_of_one_event_starting_one_run_reads_nothing_before_its_commit(
    db_url: str, store: Store, statements: list[str], round_trips: Callable[[str], list[int]]
) -> None:
    """``ingest(at_once=True)`` (``record_event_starting``): on PostgreSQL the
    send's statements all go out with its ``COMMIT`` (one round trip in all);
    the run taken is the one a read gives, with its event as stored."""
    statements.clear()
    [taken], awaited = _send_at_once(store, ss.Event("plain", id="e1", data={"n": 1.5, "s": "é"}))
    assert awaited is None
    assert statements == SEND_AT_ONCE[store.dialect]
    if store.dialect == "postgres":
        assert round_trips(_sql("record_event_starting")) == [0]  # session 9 before: 2 (main: 3)
    assert taken.events == _stored_events(store, taken.run.id) and taken.events[0].id == "e1"
    assert taken.run == store.read_sync(lambda tx: tx.get_run(taken.run.id))
    assert store.read_sync(lambda tx: tx.queue_spec(taken.run.id)) == QueueSpec(partition_key="plain")


def test_a_send_at_once_of_an_event_seen_or_awaited_writes_nothing(store: Store) -> None:
    """A duplicate id writes nothing more (its run is neither written nor taken);
    an event a wait is on writes nothing at all, its name given back (the
    caller sends it again the usual way, resolving the wait)."""
    [first], _ = _send_at_once(store, ss.Event("plain", id="e1"))
    assert _send_at_once(store, ss.Event("plain", id="e1")) == ([], None)
    items = store.transact_sync(lambda tx: tx.partition_items("plain", NOW + 61, 10))
    assert [item.run_id for item in items] == [first.run.id]  # (its lease over at NOW + 60)
    assert [r.id for r in store.read_sync(lambda tx: tx.list_runs(RunFilter(event_id="e1")))] == [
        first.run.id
    ]
    store.transact_sync(lambda tx: tx.insert_wait(wait(first.run.id, "w", event_name="plain")))
    # (Its hint next due later, as a lease pass leaves it: on PostgreSQL a
    # send's take only ever lowers a hint, test_partition_hint_race.py.)
    store.transact_sync(lambda tx: tx.settle_partition("plain", NOW, NOW + 60, NOW + 60))
    assert _send_at_once(store, ss.Event("plain", id="e2")) == ([], "plain")
    assert store.read_sync(lambda tx: tx.list_runs(RunFilter(event_id="e2"))) == []
    assert store.transact_sync(lambda tx: tx.claim_key("event:e2", "x", NOW + 30, NOW)) is None  # not claimed
    assert store.transact_sync(lambda tx: tx.due_partitions(["plain"], NOW + 1, 10)) == []  # no hint lowered


@SQL_ONLY
def test_a_send_whose_event_a_run_waits_for_is_sent_again_and_resolves_the_wait(
    db_url: str, make_app: Callable[..., ss.App], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``App.send`` sends one event at once (``ingest``'s ``at_once``); a wait
    on its name (a wait key) makes that transaction write nothing, and the
    send goes again the usual way (the wait resolved, the event's own run
    started, once). Its name is then sent the usual way, until a send finds
    no wait key on it (retention prunes a key no wait uses)."""
    app = make_app()
    tried: list[str] = []  # the events sent at once

    @app.function(id="waiter", trigger=ss.on_event("start"))
    async def waiter(ctx: ss.Context) -> bool:
        return await ctx.step.wait_for_event("w", event="paid", timeout="1h") is not None

    @app.function(id="payer", trigger=ss.on_event("paid"))
    async def payer(ctx: ss.Context) -> int:
        return 1

    app.start(concurrency=4)
    tx_class = type(app.store.transact_sync(lambda tx: tx))  # (the store's Tx class)
    record = tx_class.record_event_starting

    def counted(tx: Any, event: NewEvent, *args: Any) -> Any:
        tried.append(event.id)
        return record(tx, event, *args)

    monkeypatch.setattr(tx_class, "record_event_starting", counted)
    waiting = run_of(app, app.send(ss.Event("start", id="s"))[0])
    wait_for(lambda: app.store.read_sync(lambda tx: tx.wait_keys("paid")) != [], 10, "the wait")
    [paid] = app.send(ss.Event("paid", id="p1"))
    assert tried == ["s", "p1"]  # p1 tried at once, then sent again
    assert app.runs.wait(waiting.id, timeout="10s").output is True
    assert app.runs.wait(run_of(app, paid).id, timeout="10s").status == "completed"
    assert len(app.runs.list(event_id=paid)) == 1
    app.send(ss.Event("paid", id="p2"))  # the usual way
    assert tried == ["s", "p1"]
    assert app.store.transact_sync(lambda tx: tx.prune_wait_keys(10)) == 1  # the wait's key, unused
    app.send(ss.Event("paid", id="p3"))  # the usual way: it finds no wait key
    app.send(ss.Event("paid", id="p4"))  # at once again
    assert tried == ["s", "p1", "p4"]
    assert all(len(app.runs.list(event_id=e)) == 1 for e in ("p2", "p3", "p4"))
