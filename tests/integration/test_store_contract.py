"""The store contract: every ``Tx`` operation and the ``Store`` plumbing, run
against each backend: SQLite, PostgreSQL and the in-memory fake of the unit
tier (tests/fakes/memory.py), so the fake cannot drift from the real stores.
Tests of what the fake does not implement (the function and worker
registries, SQL drivers, many connections) are pinned to the SQL stores with
``@SQL_ONLY``."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import stepstone as ss
from stepstone.errors import LeaseLostError, StoreError, StoreUnavailableError
from stepstone.registry import Registry
from stepstone.scheduler.leasing import lease as lease_pass
from stepstone.store import make_store
from stepstone.store.base import Store, Tx
from stepstone.store.rows import (
    CancelFlag,
    Fence,
    LeasedRun,
    LeaseTerms,
    NewEvent,
    NewRun,
    QueueSpec,
    RunEnd,
    RunStatus,
    SpanRow,
    StepKind,
    StepRow,
    StepStatus,
    WaitKind,
    WaitRow,
)
from stepstone.store.viewrows import AppRow, WorkerRow
from tests.conftest import BACKENDS, MEMORY, backend_url

NOW = 1_000_000.0
SQL_ONLY = pytest.mark.parametrize("db_url", BACKENDS, indirect=True)


@pytest.fixture(params=[*BACKENDS, MEMORY])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Every backend, and the in-memory fake (conftest's ``store`` opens it)."""
    return backend_url(request, request.param, tmp_path)


def registry(*function_ids: str) -> Registry:
    app = ss.App("contract", database_url="sqlite:///never-opened.db")  # only its registry is used
    for function_id in function_ids:
        app.function(id=function_id)(lambda ctx: None)
    return app.registry


F_ONLY = registry("f")


def lease(
    tx: Tx, owner: str, wanted: int, now: float, until: float, app_version: str | None = None
) -> list[LeasedRun]:
    """A worker's lease pass over function ``f``, sorted by run id."""
    return sorted(lease_pass(tx, owner, F_ONLY, wanted, now, until, app_version), key=lambda lr: lr.run.id)


def add_run(
    tx: Tx,
    run_id: str,
    *,
    function_id: str = "f",
    at: float = NOW,
    sort_at: float | None = None,
    status: RunStatus = RunStatus.QUEUED,
    spec: QueueSpec | None = None,
) -> None:
    seq = tx.insert_event(NewEvent(id=f"ev-{run_id}", name="go", data='{"n": 1}', ts=7, received_at=at))
    tx.create_run(
        NewRun(
            id=run_id,
            function_id=function_id,
            event_seqs=[seq],
            event_ids=[f"ev-{run_id}"],
            available_at=at,
            created_at=at,
            sort_at=sort_at,
            status=status,
            spec=spec,
        )
    )


def add_runs(store: Store, ids: list[str], **kwargs: Any) -> None:
    def op(tx: Tx) -> None:
        for run_id in ids:
            add_run(tx, run_id, **kwargs)

    store.transact_sync(op)


def step(run_id: str, step_id: str, output: str = "1", position: int = 0) -> StepRow:
    return StepRow(
        run_id=run_id,
        step_id=step_id,
        position=position,
        kind=StepKind.RUN,
        status=StepStatus.COMPLETED,
        attempts=1,
        output=output,
        error=None,
        wake_at=None,
        started_at=NOW,
        ended_at=NOW,
    )


def test_claim_key_holds_until_it_expires(store: Store) -> None:
    assert store.transact_sync(lambda tx: tx.claim_key("k", "a", NOW + 10, NOW)) is None
    assert store.transact_sync(lambda tx: tx.claim_key("k", "b", NOW + 10, NOW + 5)) == "a"
    assert store.transact_sync(lambda tx: tx.claim_key("k", "c", NOW + 30, NOW + 10)) is None
    assert store.transact_sync(lambda tx: tx.claim_key("k", "d", NOW + 30, NOW + 11)) == "c"


def test_events_and_runs_round_trip(store: Store) -> None:
    add_runs(store, ["r1"])
    add_runs(store, ["r2"], status="skipped")
    run = store.read_sync(lambda tx: tx.get_run("r1"))
    assert run is not None and (run.function_id, run.status, run.event_ids) == (
        "f",
        RunStatus.QUEUED,
        ["ev-r1"],
    )
    assert run.created_at == NOW and run.started_at is None and run.attempt == 0
    [event] = store.read_sync(lambda tx: tx.get_events("r1"))
    assert (event.id, event.name, event.data, event.ts, event.received_at) == (
        "ev-r1",
        "go",
        '{"n": 1}',
        7,
        NOW,
    )
    skipped = store.read_sync(lambda tx: tx.get_run("r2"))
    assert skipped is not None and skipped.ended_at == NOW
    assert store.read_sync(lambda tx: tx.get_run("missing")) is None
    # an ended run has no queue item: nothing to lease
    assert [lr.run.id for lr in store.transact_sync(lambda tx: lease(tx, "w", 10, NOW, NOW + 9))] == ["r1"]


def test_lease_takes_due_runs_in_order_and_bumps_the_epoch(store: Store) -> None:
    add_runs(store, ["late"], sort_at=NOW + 1)
    add_runs(store, ["early"], sort_at=NOW - 1)
    add_runs(store, ["future"], at=NOW + 100)
    add_runs(store, ["other"], function_id="g")
    first = store.transact_sync(lambda tx: lease(tx, "w1", 1, NOW, NOW + 10, "v7"))
    assert [lr.run.id for lr in first] == ["early"]
    [leased] = first
    assert leased.run.status == RunStatus.RUNNING and leased.run.started_at == NOW and leased.epoch == 1
    assert leased.run.app_version == "v7" and [e.id for e in leased.events] == ["ev-early"]
    rest = store.transact_sync(lambda tx: lease(tx, "w2", 10, NOW, NOW + 10))
    assert [lr.run.id for lr in rest] == ["late"]  # "early" is held, "future" not due, "other" not ours
    due = store.read_sync(lambda tx: tx.next_due(["f"]))  # a hint: may be early, never late
    assert due is not None and NOW < due <= NOW + 10
    # after the lease expires another worker takes the run, with a higher epoch
    again = store.transact_sync(lambda tx: lease(tx, "w3", 1, NOW + 11, NOW + 20))
    assert [(lr.run.id, lr.epoch) for lr in again] == [("early", 2)]
    assert again[0].run.app_version == "v7"  # a worker without a version keeps the last one


def test_next_due_is_none_without_work(store: Store) -> None:
    assert store.read_sync(lambda tx: tx.next_due(["f"])) is None
    assert store.read_sync(lambda tx: tx.next_due([])) is None


def test_extend_and_release_leases(store: Store) -> None:
    add_runs(store, ["a", "b"])
    store.transact_sync(lambda tx: lease(tx, "w1", 1, NOW, NOW + 5))
    store.transact_sync(lambda tx: lease(tx, "w2", 1, NOW, NOW + 5))
    kept = store.transact_sync(lambda tx: tx.extend_leases("w1", ["a", "b"], NOW + 50, NOW + 1))
    assert kept == ["a"]  # w1 does not hold "b"
    due = store.read_sync(lambda tx: tx.next_due(["f"]))
    assert due is not None and due <= NOW + 5  # no later than w2's lease on "b" expires
    assert store.transact_sync(lambda tx: tx.release_leases("w2", NOW)) == 1
    retaken = store.transact_sync(lambda tx: lease(tx, "w3", 5, NOW, NOW + 5))
    assert [lr.run.id for lr in retaken] == ["b"]


def test_checkpoints_are_fenced_by_owner_and_epoch(store: Store) -> None:
    add_runs(store, ["r"])
    [old] = store.transact_sync(lambda tx: lease(tx, "w1", 1, NOW, NOW + 1))
    [new] = store.transact_sync(lambda tx: lease(tx, "w2", 1, NOW + 2, NOW + 10))
    stale = Fence(run_id="r", owner="w1", epoch=old.epoch)
    with pytest.raises(LeaseLostError):
        store.transact_sync(lambda tx: tx.checkpoint(stale, [step("r", "s", '"old"')], []))

    def checkpoint_then_effect(tx: Tx) -> Any:  # an effect reading back after the fence
        tx.checkpoint(stale, [step("r", "s", '"old"')], [])
        tx.insert_event(NewEvent(id="sent-by-stale", name="x", data="{}", ts=2, received_at=NOW))
        return tx.get_run("r")

    with pytest.raises(LeaseLostError):  # on PostgreSQL the fence fails on the server: still this error
        store.transact_sync(checkpoint_then_effect)
    with pytest.raises(LeaseLostError):
        store.transact_sync(lambda tx: tx.reschedule(stale, RunStatus.SLEEPING, NOW + 60, None, NOW))
    with pytest.raises(LeaseLostError):
        store.transact_sync(
            lambda tx: tx.finish_run(
                RunEnd(fence=stale, run_id="r", status=RunStatus.COMPLETED, output='"old"', now=NOW)
            )
        )
    assert store.read_sync(lambda tx: tx.get_steps("r")) == []  # nothing of the stale owner landed
    assert store.read_sync(lambda tx: tx.list_events("x", None, None, 10)) == []
    fence = Fence(run_id="r", owner="w2", epoch=new.epoch)
    span = SpanRow(
        run_id="r",
        kind="step",
        name="s",
        started_at=NOW,
        ended_at=NOW,
        status="failed",
        attempt=0,
        error='{"type": "E", "message": "m"}',
    )
    assert store.transact_sync(lambda tx: tx.checkpoint(fence, [step("r", "s", '"new"')], [span]))() is False
    assert [s.output for s in store.read_sync(lambda tx: tx.get_steps("r"))] == ['"new"']
    assert [s.status for s in store.read_sync(lambda tx: tx.get_spans("r"))] == ["failed"]
    assert store.transact_sync(
        lambda tx: tx.finish_run(
            RunEnd(fence=fence, run_id="r", status=RunStatus.COMPLETED, output="3", now=NOW + 3)
        )
    )
    run = store.read_sync(lambda tx: tx.get_run("r"))
    assert run is not None and (run.status, run.output, run.ended_at) == (RunStatus.COMPLETED, "3", NOW + 3)
    assert (
        store.transact_sync(
            lambda tx: tx.finish_run(RunEnd(fence=None, run_id="r", status=RunStatus.CANCELLED, now=NOW))
        )
        is False
    )


def test_reschedule_parks_the_run_until_its_wake_time(store: Store) -> None:
    add_runs(store, ["r"])
    [leased] = store.transact_sync(lambda tx: lease(tx, "w1", 1, NOW, NOW + 5))
    fence = Fence(run_id="r", owner="w1", epoch=leased.epoch)
    store.transact_sync(lambda tx: tx.reschedule(fence, RunStatus.SLEEPING, NOW + 60, 2, NOW))
    run = store.read_sync(lambda tx: tx.get_run("r"))
    assert run is not None and (run.status, run.attempt) == (RunStatus.SLEEPING, 2)
    due = store.read_sync(lambda tx: tx.next_due(["f"]))
    assert due is not None and due <= NOW + 60
    assert store.transact_sync(lambda tx: lease(tx, "w2", 1, NOW + 59, NOW + 70)) == []
    [woken] = store.transact_sync(lambda tx: lease(tx, "w2", 1, NOW + 60, NOW + 70))
    assert woken.run.status == RunStatus.RUNNING and woken.epoch == leased.epoch + 1


def test_a_cancel_flag_reaches_the_worker_holding_the_run(store: Store) -> None:
    add_runs(store, ["held"])
    [leased] = store.transact_sync(lambda tx: lease(tx, "w", 1, NOW, NOW + 30))
    add_runs(store, ["idle"])
    assert store.transact_sync(lambda tx: tx.lock_lease("held", NOW + 1)) is True
    assert store.transact_sync(lambda tx: tx.lock_lease("idle", NOW + 1)) is False
    assert store.transact_sync(lambda tx: tx.lock_lease("held", NOW + 31)) is False  # expired
    fence = Fence(run_id="held", owner="w", epoch=leased.epoch)
    assert store.transact_sync(lambda tx: tx.checkpoint(fence, [], []))() is False
    assert store.transact_sync(lambda tx: tx.flag_cancel("idle", NOW + 1)) is False  # nobody to tell
    assert store.transact_sync(lambda tx: tx.flag_cancel("held", NOW + 31)) is False  # lease lapsed
    assert store.transact_sync(lambda tx: tx.checkpoint(fence, [], []))() is False
    assert store.transact_sync(lambda tx: tx.flag_cancel("held", NOW + 1)) is True
    assert (
        store.transact_sync(lambda tx: tx.checkpoint(fence, [], []))() is True
    )  # the flag reaches the owner


def test_requeue_forgets_the_given_steps(store: Store) -> None:
    add_runs(store, ["r"])
    [leased] = store.transact_sync(lambda tx: lease(tx, "w", 1, NOW, NOW + 5))
    fence = Fence(run_id="r", owner="w", epoch=leased.epoch)
    store.transact_sync(lambda tx: tx.checkpoint(fence, [step("r", "a"), step("r", "b", position=1)], []))
    store.transact_sync(
        lambda tx: tx.finish_run(
            RunEnd(fence=fence, run_id="r", status=RunStatus.FAILED, error='{"type": "E"}', now=NOW)
        )
    )
    store.transact_sync(lambda tx: tx.requeue_run("r", NOW + 1, ["b"]))
    run = store.read_sync(lambda tx: tx.get_run("r"))
    assert run is not None and (run.status, run.error, run.ended_at) == (RunStatus.RUNNING, None, None)
    assert [s.step_id for s in store.read_sync(lambda tx: tx.get_steps("r"))] == ["a"]
    assert [lr.run.id for lr in store.transact_sync(lambda tx: lease(tx, "w", 1, NOW + 1, NOW + 9))] == ["r"]


@SQL_ONLY
def test_worker_registry(store: Store) -> None:
    for name, beat in (("a", NOW), ("b", NOW - 100)):
        row = WorkerRow(
            id=name,
            app="app",
            app_version="v1",
            concurrency=4,
            started_at=NOW - 200,
            heartbeat_at=beat,
            functions=["f", "g"],
        )
        store.transact_sync(lambda tx: tx.upsert_worker(row))
    [alive] = store.read_sync(lambda tx: tx.list_workers(NOW - 60))
    assert (alive.id, alive.app_version, alive.concurrency, alive.functions) == ("a", "v1", 4, ["f", "g"])
    store.transact_sync(lambda tx: tx.remove_worker("a"))
    assert store.read_sync(lambda tx: tx.list_workers(NOW - 60)) == []


@SQL_ONLY
def test_functions_registry(store: Store) -> None:
    store.transact_sync(lambda tx: tx.register_functions("app", {"f": '{"id": "f"}'}, NOW))
    store.transact_sync(lambda tx: tx.register_functions("other", {"f": '{"id": "f", "x": 1}'}, NOW))
    assert store.read_sync(lambda tx: tx.load_functions()) == {"f": ("other", '{"id": "f", "x": 1}')}


@SQL_ONLY
def test_apps_registry(store: Store) -> None:
    first = AppRow(
        url="http://a/",
        app="a",
        app_version="1",
        max_duration=60.0,
        function_ids=("f", "g"),
        created_at=NOW,
        synced_at=NOW,
    )
    assert store.transact_sync(lambda tx: tx.record_app_error("http://a/", "down", NOW)) is False
    assert store.read_sync(lambda tx: tx.list_apps()) == []
    store.transact_sync(lambda tx: tx.upsert_app(first))
    assert store.read_sync(lambda tx: tx.get_app("http://a/")) == first
    assert store.transact_sync(lambda tx: tx.record_app_error("http://a/", "down", NOW + 1)) is True
    failed = store.read_sync(lambda tx: tx.get_app("http://a/"))
    assert failed is not None and (failed.error, failed.error_at, failed.synced_at) == ("down", NOW + 1, NOW)
    again = dataclasses.replace(
        first, app_version="2", function_ids=("g",), created_at=NOW + 5, synced_at=NOW + 2
    )
    store.transact_sync(lambda tx: tx.upsert_app(again))  # keeps created_at, clears the error
    assert store.read_sync(lambda tx: tx.list_apps()) == [dataclasses.replace(again, created_at=NOW)]
    with pytest.raises(StoreError):  # one URL per app name
        store.transact_sync(lambda tx: tx.upsert_app(dataclasses.replace(first, url="http://b/")))
    assert store.transact_sync(lambda tx: tx.delete_app("http://a/")) is True
    assert store.transact_sync(lambda tx: tx.delete_app("http://a/")) is False
    assert store.read_sync(lambda tx: tx.get_app("http://a/")) is None


@SQL_ONLY
def test_retiring_an_apps_functions_touches_no_other_app(store: Store) -> None:
    store.transact_sync(lambda tx: tx.register_functions("a", {"f": '{"id": "f"}', "g": '{"id": "g"}'}, NOW))
    store.transact_sync(lambda tx: tx.register_functions("b", {"h": '{"id": "h"}'}, NOW))
    assert store.transact_sync(lambda tx: tx.retire_app_functions("a", NOW + 1)) == 2
    assert store.transact_sync(lambda tx: tx.retire_app_functions("a", NOW + 2)) == 0  # already retired
    assert store.read_sync(lambda tx: tx.retired_functions()) == {"f": NOW + 1, "g": NOW + 1}


def test_group_commit_rolls_back_a_failing_operation_alone(store: Store) -> None:
    def good(name: str) -> Any:
        return lambda tx: add_run(tx, name)

    def bad(tx: Tx) -> None:
        add_run(tx, "doomed")
        raise ValueError("the operation's own failure")

    async def together() -> list[Any]:
        futures = [store.submit(good("one")), store.submit(bad), store.submit(good("two"))]
        return await asyncio.gather(*futures, return_exceptions=True)

    first, failed, last = asyncio.run(together())
    assert first is None and last is None
    assert isinstance(failed, ValueError)  # not translated: it is not a driver error
    assert store.read_sync(lambda tx: tx.get_run("doomed")) is None
    assert {r for r in ("one", "two") if store.read_sync(lambda tx: tx.get_run(r))} == {"one", "two"}


def test_a_stale_checkpoint_fails_alone_among_others(store: Store) -> None:
    """Checkpoints committed together (one transaction, a savepoint each, or
    alone): the one whose lease moved on gets ``LeaseLostError``; the others land."""
    ids = ["a", "b", "c", "d", "e"]
    add_runs(store, ids)
    leased = store.transact_sync(lambda tx: lease(tx, "w1", 5, NOW, NOW + 1))
    fences = {lr.run.id: Fence(run_id=lr.run.id, owner="w1", epoch=lr.epoch) for lr in leased}
    store.transact_sync(lambda tx: lease_pass(tx, "w2", F_ONLY, 5, NOW + 2, NOW + 60))  # all taken over...
    fences.update(
        {
            lr.run.id: Fence(run_id=lr.run.id, owner="w2", epoch=lr.epoch)
            for lr in store.transact_sync(
                lambda tx: [tx.take(LeaseTerms(owner="w2", now=NOW + 2, until=NOW + 60), "c")]
            )
            if lr is not None
        }
    )

    def checkpoint(r: str) -> Callable[[Tx], CancelFlag]:
        return lambda tx: tx.checkpoint(fences[r], [step(r, "s")], [])

    async def together() -> list[Any]:
        futures = [store.submit(checkpoint(r)) for r in ids]
        return await asyncio.gather(*futures, return_exceptions=True)

    outcomes = dict(zip(ids, asyncio.run(together()), strict=True))
    assert outcomes.pop("c")() is False  # ...and only c's checkpoint comes from its new owner
    assert all(isinstance(o, LeaseLostError) for o in outcomes.values()), outcomes
    landed = {r for r in ids if store.read_sync(lambda tx: tx.get_steps(r))}
    assert landed == {"c"}


@SQL_ONLY
def test_driver_errors_become_store_errors_with_their_cause(store: Store) -> None:
    def broken(tx: Tx) -> None:
        tx.conn.execute("SELECT no_such_column FROM runs")  # type: ignore[attr-defined]

    with pytest.raises(StoreError) as caught:
        store.transact_sync(broken)
    assert not isinstance(caught.value, StoreUnavailableError)  # a bug, not an outage
    assert type(caught.value.__cause__).__module__.split(".")[0] in ("sqlite3", "psycopg")
    assert store.transact_sync(lambda tx: tx.next_due(["f"])) is None  # the store still works


@SQL_ONLY
def test_concurrent_leases_from_many_connections_are_disjoint(db_url: str, store: Store) -> None:
    """A barrier race (huey's concurrent dequeue): workers with their own
    connections lease at the same moment; no run is handed out twice."""
    ids = [f"r{i:03d}" for i in range(120)]
    add_runs(store, ids)
    contenders = [make_store(db_url) for _ in range(4)]
    barrier = threading.Barrier(len(contenders))
    taken: dict[str, list[str]] = {}

    def drain(index: int, mine: Store) -> None:
        got: list[str] = []
        barrier.wait()
        while True:
            batch = mine.transact_sync(lambda tx: lease(tx, f"w{index}", 7, NOW, NOW + 60))
            if not batch:
                break
            got.extend(lr.run.id for lr in batch)
        taken[f"w{index}"] = got

    threads = [threading.Thread(target=drain, args=(i, s)) for i, s in enumerate(contenders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for mine in contenders:
        mine.close()
    every = [run_id for got in taken.values() for run_id in got]
    assert sorted(every) == ids  # each run leased exactly once, none lost
    assert len(taken) == 4


def test_writes_from_many_threads_all_commit(store: Store) -> None:
    def writer(n: int) -> None:
        add_runs(store, [f"t{n}-{i}" for i in range(10)])

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    leased = store.transact_sync(lambda tx: lease(tx, "w", 100, NOW, NOW + 5))
    assert len({lr.run.id for lr in leased}) == 60


def _bad_write(tx: Tx) -> None:
    """A write the server rejects (NOT NULL), never read back by the operation."""
    tx.conn.execute("INSERT INTO runs (id) VALUES ('no-function-id')")  # type: ignore[attr-defined]


@SQL_ONLY
def test_a_rejected_write_fails_its_own_operation_only(store: Store) -> None:
    def bad(tx: Tx) -> None:
        add_run(tx, "doomed")
        _bad_write(tx)

    async def together() -> list[Any]:
        futures = [
            store.submit(lambda tx: add_run(tx, "one")),
            store.submit(bad),
            store.submit(lambda tx: add_run(tx, "two")),
        ]
        return await asyncio.gather(*futures, return_exceptions=True)

    first, failed, last = asyncio.run(together())
    assert first is None and last is None
    assert isinstance(failed, StoreError) and not isinstance(failed, StoreUnavailableError)
    assert store.read_sync(lambda tx: tx.get_run("doomed")) is None
    with pytest.raises(StoreError):
        store.transact_sync(bad)  # alone in its transaction, too
    assert store.read_sync(lambda tx: tx.get_run("doomed")) is None
    assert all(store.read_sync(lambda tx: tx.get_run(r)) for r in ("one", "two"))


# -- waits and flow-control state (the roles the unit tier's fake implements too) --------------


def wait(run_id: str, step_id: str, **kwargs: Any) -> WaitRow:
    kwargs.setdefault("kind", WaitKind.EVENT)
    kwargs.setdefault("event_name", "paid")
    return WaitRow(run_id=run_id, step_id=step_id, created_at=NOW, **kwargs)


def waiting(run_id: str, step_id: str) -> StepRow:
    return StepRow(run_id=run_id, step_id=step_id, position=0, kind=StepKind.WAIT, status=StepStatus.WAITING)


def test_waits_match_by_key_until_they_expire_and_are_claimed_once(store: Store) -> None:
    add_runs(store, ["r", "s"])
    store.transact_sync(lambda tx: tx.insert_wait(wait("r", "w", match_key="order", match_value="7")))
    store.transact_sync(lambda tx: tx.insert_wait(wait("r", "w", match_key="order", match_value="8")))  # kept
    store.transact_sync(lambda tx: tx.insert_wait(wait("s", "w", expires_at=NOW + 5)))
    assert sorted(store.read_sync(lambda tx: tx.wait_keys("paid"))) == ["", "order"]
    [found] = store.read_sync(lambda tx: tx.match_waits("paid", "order", "7", NOW))
    assert (found.run_id, found.step_id, found.id is not None) == ("r", "w", True)
    assert store.read_sync(lambda tx: tx.match_waits("paid", "order", "8", NOW)) == []
    assert len(store.read_sync(lambda tx: tx.match_waits("paid", "", "", NOW + 4))) == 1
    assert store.read_sync(lambda tx: tx.match_waits("paid", "", "", NOW + 5)) == []  # expired
    assert found.id is not None
    wait_id = found.id
    assert store.transact_sync(lambda tx: tx.claim_wait(wait_id)) is True
    assert store.transact_sync(lambda tx: tx.claim_wait(wait_id)) is False  # one claimer only
    assert store.transact_sync(lambda tx: tx.claim_step_waits("s", "w")) is True
    assert store.transact_sync(lambda tx: tx.claim_step_waits("s", "w")) is False


def test_a_step_wait_starts_only_while_the_step_is_waiting(store: Store) -> None:
    add_runs(store, ["r"])

    def start(tx: Tx, step_id: str) -> bool:
        tx.save_steps([waiting("r", step_id)], [])
        return tx.start_wait(wait("r", step_id))()

    assert store.transact_sync(lambda tx: start(tx, "a")) is True
    assert store.transact_sync(lambda tx: start(tx, "a")) is False  # a repeated commit inserts nothing
    assert store.transact_sync(
        lambda tx: tx.complete_waiting_step("r", "a", StepStatus.COMPLETED, "1", None, NOW)
    )
    assert store.transact_sync(lambda tx: tx.claim_step_waits("r", "a")) is True
    assert store.transact_sync(lambda tx: start(tx, "a")) is False  # resolved: the repeat changes nothing
    memo = store.read_sync(lambda tx: tx.get_step("r", "a"))
    assert memo is not None and (memo.status, memo.output, memo.ended_at) == (StepStatus.COMPLETED, "1", NOW)
    assert (
        store.transact_sync(lambda tx: tx.complete_waiting_step("r", "a", StepStatus.FAILED, None, "e", NOW))
        is False
    )
    assert store.transact_sync(lambda tx: tx.start_wait(wait("r", "never-saved"))()) is False


def test_invoke_waits_follow_their_child_and_go_with_their_run(store: Store) -> None:
    add_runs(store, ["parent"])
    store.transact_sync(
        lambda tx: tx.insert_wait(wait("parent", "call", kind=WaitKind.INVOKE, event_name=""))
    )
    store.transact_sync(lambda tx: tx.set_wait_match("parent", "call", "child-1"))
    [found] = store.read_sync(lambda tx: tx.child_waits("child-1"))
    assert (found.run_id, found.step_id, found.kind) == ("parent", "call", WaitKind.INVOKE)
    store.transact_sync(lambda tx: tx.delete_run_waits("parent"))
    assert store.read_sync(lambda tx: tx.child_waits("child-1")) == []


def test_wake_run_makes_a_parked_run_due_and_a_held_one_due_at_its_park(store: Store) -> None:
    add_runs(store, ["r"])
    [leased] = store.transact_sync(lambda tx: lease(tx, "w1", 1, NOW, NOW + 5))
    fence = Fence(run_id="r", owner="w1", epoch=leased.epoch)
    store.transact_sync(lambda tx: tx.reschedule(fence, RunStatus.WAITING, None, None, NOW))
    assert store.transact_sync(lambda tx: lease(tx, "w2", 1, NOW + 100, NOW + 105)) == []  # parked for good
    store.transact_sync(lambda tx: tx.wake_run("r", NOW + 100))
    [again] = store.transact_sync(lambda tx: lease(tx, "w2", 1, NOW + 100, NOW + 105))
    store.transact_sync(lambda tx: tx.wake_run("r", NOW + 101))  # while held: remembered for its park
    held = Fence(run_id="r", owner="w2", epoch=again.epoch)
    assert (
        store.transact_sync(lambda tx: tx.reschedule(held, RunStatus.WAITING, None, None, NOW + 102)) is False
    )
    assert [lr.run.id for lr in store.transact_sync(lambda tx: lease(tx, "w3", 1, NOW + 102, NOW + 110))] == [
        "r"
    ]


def test_gcra_times_and_accumulators_round_trip(store: Store) -> None:
    assert store.read_sync(lambda tx: tx.gcra_tat("t")) is None
    store.transact_sync(lambda tx: tx.set_gcra_tat("t", NOW + 1.5))
    assert store.read_sync(lambda tx: tx.gcra_tat("t")) == NOW + 1.5
    add_runs(store, ["d", "b"], at=NOW + 10)
    store.transact_sync(lambda tx: tx.put_accumulator("debounce", "k", "d", 1, NOW))
    store.transact_sync(lambda tx: tx.put_accumulator("batch", "k", "b", 3, NOW - 1))
    assert store.read_sync(lambda tx: tx.get_accumulator("debounce", "k")) == ("d", 1, NOW)
    assert store.read_sync(lambda tx: tx.get_accumulator("batch", "k")) == ("b", 3, NOW - 1)
    assert store.transact_sync(lambda tx: tx.pending_item("d")) is True
    store.transact_sync(lambda tx: tx.move_item("d", NOW, NOW))
    store.transact_sync(lambda tx: tx.close_batch("k"))
    assert store.read_sync(lambda tx: tx.get_accumulator("batch", "k")) is None
    app = ss.App("contract", database_url="sqlite:///never-opened.db")  # only its registry is used
    app.function(id="f", debounce=ss.Debounce(period="1s"))(lambda ctx: None)
    leased = store.transact_sync(lambda tx: lease_pass(tx, "w", app.registry, 5, NOW, NOW + 5))
    assert [lr.run.id for lr in leased] == ["d"]
    assert store.transact_sync(lambda tx: tx.pending_item("d")) is False  # leased: its events are fixed
    # a lease of a function that debounces closes the run's debounce
    assert store.read_sync(lambda tx: tx.get_accumulator("debounce", "k")) is None


def test_set_run_events_replaces_or_appends(store: Store) -> None:
    add_runs(store, ["r"])

    def add_event(tx: Tx, event_id: str, replace: bool) -> None:
        seq = tx.insert_event(NewEvent(id=event_id, name="go", data="{}", ts=1, received_at=NOW))
        tx.set_run_events("r", [(seq, event_id)], replace=replace)

    store.transact_sync(lambda tx: add_event(tx, "e2", True))
    store.transact_sync(lambda tx: add_event(tx, "e3", False))
    run = store.read_sync(lambda tx: tx.get_run("r"))
    assert run is not None and run.event_ids == ["e2", "e3"]
    assert [e.id for e in store.read_sync(lambda tx: tx.get_events("r"))] == ["e2", "e3"]


def test_a_waiting_memo_never_overwrites_a_recorded_step(store: Store) -> None:
    add_runs(store, ["r"])
    store.transact_sync(lambda tx: tx.save_steps([step("r", "a", '"done"')], []))
    store.transact_sync(lambda tx: tx.save_steps([waiting("r", "a")], []))
    memo = store.read_sync(lambda tx: tx.get_step("r", "a"))
    assert memo is not None and (memo.status, memo.output) == (StepStatus.COMPLETED, '"done"')
