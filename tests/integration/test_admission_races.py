"""Admission paths that change a queued run (debounce, batch) racing a lease.

A debounce or batch join rewrites a pending run: its events and its due time.
Once a lease pass took the run, its handler holds the events it read then, so
the join must start a new run instead; on PostgreSQL a lease pass may hold the
run uncommitted while the join looks at it (issue 12 defect 5). Driven through
the store with explicit times, on both stores.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import stepstone as ss
from stepstone.registry import Registry
from stepstone.runtime import cancel_run, ingest, prepare
from stepstone.scheduler.leasing import lease
from stepstone.scheduler.maintenance import timeouts_op
from stepstone.store.base import Store, Tx
from stepstone.store.rows import RunFilter

from ..conftest import query
from ..polling import wait_for
from .test_postgres import uncommitted

NOW = 1_000_000.0
PERIOD = 10.0


def _registry(kind: str) -> Registry:
    app = ss.App("races", database_url="sqlite:///never-opened.db")  # only its registry is used
    if kind == "debounce":
        app.function(id="acc", trigger=ss.on_event("e"), debounce=ss.Debounce(period=PERIOD))(
            lambda ctx: None
        )
    else:
        app.function(id="acc", trigger=ss.on_event("e"), batch=ss.Batch(max_size=5, timeout=PERIOD))(
            lambda ctx: None
        )
    return app.registry


KINDS = ("debounce", "batch")


def _send(store: Store, registry: Registry, event_id: str, now: float) -> None:
    prepared = prepare(ss.Event("e", {"n": event_id}, id=event_id), now)
    store.transact_sync(lambda tx: ingest(tx, prepared, registry, now))


def _events_by_run(store: Store) -> dict[str, list[str]]:
    """Each run of ``acc``: the ids of the events it was started with."""

    def op(tx: Tx) -> dict[str, list[str]]:
        return {r.id: list(r.event_ids) for r in tx.list_runs(RunFilter(function_id="acc", limit=10))}

    return store.read_sync(op)


def _check_nothing_lost(
    db_url: str, store: Store, leased_id: str, leased_events: list[str], until: float
) -> None:
    """The leased run keeps the events its handler read and its lease; the late
    event starts a run of its own."""
    runs = _events_by_run(store)
    assert runs[leased_id] == leased_events
    others = [events for run_id, events in runs.items() if run_id != leased_id]
    assert others == [["late"]], runs
    assert query(db_url, f"SELECT owner, available_at FROM queue WHERE run_id = '{leased_id}'") == [
        ("w1", until)
    ]


@pytest.mark.parametrize("kind", KINDS)
def test_a_join_after_a_lease_starts_a_new_run(db_url: str, store: Store, kind: str) -> None:
    registry = _registry(kind)
    _send(store, registry, "first", NOW)
    due, until = NOW + PERIOD, NOW + PERIOD + 60
    [taken] = store.transact_sync(lambda tx: lease(tx, "w1", registry, 1, due, until))
    assert [e.id for e in taken.events] == ["first"]
    _send(store, registry, "late", due)
    _check_nothing_lost(db_url, store, taken.run.id, ["first"], until)


def _blocked_backends(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT COUNT(*) FROM pg_locks WHERE NOT granted").fetchone()
        return int(row[0]) if row else 0


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
@pytest.mark.parametrize("kind", KINDS)
def test_a_join_racing_an_uncommitted_lease_loses_no_event(db_url: str, store: Store, kind: str) -> None:
    """The lease pass has taken the pending run but not committed when the join
    looks at it: the join waits for the lease, sees the run is no longer pending
    and starts a new run; it never rewrites the leased row."""
    registry = _registry(kind)
    _send(store, registry, "first", NOW)
    due, until = NOW + PERIOD, NOW + PERIOD + 60
    taken: list[Any] = []
    joined = threading.Event()
    failures: list[BaseException] = []

    def join() -> None:
        try:
            _send(store, registry, "late", due)
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            failures.append(exc)
        joined.set()

    thread = threading.Thread(target=join)
    with uncommitted(db_url, lambda tx: taken.extend(lease(tx, "w1", registry, 1, due, until))):
        assert len(taken) == 1
        thread.start()
        # The join must wait for the lease's row (or not touch it at all).
        wait_for(lambda: joined.is_set() or _blocked_backends(db_url) > 0, 10, "the join to wait or finish")
    thread.join(10)
    assert not failures, failures
    assert [e.id for e in taken[0].events] == ["first"]
    _check_nothing_lost(db_url, store, taken[0].run.id, ["first"], until)


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
@pytest.mark.parametrize("kind", KINDS)
def test_a_lease_racing_an_uncommitted_join_takes_the_joined_events(
    db_url: str, store: Store, kind: str
) -> None:
    """The other order: the join holds the pending run when a lease pass comes.
    The pass skips it (it would read the events the join is changing); after the
    join commits, the run starts with every event the join gave it."""
    registry = _registry(kind)
    _send(store, registry, "first", NOW)
    due = NOW + PERIOD
    prepared = prepare(ss.Event("e", {"n": "late"}, id="late"), due)
    with uncommitted(db_url, lambda tx: ingest(tx, prepared, registry, due)):
        assert store.transact_sync(lambda tx: lease(tx, "w1", registry, 1, due, due + 60)) == []
    later = due + PERIOD  # a debounce join moved the start back by one period
    [taken] = store.transact_sync(lambda tx: lease(tx, "w1", registry, 1, later, later + 60))
    expected = ["late"] if kind == "debounce" else ["first", "late"]
    assert [e.id for e in taken.events] == expected
    assert _events_by_run(store) == {taken.run.id: expected}


def _singleton_registry() -> Registry:
    app = ss.App("races", database_url="sqlite:///never-opened.db")  # only its registry is used
    app.function(id="acc", trigger=ss.on_event("e"), singleton=ss.Singleton(key=None, mode="cancel"))(
        lambda ctx: None
    )
    return app.registry


def _cancel_by_singleton(store: Store, registry: Registry, holder: str, now: float) -> None:
    _send(store, registry, "late", now)  # a new run replaces the holder


def _cancel_by_operator(store: Store, registry: Registry, holder: str, now: float) -> None:
    store.transact_sync(lambda tx: cancel_run(tx, holder, now, registry))


CANCELS = {"singleton": _cancel_by_singleton, "operator": _cancel_by_operator}


def _racing_a_held_lease(
    db_url: str, registry: Registry, at: float, action: Callable[[], object]
) -> list[Any]:
    """Run ``action`` in another thread while a lease pass at ``at`` holds its
    transaction open (until the action waits on it or is done); returns what
    the pass leased. The action's failure is raised here."""
    taken: list[Any] = []
    done = threading.Event()
    failures: list[BaseException] = []

    def run() -> None:
        try:
            action()
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            failures.append(exc)
        done.set()

    thread = threading.Thread(target=run)
    with uncommitted(db_url, lambda tx: taken.extend(lease(tx, "w1", registry, 1, at, at + 60))):
        thread.start()
        wait_for(
            lambda: done.is_set() or _blocked_backends(db_url) > 0, 10, "the racing action to wait or finish"
        )
    thread.join(10)
    assert not failures, failures
    return taken


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
@pytest.mark.parametrize("how", sorted(CANCELS))
def test_a_cancel_racing_an_uncommitted_lease_flags_the_leased_run(
    db_url: str, store: Store, how: str
) -> None:
    """A cancellation (a singleton ``cancel`` admission, or an operator's) that
    looks at a queued run while a lease pass holds it uncommitted must not end
    the run under the worker that is about to execute it (the worker would run
    a step of a cancelled run): it waits, sees the lease and flags the run, which
    the worker cancels at its next step boundary."""
    registry = _singleton_registry()
    _send(store, registry, "first", NOW)
    [holder] = _events_by_run(store)
    taken = _racing_a_held_lease(
        db_url, registry, NOW, lambda: CANCELS[how](store, registry, holder, NOW + 1)
    )
    assert [lr.run.id for lr in taken] == [holder]
    assert query(db_url, f"SELECT owner, cancel_requested FROM queue WHERE run_id = '{holder}'") == [
        ("w1", 1)
    ]
    assert query(db_url, f"SELECT status FROM runs WHERE id = '{holder}'") == [("running",)]


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_a_start_timeout_racing_an_uncommitted_lease_leaves_the_started_run(
    db_url: str, store: Store
) -> None:
    """The start-timeout duty read the run as queued past its deadline while a
    lease pass was starting it: the duty waits for the lease and leaves the
    started run alone (it must not delete its queue item under the worker)."""
    app = ss.App("races", database_url="sqlite:///never-opened.db")  # only its registry is used
    app.function(id="acc", trigger=ss.on_event("e"), timeouts=ss.Timeouts(start="1s"))(lambda ctx: None)
    registry = app.registry
    _send(store, registry, "first", NOW)
    [run_id] = _events_by_run(store)
    late = NOW + 2
    taken = _racing_a_held_lease(
        db_url, registry, late, lambda: store.transact_sync(timeouts_op(late, registry))
    )
    assert [lr.run.id for lr in taken] == [run_id]
    assert query(db_url, f"SELECT owner, cancel_requested FROM queue WHERE run_id = '{run_id}'") == [
        ("w1", 0)
    ]
    assert query(db_url, f"SELECT status FROM runs WHERE id = '{run_id}'") == [("running",)]
