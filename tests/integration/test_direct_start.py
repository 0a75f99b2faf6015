"""A run sent from a process whose app has a running local worker starts in
the send's own transaction (issue 18, sequential latency): taken there for
that worker as a lease pass would take it, and handed over in memory. It must
change nothing in who runs what or when: no queue is jumped, flow control
evaluated at lease time still applies, a stopping or full worker takes
nothing, a fault at the send's commit neither loses nor doubles a run, and
the run in the store looks like any leased run. Both stores.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest

import stepstone as ss
from stepstone.direct import reserve
from stepstone.registry import Registry
from stepstone.runtime import Sent, ingest, prepare
from stepstone.scheduler.leasing import lease, take_direct
from stepstone.store import faults
from stepstone.store.base import Store, Tx
from stepstone.store.rows import LeasedRun

from ..batches import submitted_together
from ..conftest import add_effect_once, query, run_of
from ..polling import wait_for

NOW = 1_000_000.0
TTL = 60.0


@pytest.fixture
def pass_took(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The run ids each lease pass of a worker took, pass by pass."""
    passes: list[list[str]] = []

    def counted(*args: Any, **kwargs: Any) -> list[LeasedRun]:
        leased = lease(*args, **kwargs)
        passes.append([item.run.id for item in leased])
        return leased

    monkeypatch.setattr("stepstone.worker.lease", counted)
    return passes


def _leased_by_a_pass(passes: list[list[str]], run_id: str) -> bool:
    return any(run_id in took for took in passes)


def three_steps(app: ss.App, **options: Any) -> None:
    @app.function(id="three", trigger=ss.on_event("go"), **options)
    async def three(ctx: ss.Context) -> int:
        for i in range(3):
            await ctx.step.run(f"s{i}", lambda: 1)
        return 3


def test_a_sequential_run_starts_in_its_send_with_one_commit_fewer(
    app: ss.App, pass_took: list[list[str]]
) -> None:
    three_steps(app)

    async def main() -> tuple[list[int], list[str]]:
        await app.start_async(lease_ttl=60)  # no heartbeat during the test
        commits, runs = [], []
        try:
            for _ in range(3):
                before = app.store.commits  # type: ignore[attr-defined]
                [event_id] = await app.send_async(ss.Event("go"))
                [run] = await app.runs.list_async(event_id=event_id)
                done = await app.runs.wait_async(run.id, timeout="10s")
                assert done.status == "completed" and done.output == 3
                commits.append(app.store.commits - before)  # type: ignore[attr-defined]
                runs.append(run.id)
        finally:
            await app.stop_async()
        return commits, runs

    commits, runs = asyncio.run(main())
    # the send, then one checkpoint per step (the end in the last): no lease pass's commit
    assert commits == [4, 4, 4]
    assert not any(_leased_by_a_pass(pass_took, run_id) for run_id in runs)


def _lease_row(db_url: str, run_id: str) -> tuple[Any, ...]:
    [row] = query(
        db_url,
        "SELECT q.owner, q.epoch, q.fresh, q.available_at - r.started_at, q.wake_requested, "
        "r.epoch, r.status, r.attempt, r.app_version, r.started_at IS NOT NULL "
        f"FROM queue q JOIN runs r ON r.id = q.run_id WHERE q.run_id = '{run_id}'",
    )
    return (*row[:3], round(float(row[3])), *row[4:])


def _first_step_done(app: ss.App, run_id: str) -> bool:
    return [s.status for s in app.runs.get(run_id).steps][:1] == ["completed"]


def test_a_run_started_directly_is_leased_in_the_store_as_by_a_pass(
    make_app: Callable[..., ss.App], db_url: str, pass_took: list[list[str]]
) -> None:
    app, client = make_app("held", app_version="v1"), make_app("client")
    gate = threading.Event()

    @app.function(id="held", trigger=ss.on_event("hold"))
    async def held(ctx: ss.Context) -> str:
        await ctx.step.run("first", lambda: "one")
        await ctx.step.run("gate", lambda: gate.wait(10))  # step 1 is committed before it runs
        return "done"

    app.start(lease_ttl=60)
    try:
        direct = run_of(app, app.send(ss.Event("hold"))[0])
        leased = run_of(client, client.send(ss.Event("hold"))[0])  # no local worker: a lease pass
        for run in (direct, leased):
            wait_for(partial(_first_step_done, app, run.id), 10, "step 1 committed")
        assert _leased_by_a_pass(pass_took, leased.id) and not _leased_by_a_pass(pass_took, direct.id)
        assert _lease_row(db_url, direct.id) == _lease_row(db_url, leased.id)
        [(owner,)] = query(db_url, f"SELECT owner FROM queue WHERE run_id = '{direct.id}'")
        assert owner == app._local_workers[0].lease_owner
        [(next_at, until)] = query(
            db_url,
            "SELECT p.next_at, q.available_at FROM partitions p JOIN queue q ON q.partition_key = p.key "
            f"WHERE q.run_id = '{leased.id}'",
        )
        assert next_at <= until  # the partition is looked at again when a lease lapses
    finally:
        gate.set()
    for run in (direct, leased):
        assert app.runs.wait(run.id, timeout="10s").status == "completed"
    app.stop()
    direct_spans = [(s.kind, s.name, s.status) for s in app.runs.trace(direct.id)]
    leased_spans = [(s.kind, s.name, s.status) for s in app.runs.trace(leased.id)]
    assert direct_spans == leased_spans and direct_spans


@pytest.mark.parametrize(
    "options",
    [
        {"concurrency": ss.Concurrency(limit=5)},
        {"throttle": ss.Throttle(limit=100, period="1s")},
        {"priority": ss.Priority(run="1")},
        {"timeouts": ss.Timeouts(finish="1h")},
        {"timeouts": ss.Timeouts(start="1h")},
        {"debounce": ss.Debounce(period="50ms")},
        {"batch": ss.Batch(max_size=2, timeout="50ms")},
    ],
    ids=["concurrency", "throttle", "priority", "finish-timeout", "start-timeout", "debounce", "batch"],
)
def test_flow_control_at_lease_time_still_goes_through_a_lease_pass(
    app: ss.App, options: dict[str, Any], pass_took: list[list[str]]
) -> None:
    three_steps(app, **options)
    app.start()
    [event_id] = app.send(ss.Event("go"))
    run = run_of(app, event_id)
    assert app.runs.wait(run.id, timeout="10s").status == "completed"
    assert _leased_by_a_pass(pass_took, run.id)


def test_a_full_worker_takes_nothing_and_the_run_is_leased_later(
    app: ss.App, db_url: str, pass_took: list[list[str]]
) -> None:
    gate = threading.Event()

    @app.function(id="gated", trigger=ss.on_event("gated"))
    async def gated(ctx: ss.Context) -> str:
        await asyncio.get_running_loop().run_in_executor(None, gate.wait, 10)
        return "done"

    app.start(concurrency=1)
    try:
        first = run_of(app, app.send(ss.Event("gated"))[0])
        wait_for(lambda: app.runs.get(first.id).status == "running", 10, "the first run to start")
        second = run_of(app, app.send(ss.Event("gated"))[0])
        [(owner,)] = query(db_url, f"SELECT owner FROM queue WHERE run_id = '{second.id}'")
        assert owner is None  # queued: the worker's only slot is busy
    finally:
        gate.set()
    assert app.runs.wait(second.id, timeout="10s").status == "completed"
    assert not _leased_by_a_pass(pass_took, first.id) and _leased_by_a_pass(pass_took, second.id)


def test_a_stopping_worker_takes_nothing(app: ss.App, db_url: str) -> None:
    three_steps(app)

    async def main() -> str:
        worker = await app.start_async()
        stopping = asyncio.create_task(worker.stop(5))
        await asyncio.sleep(0)  # the stop begins: it refuses direct starts before its first wait
        assert worker.reserve(1) == 0
        [event_id] = await app.send_async(ss.Event("go"))
        await stopping
        [run] = await app.runs.list_async(event_id=event_id)
        return run.id

    run_id = asyncio.run(main())
    assert query(db_url, f"SELECT owner, epoch FROM queue WHERE run_id = '{run_id}'") == [(None, 0)]


def test_a_sync_send_from_another_thread_hands_the_run_to_the_workers_loop(
    app: ss.App, pass_took: list[list[str]]
) -> None:
    three_steps(app)
    app.start()
    results: list[str] = []

    def sender() -> None:
        run = run_of(app, app.send(ss.Event("go"))[0])
        results.append(app.runs.wait(run.id, timeout="10s").status)
        results.append(run.id)

    threads = [threading.Thread(target=sender) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert results[0::2] == ["completed"] * 3
    assert not any(_leased_by_a_pass(pass_took, run_id) for run_id in results[1::2])


# -- the take itself, driven through the store with explicit times ---------------------------------


def _registry() -> Registry:
    app = ss.App("direct", database_url="sqlite:///never-opened.db")  # only its registry is used
    app.function(id="plain", trigger=ss.on_event("plain"))(lambda ctx: None)
    app.function(id="zzz", trigger=ss.on_event("zzz"))(lambda ctx: None)
    return app.registry


def _send_taking(
    store: Store, registry: Registry, events: list[ss.Event], at: float, wanted: int
) -> list[str]:
    prepared = prepare(events, at)

    def op(tx: Tx) -> Callable[[], list[LeasedRun]]:
        sent = Sent()
        ingest(tx, prepared, registry, at, sent=sent)
        return take_direct(tx, "w", sent.queued, wanted, at, at + TTL)[1]

    return [lr.run.id for lr in store.transact_sync(op)()]  # (PostgreSQL: read after the COMMIT)


def test_a_send_rolled_back_in_a_group_commit_hands_its_events_to_no_other_start(
    one_writer: Store,
) -> None:
    """A transaction remembers the events its sends wrote, so that a direct
    start need not read them back; a group commit shares one transaction. A
    send rolled back at its savepoint (SQLite then gives its event's seq to
    the next insert) must not hand its event to the next send's run."""
    registry = _registry()

    def send(n: int, fails: bool) -> Callable[[Tx], Callable[[], list[LeasedRun]]]:
        prepared = prepare([ss.Event("plain", {"n": n})], NOW)

        def op(tx: Tx) -> Callable[[], list[LeasedRun]]:
            sent = Sent()
            ingest(tx, prepared, registry, NOW, sent=sent)
            if fails:
                raise RuntimeError("after the send's writes")
            return take_direct(tx, "w", sent.queued, 5, NOW, NOW + TTL)[1]

        return op

    async def both() -> list[Any]:
        futures = await submitted_together(one_writer, [send(1, True), send(2, False)])
        return list(await asyncio.gather(*futures, return_exceptions=True))

    failed, taken = asyncio.run(both())
    assert isinstance(failed, RuntimeError)
    assert [json.loads(event.data) for lr in taken() for event in lr.events] == [{"n": 2}]
    [item] = one_writer.transact_sync(lambda tx: tx.partition_items("plain", NOW + TTL + 1, 10))
    [events] = one_writer.read_sync(lambda tx: [tx.get_events(item.run_id)])
    assert [json.loads(event.data) for event in events] == [{"n": 2}]  # as stored


def test_a_direct_start_never_jumps_a_queue(store: Store) -> None:
    registry = _registry()
    store.transact_sync(lambda tx: ingest(tx, prepare([ss.Event("plain")], NOW), registry, NOW))
    assert _send_taking(store, registry, [ss.Event("plain")], NOW + 1, 5) == []  # one waits before it
    assert len(store.transact_sync(lambda tx: tx.partition_items("plain", NOW + 1, 10))) == 2


def test_a_direct_start_settles_its_partition_only_if_it_took(store: Store) -> None:
    """A partition a direct start took every run of is served (``settle_taken``:
    a lease pass visits the least recently served due partition first) and, on
    SQLite, next due at its earliest item's time; one
    whose take found a due item before its runs is left as it was, although
    on PostgreSQL the settle is sent before the take's result is read."""
    registry = _registry()

    def due() -> list[str]:
        return store.transact_sync(lambda tx: tx.due_partitions(["plain", "zzz"], NOW + 2, 10))

    store.transact_sync(lambda tx: ingest(tx, prepare([ss.Event("zzz")], NOW), registry, NOW))
    assert len(_send_taking(store, registry, [ss.Event("plain")], NOW, 5)) == 1
    # "plain" served at NOW; due again at its lease's expiry where writers are
    # serial (SQLite). On PostgreSQL a send never raises a hint (a run committed
    # meanwhile may be behind it: test_partition_hint_race.py): still due, after
    # the partition served least recently, until a lease pass settles it.
    assert due() == (["zzz"] if store.dialect == "sqlite" else ["zzz", "plain"])
    store.transact_sync(lambda tx: ingest(tx, prepare([ss.Event("plain")], NOW), registry, NOW))
    store.transact_sync(lambda tx: tx.settle_partition("zzz", NOW + 0.5, None, NOW + 1))
    assert due() == ["plain", "zzz"]  # served at NOW and NOW + 0.5
    assert _send_taking(store, registry, [ss.Event("plain")], NOW + 1, 5) == []  # one waits before it
    assert due() == ["plain", "zzz"]  # "plain" not served at NOW + 1


def test_a_direct_start_takes_what_its_send_queued_within_its_slots(store: Store) -> None:
    registry = _registry()
    taken = _send_taking(store, registry, [ss.Event("plain") for _ in range(3)], NOW, 2)
    assert len(taken) == 2
    left = store.transact_sync(lambda tx: tx.partition_items("plain", NOW, 10))
    assert len(left) == 1 and left[0].run_id not in taken
    assert store.read_sync(lambda tx: tx.next_due(["plain"])) == NOW  # due for a pass at once


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_fault_at_the_sends_commit_neither_loses_nor_doubles_a_run(
    app: ss.App, when: faults.When, pass_took: list[list[str]]
) -> None:
    executed = add_effect_once(app)

    app.start(lease_ttl=2)
    with faults.inject("App._send.op", when) as plan, pytest.raises(ss.StoreUnavailableError):
        app.send(ss.Event("once", id="e1"))
    assert plan.fired
    app.send(ss.Event("once", id="e1"))  # the caller retries; the event id dedupes it
    run = run_of(app, "e1")
    assert app.runs.wait(run.id, timeout="20s").status == "completed"
    assert executed == [run.id]
    if when == "after":  # it committed, leased to the worker, which heard of no run: its lease lapsed
        assert _leased_by_a_pass(pass_took, run.id)


def test_a_cancel_right_after_the_send_is_honoured(app: ss.App, pass_took: list[list[str]]) -> None:
    gate = threading.Event()
    executed: list[str] = []

    @app.function(id="gated", trigger=ss.on_event("gated"))
    async def gated(ctx: ss.Context) -> str:
        await ctx.step.run("first", lambda: gate.wait(10))
        await ctx.step.run("second", lambda: executed.append("second"))
        return "done"

    app.start()
    run = run_of(app, app.send(ss.Event("gated"))[0])
    try:
        assert app.runs.cancel(run.id) == "running"  # held by the worker: flagged, ended at its next commit
    finally:
        gate.set()
    done = app.runs.wait(run.id, timeout="10s")
    assert done.status == "cancelled" and executed == []
    assert not _leased_by_a_pass(pass_took, run.id)


def test_of_several_local_workers_the_one_with_most_free_slots_takes_the_run(
    app: ss.App, db_url: str, pass_took: list[list[str]]
) -> None:
    gate = threading.Event()

    @app.function(id="gated", trigger=ss.on_event("gated"))
    async def gated(ctx: ss.Context) -> str:
        await ctx.step.run("wait", lambda: gate.wait(10))
        return "done"

    app.start(concurrency=1, instance_id="small")
    app.start(concurrency=3, instance_id="large")
    small, large = app._local_workers
    try:
        runs = [run_of(app, app.send(ss.Event("gated"))[0]).id for _ in range(3)]
        owners = [query(db_url, f"SELECT owner FROM queue WHERE run_id = '{r}'")[0][0] for r in runs]
        # free slots 3 > 1, then 2 > 1, then 1 = 1: the first in the list among equals
        assert owners == [large.lease_owner, large.lease_owner, small.lease_owner]
    finally:
        gate.set()
    for run_id in runs:
        assert app.runs.wait(run_id, timeout="10s").status == "completed"
    assert not any(_leased_by_a_pass(pass_took, run_id) for run_id in runs)


def test_a_due_time_given_back_during_a_lease_pass_outlives_the_pass(
    make_app: Callable[..., ss.App], pass_took: list[list[str]]
) -> None:
    """A send that failed with an unknown outcome gives its slot back with the
    time its lease lapses; a lease pass in flight meanwhile may have read the
    store before that run was there, so its own next due time knows nothing of
    it. The pass must not erase the given-back time: the run would stay leased
    to this worker, which would not pass again until something else changed
    (found by test_a_fault_at_the_sends_commit_neither_loses_nor_doubles_a_run
    timing out under load)."""
    app, client = make_app("held"), make_app("client")
    three_steps(app)

    @client.function(id="elsewhere", trigger=ss.on_event("elsewhere"))
    async def elsewhere(ctx: ss.Context) -> None:  # hosted by no worker of this test
        return None

    app.start(lease_ttl=60)
    [worker] = app._local_workers
    wait_for(lambda: len(pass_took) > 0, 10, "the worker's first pass")

    def give_back_inside_the_pass() -> None:
        worker.give_back(0, app.clock.now() + 0.3)

    with faults.inject("Worker._lease.op", "inside", during=give_back_inside_the_pass) as plan:
        client.send(ss.Event("elsewhere"))  # wakes the worker: a pass that takes nothing
        wait_for(lambda: plan.fired, 10, "the pass with the give-back inside")
    passes = len(pass_took)
    wait_for(lambda: len(pass_took) > passes, 10, "a lease pass at the given-back time")


def test_a_lease_that_lapsed_before_its_sends_commit_starts_no_step_of_the_direct_start(
    app: ss.App, monkeypatch: pytest.MonkeyPatch, pass_took: list[list[str]]
) -> None:
    """A send's lease runs from the time the send read (``now``: until ``now``
    + TTL in the store); the worker it hands the run to must not believe it
    live any longer than that. A send slow between reading its time and its
    write (a long survey read, a catalog read, a process paused there) wrote
    a lease that had already lapsed: another worker may own the run from
    then, so the handed-over invocation must start no step, and the run is
    leased again by a pass. Before: the worker measured the lease from a
    time taken after that gap, started the step on a lapsed lease and
    completed the run."""
    executed = add_effect_once(app)

    ttl = 1.0
    app.start(lease_ttl=ttl)
    prepare_events = prepare

    def slow_prepare(*args: Any) -> Any:  # (right after the send reads its time)
        began = time.monotonic()  # (the worker's measure: the app's clock may step with the database's)
        prepared = prepare_events(*args)
        wait_for(lambda: time.monotonic() > began + ttl + 0.2, 10, "the send's lease to lapse")
        return prepared

    monkeypatch.setattr("stepstone.app.prepare", slow_prepare)
    [event_id] = app.send(ss.Event("once"))
    monkeypatch.setattr("stepstone.app.prepare", prepare_events)
    run = run_of(app, event_id)
    assert app.runs.wait(run.id, timeout="20s").status == "completed"
    assert executed == [run.id]
    assert _leased_by_a_pass(pass_took, run.id)  # the handed-over invocation stopped before the step


def test_a_lease_pass_slow_between_its_time_and_its_write_starts_no_step_on_the_lapsed_lease(
    make_app: Callable[..., ss.App], db_url: str, pass_took: list[list[str]]
) -> None:
    """The class of the test above, for the other way a worker takes a run: a
    lease pass reads its time (its leases last until it + TTL), then writes;
    a pass slow in between (a loop paused there) took leases already lapsed,
    which its worker must not believe live (``Presence.hold``): the invocation
    stops before its step and a later pass leases the run again."""
    app, client = make_app("held"), make_app("client")
    executed = add_effect_once(app, client)

    ttl = 1.0
    app.start(lease_ttl=ttl)
    [worker] = app._local_workers
    pausing = (
        threading.Event()
    )  # set: the next pass with the run to take pauses between its time and its write
    schedules = worker._schedules

    def slow_schedules() -> list[tuple[str, str]]:
        caller = sys._getframe(1)
        # A pass that will take the run: one whose time (its ``now``, read just
        # before) is not earlier than the run's queueing. (A pass that read its
        # time before the send committed finds the item but not due.)
        due = (
            f"SELECT run_id FROM queue WHERE owner IS NULL AND available_at <= {caller.f_locals.get('now')!r}"
        )
        if caller.f_code.co_name == "_lease" and pausing.is_set() and query(db_url, due):
            pausing.clear()
            # Past the lease in the worker's own measure (monotonic, as
            # ``Presence`` keeps it): the app's clock follows the database's
            # and may step forward meanwhile.
            began = time.monotonic()
            wait_for(lambda: time.monotonic() > began + ttl + 0.2, 10, "the pass's leases to lapse")
        return schedules()

    worker._schedules = slow_schedules  # type: ignore[method-assign]
    wait_for(lambda: len(pass_took) > 0, 10, "the worker's first pass")
    pausing.set()
    run = run_of(client, client.send(ss.Event("once"))[0])  # no local worker: queued for a pass
    assert app.runs.wait(run.id, timeout="20s").status == "completed"
    assert not pausing.is_set()  # (the pause happened)
    assert executed == [run.id]
    assert sum(run.id in took for took in pass_took) == 2  # the first invocation stopped before the step


def test_one_event_id_sent_at_once_by_two_apps_beside_their_workers_starts_one_run(
    make_app: Callable[..., ss.App],
) -> None:
    """Two processes (apps with stores of their own), each with a local
    worker, send the same event id at the same moment, round after round:
    each send's run would be written taken for its own worker, yet the
    event's dedupe claim lets one write; the other writes nothing, takes
    nothing and gives its slot back. One run per event, run once."""
    apps = [make_app("a"), make_app("b")]
    executed: list[str] = []
    for each in apps:

        @each.function(id="once", trigger=ss.on_event("once"))
        async def once(ctx: ss.Context) -> str:
            await ctx.step.run("effect", lambda: executed.append(str(ctx.event.id)))
            return "done"

        each.start()
    rounds = 8
    barrier = threading.Barrier(2, timeout=10)
    answers: list[list[str]] = []

    def sender(each: ss.App) -> None:
        for i in range(rounds):
            barrier.wait()
            answers.append(each.send(ss.Event("once", id=f"e{i}")))

    threads = [threading.Thread(target=sender, args=(each,)) for each in apps]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(answers) == sorted([[f"e{i}"] for i in range(rounds)] * 2)
    for i in range(rounds):
        [run] = apps[0].runs.list(event_id=f"e{i}")
        assert apps[0].runs.wait(run.id, timeout="10s").status == "completed"
    assert sorted(executed) == sorted(f"e{i}" for i in range(rounds))
    for each in apps:
        [worker] = each._local_workers
        idle = lambda w=worker: w.slots.claimed == 0 and not w.inflight  # noqa: E731
        wait_for(idle, 10, "every reserved slot back")


def test_a_direct_start_committing_while_the_app_stops_joins_the_drain(
    app: ss.App, db_url: str, pass_took: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``app.stop()`` after a send reserved a slot and before its transaction,
    which takes its run for the worker, commits: the stop refuses new direct
    starts at once but waits for that one's hand-over, and drains its run
    with the rest (not left leased to a stopped worker until its lease lapses).
    The send is held after its reservation, before its transaction: held
    inside it, it would keep the store's locks (SQLite's write lock, a
    partition's row) from the worker's loop, which the stop runs on."""
    executed = add_effect_once(app)

    app.start()
    [worker] = app._local_workers
    reserved = threading.Event()

    def reserve_until_the_stop_began(*args: Any) -> Any:
        direct = reserve(*args)
        assert direct is not None  # (a slot reserved for the send's run)
        reserved.set()
        wait_for(lambda: worker._stopping, 10, "the stop to begin")
        return direct

    monkeypatch.setattr("stepstone.app.reserve", reserve_until_the_stop_began)
    sent: list[str] = []
    sender = threading.Thread(target=lambda: sent.extend(app.send(ss.Event("once"))))
    sender.start()
    assert reserved.wait(10)
    app.stop()
    sender.join(10)
    run = run_of(app, sent[0])
    assert run.status == "completed" and executed == [run.id]
    assert not _leased_by_a_pass(pass_took, run.id)
    assert query(db_url, "SELECT COUNT(*) FROM queue")[0][0] == 0


def test_a_cancel_after_a_send_whose_outcome_was_lost_ends_the_run_unexecuted(
    app: ss.App, pass_took: list[list[str]]
) -> None:
    """The give-back path: a send's commit landed but its answer was lost, so
    its run is leased to the local worker, which never heard of it (the
    slot given back, the lease's expiry learned). An operator's cancel then
    only flags it (the lease is live); once the lease lapses the worker's
    own pass takes it and ends it cancelled before any step."""
    executed = add_effect_once(app)

    app.start(lease_ttl=1)
    with faults.inject("App._send.op", "after"), pytest.raises(ss.StoreUnavailableError):
        app.send(ss.Event("once", id="e1"))
    run = run_of(app, "e1")
    assert app.runs.cancel(run.id) == "running"  # flagged: leased to a worker that knows nothing of it
    done = app.runs.wait(run.id, timeout="20s")
    assert done.status == "cancelled" and done.steps == [] and executed == []
    assert _leased_by_a_pass(pass_took, run.id)


def test_a_stream_of_direct_starts_does_not_starve_other_functions_due_runs(
    make_app: Callable[..., ss.App],
) -> None:
    """Fairness across partitions: a worker with one slot, a process sending
    runs of one function one after another beside it (each started
    directly in its send) and runs of another function queued meanwhile by
    another process. A lease pass serves the least recently served due
    partition first, so the two would alternate; a direct start skips the
    pass, so it must not take the slot while the worker knows a pass is
    due. Before: the queued runs waited for the stream to stop (none of 3
    ran during 8 s of it, on both stores; with direct starts off: p q p q p q)."""
    app, client = make_app("here"), make_app("there")
    order: list[str] = []
    for each in (app, client):
        for name in ("p", "q"):

            @each.function(id=name, trigger=ss.on_event(name))
            async def run(ctx: ss.Context) -> None:
                await ctx.step.run("s", lambda: order.append(ctx.function_id))
                await asyncio.sleep(0.02)

    async def stream() -> float:
        await app.start_async(concurrency=1)
        try:
            [eid] = await app.send_async(ss.Event("p"))
            [run] = await app.runs.list_async(event_id=eid)
            await asyncio.to_thread(client.send, [ss.Event("q") for _ in range(3)])
            began = time.monotonic()
            while order.count("q") < 3 and time.monotonic() - began < 8:
                await app.runs.wait_async(run.id, timeout="10s")
                [eid] = await app.send_async(ss.Event("p"))
                [run] = await app.runs.list_async(event_id=eid)
            return time.monotonic() - began
        finally:
            await app.stop_async()

    took = asyncio.run(stream())
    assert order.count("q") == 3, "".join(order)
    assert took < 4, took  # (SQLite: the worker hears of the other process's runs within max_idle_sleep)


def test_a_send_right_after_the_worker_starts_does_not_jump_the_backlog_it_found(
    make_app: Callable[..., ss.App],
) -> None:
    """The class of the test above, at a worker's start: runs another process
    queued before the worker started are due; a send beside the worker
    right after ``start`` must not take the slot before the start-up pass
    has taken what it found (``start`` returns once that pass is over)."""
    app, client = make_app("here"), make_app("there")
    order: list[str] = []
    for each in (app, client):
        for name in ("p", "q"):

            @each.function(id=name, trigger=ss.on_event(name))
            async def handler(ctx: ss.Context) -> None:
                await ctx.step.run("s", lambda: order.append(ctx.function_id))

    client.send([ss.Event("q") for _ in range(2)])
    app.start(concurrency=1)
    [run] = app.runs.list(event_id=app.send(ss.Event("p"))[0])
    assert app.runs.wait(run.id, timeout="10s").status == "completed"
    wait_for(lambda: len(order) == 3, 10, "every run")
    assert order[0] == "q", order


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_a_stop_waits_for_a_stuck_direct_start_no_longer_than_its_drain_timeout(
    make_app: Callable[..., ss.App], db_url: str
) -> None:
    """``app.stop(drain_timeout)`` waits for the direct starts whose sends are
    committing, so that their runs join the drain; but a send stuck in its
    write (here its partition's row locked by another session; PostgreSQL
    has no lock timeout) must not hold the stop past its drain timeout. Its
    run, committed later for the stopped worker, is not started there: its
    lease lapses and another worker runs it, once. (SQLite's busy timeout
    bounds such a write.)"""
    import psycopg

    app, other = make_app("here"), make_app("there")
    executed: list[tuple[str, str]] = []  # (app, run)
    for each in (app, other):

        @each.function(id="f", trigger=ss.on_event("f"))
        async def f(ctx: ss.Context, name: str = each.name) -> str:
            await ctx.step.run("effect", lambda: executed.append((name, ctx.run_id)))
            return "done"

    app.start(lease_ttl=3)  # (the stuck send's lease outlives the stop: the hand-over comes while it is live)
    [warm] = app.send(ss.Event("f"))  # the partition's row exists
    assert app.runs.wait(run_of(app, warm).id, timeout="10s").status == "completed"
    sent: list[str] = []
    locker = psycopg.connect(db_url)
    try:
        locker.execute("SET idle_in_transaction_session_timeout = '8s'")  # (the test's own bound)
        locker.execute("SELECT key FROM partitions WHERE key = 'f' FOR UPDATE")
        sender = threading.Thread(target=lambda: sent.extend(app.send(ss.Event("f", id="stuck"))))
        sender.start()
        waiting = (
            "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
        )
        wait_for(lambda: bool(query(db_url, waiting)), 10, "the send waiting for the row")
        began = time.monotonic()
        app.stop(drain_timeout=1)
        stopped_in = time.monotonic() - began
    finally:
        with contextlib.suppress(psycopg.Error):  # (ended by its timeout if the stop waited that long)
            locker.rollback()
        locker.close()
    sender.join(10)
    assert sent == ["stuck"] and stopped_in < 5, stopped_in
    other.start()
    run = run_of(other, "stuck")
    done = other.runs.wait(run.id, timeout="20s")
    assert [(s.status, s.attempts) for s in done.steps] == [("completed", 1)], done.steps
    assert [e for e in executed if e[1] == run.id] == [("there", run.id)]  # none on the stopped worker
