"""Who runs a PostgreSQL transaction on which thread (issue 18, session 7).

An event loop's write awaited while nothing else is ready on the loop runs on
the loop's own thread, on an idle writer's connection (no hand-off to a writer
thread and back); writes submitted together still share one transaction; the
run of early commits is capped so that timers get their turn; a read likewise
runs on the loop on a free pooled connection. A held run's end notifies
other processes but wakes no local worker (that wake-up was an empty lease
pass after every run), and a run waiting for the slot an end frees still
starts at once, in this process and in another.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import stepstone as ss
from stepstone.scheduler.leasing import RECHECK
from stepstone.store.base import Tx
from stepstone.store.eager import EagerTurns
from stepstone.store.postgres import PostgresStore
from stepstone.worker import Worker

from ..polling import wait_for

PG_ONLY = pytest.mark.parametrize("db_url", ["postgres"], indirect=True)


@pytest.fixture
def pg_store(db_url: str) -> Iterator[PostgresStore]:
    store = PostgresStore.from_url(db_url)
    store.migrate()
    store.transact_sync(_txid)  # the first writer connects
    wait_for(lambda: len(store._writers.idle) == 2, 10, "both writers idle")
    yield store
    store.close()


def _txid(tx: Tx) -> tuple[str, int]:
    row = tx.conn.execute("SELECT txid_current() AS tx").fetchone()  # type: ignore[attr-defined]
    return threading.current_thread().name, int(row["tx"])


@PG_ONLY
def test_a_lone_write_awaited_on_an_idle_loop_runs_on_the_loops_thread(pg_store: PostgresStore) -> None:
    async def scenario() -> list[tuple[str, int]]:
        return [await pg_store.transact(_txid) for _ in range(3)]

    borrowed = pg_store._writers.borrowed
    done = asyncio.run(scenario())
    assert [name for name, _ in done] == [threading.current_thread().name] * 3
    assert len({tx for _, tx in done}) == 3  # each its own commit
    assert pg_store._writers.borrowed - borrowed == 3


@PG_ONLY
def test_writes_awaited_together_share_one_transaction(pg_store: PostgresStore) -> None:
    """Ten tasks' writes (ten runs' checkpoints) are one group commit, wherever it runs."""

    async def scenario() -> list[tuple[str, int]]:
        async def one() -> tuple[str, int]:
            return await pg_store.transact(_txid)

        return list(await asyncio.gather(*(one() for _ in range(10))))

    done = asyncio.run(scenario())
    assert len({tx for _, tx in done}) == 1


@PG_ONLY
def test_a_write_waits_for_the_writers_while_the_loop_has_other_work(pg_store: PostgresStore) -> None:
    """A write awaited while another task is ready is left for the flush, so
    that what the other task writes joins the same transaction."""

    async def scenario() -> list[tuple[str, int]]:
        async def other() -> tuple[str, int]:
            return await pg_store.transact(_txid)

        task = asyncio.create_task(other())  # ready: it runs before the flush
        mine = await pg_store.transact(_txid)
        return [mine, await task]

    mine, other = asyncio.run(scenario())
    assert mine[1] == other[1]


@PG_ONLY
def test_early_commits_in_a_row_let_the_loop_turn(pg_store: PostgresStore) -> None:
    """A task awaiting write after write without another await commits early
    at most ``EAGER_RUN`` times in a row: then the loop turns and a due timer runs."""
    order: list[str] = []

    def write(tx: Tx) -> None:
        order.append("write")

    async def scenario() -> None:
        asyncio.get_running_loop().call_later(0, order.append, "timer")
        for _ in range(3 * EagerTurns.EAGER_RUN):
            await pg_store.transact(write)

    asyncio.run(scenario())
    assert order.index("timer") <= EagerTurns.EAGER_RUN + 1
    assert order.count("write") == 3 * EagerTurns.EAGER_RUN


@PG_ONLY
def test_a_read_on_an_idle_loop_runs_on_the_loops_thread(pg_store: PostgresStore) -> None:
    def where(tx: Tx) -> str:
        tx.get_run("none")
        return threading.current_thread().name

    pg_store.read_sync(where)  # the pool opens with one connection

    async def scenario() -> list[str]:
        return [await pg_store.read(where) for _ in range(3)]

    before = pg_store.reads_here
    assert asyncio.run(scenario()) == [threading.current_thread().name] * 3
    assert pg_store.reads_here - before == 3


def _counting_passes(worker: Worker) -> list[int]:
    """Counts the worker's lease passes (each one transaction)."""
    passes: list[int] = []
    lease = worker._lease

    async def counted(*args: Any, **kwargs: Any) -> Any:
        passes.append(1)
        return await lease(*args, **kwargs)

    worker._lease = counted  # type: ignore[method-assign]
    return passes


def test_a_sequential_run_costs_no_empty_lease_pass(make_app: Callable[..., ss.App]) -> None:
    """Send, ``runs.list``, ``runs.wait``: the run starts directly in the send's
    transaction and its end wakes no local worker, so the worker never leases
    (before: one empty pass per run, woken by the end). Every write of the run
    commits (four per run)."""
    app = make_app()

    async def trivial() -> int:
        return 1

    @app.function(id="three", trigger=ss.on_event("three"))
    async def three(ctx: ss.Context) -> int:
        for i in range(3):
            await ctx.step.run(f"s{i}", trivial)
        return 1

    async def scenario() -> tuple[int, int]:
        # (PostgreSQL: the listener connected before the worker starts: its first
        # connection wakes its subscribers, a pass that would otherwise land
        # among the counted ones whenever it connects after the start-up pass)
        connected = threading.Event()
        app.store.subscribe(connected.set)
        if isinstance(app.store, PostgresStore):
            assert await asyncio.to_thread(connected.wait, 10)
        worker = await app.start_async(concurrency=10)
        idle = asyncio.Event()
        worker.on_idle = idle.set
        await asyncio.wait_for(idle.wait(), 10)  # the start-up pass is over
        passes = _counting_passes(worker)
        store: Any = app.store
        commits = store.commits
        for _ in range(5):
            [event_id] = await app.send_async(ss.Event("three"))
            [run] = await app.runs.list_async(event_id=event_id)
            assert (await app.runs.wait_async(run.id, timeout="10s")).status == "completed"
        idle.clear()
        worker.notify()  # one pass of our own: every wake-up before it was served
        await asyncio.wait_for(idle.wait(), 10)
        return len(passes), store.commits - commits

    passes, commits = asyncio.run(scenario())
    assert passes == 1  # ours
    assert commits == 5 * 4


def _blocking_function(app: ss.App, fn_id: str, gate: threading.Event) -> None:
    limit = ss.Concurrency(limit=1, key="event.data.k", scope="env")

    @app.function(id=fn_id, trigger=ss.on_event(fn_id), concurrency=limit)
    def held(ctx: ss.Context) -> str:
        ctx.step.run("wait", lambda: gate.wait(10))
        return fn_id


def _start_slow_polling(app: ss.App, concurrency: int) -> None:
    """Start the app's worker; it neither polls nor leases on a timer (a
    minute each) from its next idle wait on: only a wake-up can start a run."""
    app.start(concurrency=concurrency)
    worker = app._local_workers[-1]
    worker.idle_poll = worker.max_idle_sleep = 60
    worker.notify()  # ends the wait begun with the default intervals


def test_a_run_behind_a_concurrency_limit_starts_when_a_local_end_frees_the_slot(
    make_app: Callable[..., ss.App],
) -> None:
    app = make_app()
    gate = threading.Event()
    _blocking_function(app, "f", gate)
    _start_slow_polling(app, 4)
    first, second = (app.send(ss.Event("f", {"k": "x"}))[0] for _ in range(2))
    first_run = app.runs.list(event_id=first)[0]
    wait_for(lambda: app.runs.get(first_run.id).status == "running", 10, "the first run to start")
    assert app.runs.list(event_id=second)[0].status == "queued"  # behind the key
    gate.set()
    second_run = app.runs.list(event_id=second)[0]
    assert app.runs.wait(second_run.id, timeout="10s").output == "f"


@PG_ONLY
def test_a_run_behind_a_concurrency_limit_starts_when_another_process_frees_the_slot(
    make_app: Callable[..., ss.App],
) -> None:
    """Functions ``f`` (hosted by one app) and ``g`` (only by another, a store of
    its own: another process as far as wake-ups go) share an ``env`` key: the
    end of ``f``'s run must wake ``g``'s worker through its NOTIFY."""
    here, there = make_app("here"), make_app("there")
    gate = threading.Event()
    _blocking_function(here, "f", gate)
    _blocking_function(there, "g", gate)
    _start_slow_polling(here, 4)
    _start_slow_polling(there, 4)
    [first] = here.send(ss.Event("f", {"k": "x"}))
    first_run = here.runs.list(event_id=first)[0]
    wait_for(lambda: here.runs.get(first_run.id).status == "running", 10, "f's run to start")
    [second] = there.send(ss.Event("g", {"k": "x"}))
    second_run = there.runs.list(event_id=second)[0]
    assert second_run.status == "queued"  # behind the key f's run holds
    gate.set()
    assert there.runs.wait(second_run.id, timeout="10s").output == "g"


def test_a_run_sent_to_a_full_worker_starts_when_its_slot_frees(make_app: Callable[..., ss.App]) -> None:
    """A worker with one slot runs a run; the next one queued (sent here, then
    from another process) starts when the first ends: the worker's own end
    re-leases, with no wake-up from the store."""
    here, there = make_app("here"), make_app("there")
    gate = threading.Event()

    @here.function(id="one", trigger=ss.on_event("one"))
    def one(ctx: ss.Context) -> str:
        ctx.step.run("wait", lambda: gate.wait(10))
        return "one"

    _start_slow_polling(here, 1)
    runs = []
    for sender in (here, here, there):
        [event_id] = sender.send(ss.Event("one"))
        runs.append(sender.runs.list(event_id=event_id)[0])
    wait_for(lambda: here.runs.get(runs[0].id).status == "running", 10, "the first run to start")
    gate.set()
    for run in runs:
        assert here.runs.wait(run.id, timeout="10s").output == "one"


def test_a_workers_own_run_end_leases_again_only_when_something_may_wait(
    make_app: Callable[..., ss.App],
) -> None:
    """No store wakes a worker at its own run's end: it passes again itself
    when its last pass filled its slots, left due work it could not take (a
    partition another worker's pass held: next pass due within ``RECHECK``),
    or the function has rules that hold queued runs; otherwise not."""
    app = make_app()

    @app.function(id="free", trigger=ss.on_event("free"))
    def free(ctx: ss.Context) -> None:
        return None

    @app.function(id="keyed", trigger=ss.on_event("keyed"), concurrency=ss.Concurrency(limit=1))
    def keyed(ctx: ss.Context) -> None:
        return None

    worker = Worker(store=app.store, registry=app.registry, clock=app.clock, app_name=app.name)
    now = app.clock.now()
    assert not worker._lease_after("free")  # idle queue: an empty pass saved
    assert worker._lease_after("keyed")
    worker._due = now + RECHECK / 2  # a held partition's recheck
    assert worker._lease_after("free")
    worker._due, worker._more = now + 60, True  # its pass filled every slot
    assert worker._lease_after("free")


@PG_ONLY
def test_a_pass_leaving_its_partition_due_wakes_other_processes_not_its_own(db_url: str) -> None:
    """Two worker processes drain one function's partition: a pass holds its
    row, so the other process's pass, skipping it, finds nothing and waits
    for a wake-up with its slots free. A pass that leaves the partition due
    (its own worker full) notifies other processes at its commit (before: only
    their next run end, or ``RECHECK``, woke them: two processes drained little
    more than one); its own worker leases again at its runs' ends, unwoken."""
    here, there = PostgresStore.from_url(db_url), PostgresStore.from_url(db_url)
    try:
        here.migrate()
        woken: dict[str, int] = {"here": 0, "there": 0}

        def counter(name: str) -> Callable[[], None]:
            return lambda: woken.__setitem__(name, woken[name] + 1)

        here.subscribe(counter("here"))
        there.subscribe(counter("there"))
        wait_for(lambda: woken["here"] and woken["there"], 10, "both listeners connected")
        woken.update(here=0, there=0)
        now = 1000.0

        def settle(next_at: float) -> tuple[bool, bool]:
            def op(tx: Any) -> Any:
                tx.settle_partition("f", now, next_at, now + RECHECK)
                return tx

            tx = here.transact_sync(op)  # (what an operation woke is the transaction's once it is over)
            return tx.wake, tx.wake_local

        assert settle(now + 5) == (False, False)  # a partition parked: no one
        assert settle(now) == (True, False)  # left due: other processes
        wait_for(lambda: woken["there"] == 1, 10, "the other process's wake-up")
        assert woken["here"] == 0
    finally:
        here.close()
        there.close()
