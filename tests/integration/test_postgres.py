"""What only PostgreSQL does: schema and concurrent migrations, the CLI's
migrate, error translation on outages, LISTEN/NOTIFY wake-ups."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import stepstone as ss
from stepstone.errors import StoreError, StoreUnavailableError
from stepstone.store.base import Tx
from stepstone.store.postgres import CHANNEL, PostgresStore, parse_url
from stepstone.store.rows import NewEvent, NewRun, QueueSpec, RunEnd, RunStatus
from stepstone.store.viewrows import WorkerRow
from stepstone.worker import Worker

from ..pgcluster import PgCluster
from ..polling import wait_for

SCHEMA_SNAPSHOT = Path(__file__).parent.parent / "schema" / "postgres.txt"
STEPSTONE = str(Path(sys.executable).parent / "stepstone")


def dump_schema(url: str) -> str:
    """Tables, columns, constraints and indexes of the public schema, as text."""
    with psycopg.connect(url) as conn:
        columns = conn.execute(
            "SELECT table_name, column_name, data_type, is_nullable, column_default, collation_name"
            " FROM information_schema.columns WHERE table_schema = 'public'"
            " ORDER BY table_name, ordinal_position"
        ).fetchall()
        constraints = conn.execute(
            "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint"
            " WHERE connamespace = 'public'::regnamespace ORDER BY 1, 2"
        ).fetchall()
        indexes = conn.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public' ORDER BY indexname"
        ).fetchall()
    lines = [
        f"column {t}.{c} {ty}{' NOT NULL' if n == 'NO' else ''}"
        f"{f' DEFAULT {d}' if d else ''}{f' COLLATE {co}' if co else ''}"
        for t, c, ty, n, d, co in columns
    ]
    lines += [f"constraint {t}.{name} {definition}" for t, name, definition in constraints]
    lines += [f"index {definition}" for _name, definition in indexes]
    return "\n".join(lines) + "\n"


@pytest.fixture
def pg_store(pg_url: str) -> Iterator[PostgresStore]:
    store = PostgresStore.from_url(pg_url)
    yield store
    store.close()


_to_close: list[PostgresStore] = []


def request_close(store: PostgresStore) -> None:
    _to_close.append(store)


@pytest.fixture(autouse=True)
def _close_stores() -> Iterator[None]:
    yield
    while _to_close:
        _to_close.pop().close()


def test_migrations_produce_the_canonical_schema(empty_url: str) -> None:
    store = PostgresStore.from_url(empty_url)
    applied = store.migrate()
    assert applied and applied == sorted(applied)
    assert store.migrate() == []  # idempotent
    store.close()
    assert dump_schema(empty_url) == SCHEMA_SNAPSHOT.read_text(), (
        "schema changed: update tests/schema/postgres.txt if the migration is intended"
    )


def test_concurrent_migrators_apply_each_migration_once(empty_url: str) -> None:
    stores = [PostgresStore.from_url(empty_url) for _ in range(4)]
    barrier = threading.Barrier(len(stores))
    results: list[list[str]] = []

    def migrate(store: PostgresStore) -> None:
        barrier.wait()
        results.append(store.migrate())

    threads = [threading.Thread(target=migrate, args=(s,)) for s in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for store in stores:
        store.close()
    assert len(results) == 4
    applied = [name for names in results for name in names]
    assert sorted(applied) == sorted(set(applied)) and applied  # each applied by exactly one
    with psycopg.connect(empty_url) as conn:
        assert conn.execute("SELECT count(*) FROM schema_migrations").fetchone() == (len(applied),)


def test_cli_migrate_on_postgresql(empty_url: str) -> None:
    def migrate() -> str:
        result = subprocess.run(
            [STEPSTONE, "migrate", "--database-url", empty_url], capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout

    assert "0001_init" in migrate()
    assert "up to date" in migrate()


def test_url_options_are_validated_and_stripped() -> None:
    conninfo, options = parse_url("postgresql://u@h:5433/db?writers=3&sslmode=disable")
    assert options == {"writers": 3}
    assert "writers" not in conninfo and "sslmode=disable" in conninfo and "connect_timeout=5" in conninfo
    with pytest.raises(ss.ConfigError, match="writers"):
        parse_url("postgresql://u@h/db?writers=lots")
    with pytest.raises(ss.ConfigError, match="invalid PostgreSQL URL"):
        parse_url("postgresql://u@h/db?no_such_option=1")


def test_an_unreachable_server_is_unavailable_not_a_bug(pg_cluster: PgCluster) -> None:
    from tests.pgcluster import free_port

    store = PostgresStore.from_url(f"postgresql://postgres@127.0.0.1:{free_port()}/x?connect_timeout=2")
    try:
        with pytest.raises(StoreUnavailableError) as caught:
            store.transact_sync(lambda tx: tx.next_due(["f"]))
        assert isinstance(caught.value.__cause__, psycopg.OperationalError)
        with pytest.raises(StoreUnavailableError):
            store.read_sync(lambda tx: tx.next_due(["f"]))
        with pytest.raises(StoreUnavailableError):
            store.migrate()
    finally:
        store.close()


def _terminate_stepstone_backends(url: str, where: str = "true") -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database()"
            f" AND application_name = 'stepstone' AND pid <> pg_backend_pid() AND {where}"
        ).fetchall()
    return len(rows)


def test_a_terminated_connection_is_translated_then_replaced(pg_url: str) -> None:
    pg_store = PostgresStore.from_url(pg_url + "?writers=1")
    request_close(pg_store)
    assert pg_store.transact_sync(lambda tx: tx.next_due(["f"])) is None  # connect the writer
    assert pg_store.read_sync(lambda tx: tx.next_due(["f"])) is None  # and a pooled reader
    assert _terminate_stepstone_backends(pg_url) >= 2  # "terminating connection due to administrator command"
    # a read finds its pooled connection dead and repeats itself on a new one
    assert pg_store.read_sync(lambda tx: tx.next_due(["f"])) is None
    outcomes: list[Any] = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            outcomes.append(pg_store.transact_sync(lambda tx: tx.next_due(["f"])))
            break
        except StoreUnavailableError as exc:
            assert isinstance(exc.__cause__, psycopg.OperationalError)
            outcomes.append(exc)
    assert outcomes[-1] is None  # reconnected
    assert any(isinstance(o, StoreUnavailableError) for o in outcomes)  # and the loss was reported


def test_a_closed_store_refuses_work(pg_url: str) -> None:
    closed = PostgresStore.from_url(pg_url)
    assert closed.read_sync(lambda tx: tx.next_due(["f"])) is None
    closed.close()
    closed.close()  # twice is fine
    with pytest.raises(StoreError, match="closed"):
        closed.transact_sync(lambda tx: tx.next_due(["f"]))
    with pytest.raises(StoreError, match="closed"):
        closed.read_sync(lambda tx: tx.next_due(["f"]))


def _new_run(run_id: str) -> Callable[[Tx], None]:
    def op(tx: Tx) -> None:
        seq = tx.insert_event(NewEvent(id=f"e-{run_id}", name="go", data="{}", ts=0, received_at=1.0))
        tx.create_run(
            NewRun(
                id=run_id,
                function_id="f",
                event_seqs=[seq],
                event_ids=[f"e-{run_id}"],
                available_at=1.0,
                created_at=1.0,
            )
        )

    return op


def test_work_is_notified_in_the_transaction_and_only_then(pg_url: str, pg_store: PostgresStore) -> None:
    with psycopg.connect(pg_url, autocommit=True) as listener:
        listener.execute(f"LISTEN {CHANNEL}")
        row = WorkerRow(id="w", app="app", app_version=None, concurrency=1, started_at=1.0, heartbeat_at=1.0)
        pg_store.transact_sync(lambda tx: tx.upsert_worker(row))  # makes no work available
        with psycopg.connect(pg_url, autocommit=True) as other:
            other.execute(f"NOTIFY {CHANNEL}, 'marker'")
        pg_store.transact_sync(_new_run("r1"))
        got = [n.payload for n in listener.notifies(timeout=10, stop_after=2)]
    # notifications arrive in commit order: the worker upsert sent none
    assert got == ["marker", ""]


def test_listener_wakes_subscribers_and_survives_a_dropped_connection(
    pg_url: str, pg_store: PostgresStore
) -> None:
    woken = threading.Event()
    unsubscribe = pg_store.subscribe(woken.set)
    wait_for(lambda: pg_store._listener.connected.is_set(), 10, "the listener to connect")
    sender = PostgresStore.from_url(pg_url)
    try:
        woken.clear()
        sender.transact_sync(_new_run("r1"))
        assert woken.wait(10)
        assert _terminate_stepstone_backends(pg_url, "query LIKE 'LISTEN%'") == 1
        wait_for(lambda: not pg_store._listener.connected.is_set() or woken.is_set(), 10, "the drop")
        wait_for(pg_store._listener.connected.is_set, 10, "the listener to reconnect")
        woken.clear()
        sender.transact_sync(_new_run("r2"))
        assert woken.wait(10)
        unsubscribe()
    finally:
        sender.close()


def test_own_commits_wake_at_commit_and_their_echo_is_dropped(pg_url: str, pg_store: PostgresStore) -> None:
    """Each commit that makes work available wakes the store's subscribers once:
    at commit, not again when its NOTIFY comes back. Another store's commit
    (another process) still wakes them through the listener."""
    fired: list[str] = []
    unsubscribe = pg_store.subscribe(lambda: fired.append(threading.current_thread().name))
    wait_for(lambda: pg_store._listener.connected.is_set() and fired, 10, "the listener to connect")
    fired.clear()
    pg_store.transact_sync(_new_run("mine"))  # wakes the subscribers before it returns
    assert len(fired) == 1 and not fired[0].startswith("stepstone-pg-listen")
    sender = PostgresStore.from_url(pg_url)
    try:
        sender.transact_sync(_new_run("theirs"))
        # notifications arrive in commit order: once the other store's has woken
        # the subscribers, the echo of ours was read (and dropped) before it
        wait_for(lambda: len(fired) >= 2, 10, "the other store's notification")
        assert fired[1].startswith("stepstone-pg-listen") and len(fired) == 2
    finally:
        unsubscribe()
        sender.close()


def test_a_send_wakes_the_apps_own_worker_through_its_commit(pg_url: str) -> None:
    """On PostgreSQL the app does not poke its local workers after a send (the
    store's commit does; a second poke cost an empty lease pass). The worker
    neither polls nor re-leases on a timer here (both a minute), and the
    listener drops the echo of the send's NOTIFY: only the wake at commit can
    start the run."""
    app = ss.App("self-waker", database_url=pg_url)

    @app.function(id="f", trigger=ss.on_event("go"))
    def f(ctx: ss.Context) -> str:
        return "done"

    async def scenario() -> ss.Run:
        worker = await app.start_async(concurrency=1)
        worker.idle_poll = worker.max_idle_sleep = 60
        idle = asyncio.Event()
        worker.on_idle = idle.set
        worker.notify()  # one more (empty) pass, then idle with the intervals above
        await asyncio.wait_for(idle.wait(), 10)
        [event_id] = await app.send_async(ss.Event("go"))
        [run] = await app.runs.list_async(event_id=event_id)
        return await app.runs.wait_async(run.id, timeout="10s")

    try:
        run = asyncio.run(scenario())
        assert (run.status, run.output) == ("completed", "done")
    finally:
        app.close()


def test_an_idle_worker_wakes_on_notify_not_polling(pg_url: str) -> None:
    """The worker neither polls the change token nor re-leases on a timer here
    (both intervals are a minute), and the sender is another store (no
    in-process notify): only the NOTIFY committed with the send can wake it."""
    app = ss.App("waker", database_url=pg_url)
    sender = ss.App("sender", database_url=pg_url)

    @app.function(id="f", trigger=ss.on_event("go"))
    def f(ctx: ss.Context) -> str:
        return "done"

    store = app.store
    assert isinstance(store, PostgresStore)
    connected = threading.Event()
    unsubscribe = store.subscribe(connected.set)  # the listener's first wake-up, before the worker
    assert connected.wait(10)
    unsubscribe()

    async def scenario() -> ss.Run:
        idle = asyncio.Event()
        worker = Worker(
            store=store,
            registry=app.registry,
            clock=app.clock,
            app_name=app.name,
            idle_poll=60,
            max_idle_sleep=60,
            on_idle=idle.set,
        )
        await worker.start()
        try:
            await asyncio.wait_for(idle.wait(), 10)  # leased nothing; now idle
            [event_id] = await asyncio.to_thread(sender.send, ss.Event("go"))
            [run] = await sender.runs.list_async(event_id=event_id)
            return await sender.runs.wait_async(run.id, timeout="10s")
        finally:
            await worker.stop()

    try:
        run = asyncio.run(scenario())
        assert (run.status, run.output) == ("completed", "done")
    finally:
        app.close()
        sender.close()


def test_a_deadlock_victim_is_run_again(pg_url: str, pg_store: PostgresStore) -> None:
    """Two operations lock two rows in opposite orders: PostgreSQL aborts one;
    the store runs it again instead of failing its caller."""
    pg_store.transact_sync(_new_run("x"))
    pg_store.transact_sync(_new_run("y"))
    other = PostgresStore.from_url(pg_url)
    request_close(other)
    barrier = threading.Barrier(2, timeout=5)
    attempts: list[str] = []

    def crossing(first: str, second: str) -> Callable[[Tx], None]:
        def op(tx: Tx) -> None:
            attempts.append(first)
            conn = tx.conn  # type: ignore[attr-defined]
            mark = "UPDATE runs SET meta = COALESCE(meta, '') || %(op)s WHERE id = %(id)s"
            assert conn.execute(mark, {"id": first, "op": first}).rowcount == 1  # holds the row lock
            if attempts.count(first) == 1:
                barrier.wait()  # both hold one row; each now wants the other's
            assert conn.execute(mark, {"id": second, "op": first}).rowcount == 1

        return op

    results: list[Any] = []
    threads = [
        threading.Thread(target=lambda s=s, a=a, b=b: results.append(s.transact_sync(crossing(a, b))))
        for s, a, b in ((pg_store, "x", "y"), (other, "y", "x"))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert results == [None, None]  # both committed, neither caller saw the deadlock
    # the victim ran again. (Not "the other once": under load, with the test
    # cluster's 100 ms deadlock_timeout, both were seen to lose a round.)
    assert len(attempts) >= 3, attempts
    # and each committed once: both rows carry each operation's mark exactly once
    marks = [_meta(pg_store, run_id) for run_id in ("x", "y")]
    assert [sorted(m or "") for m in marks] == [["x", "y"], ["x", "y"]], (marks, attempts)


def _meta(store: PostgresStore, run_id: str) -> str | None:
    run = store.read_sync(lambda tx: tx.get_run(run_id))
    assert run is not None
    return run.meta


@contextlib.contextmanager
def uncommitted(url: str, op: Callable[[Tx], object]) -> Iterator[None]:
    """Run ``op`` in a transaction of another store (another worker) and hold it
    open, its statements executed but not committed, for the block; it commits
    as the block ends, and its failure, if any, is raised here."""
    other = PostgresStore.from_url(url)
    request_close(other)
    inside, go_on = threading.Event(), threading.Event()
    failures: list[BaseException] = []

    def held(tx: Tx) -> None:
        op(tx)
        tx.get_run("-")  # a read: every statement sent before it has run (pipelined or not)
        inside.set()
        go_on.wait(10)

    def run() -> None:
        try:
            other.transact_sync(held)
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            failures.append(exc)
            inside.set()

    thread = threading.Thread(target=run)
    thread.start()
    try:
        assert inside.wait(10) and not failures, failures
        yield
    finally:
        go_on.set()
        thread.join(10)
    if failures:
        raise failures[0]


def test_a_release_racing_a_lease_pass_is_not_lost(pg_url: str, pg_store: PostgresStore) -> None:
    """A run that frees its key's only slot commits while another worker's lease
    pass is deciding whether that key's partition is full. The pass cannot see
    the uncommitted release; it must not park the partition past the release
    (the waiting run would start only at the next re-check, seconds later)."""
    from stepstone.scheduler.leasing import lease
    from tests.integration.test_store_contract import F_ONLY, NOW

    spec = QueueSpec(partition_key="f:k", ckey1="k", limit1=1)

    def two_runs(tx: Tx) -> None:
        for run_id in ("a", "b"):
            seq = tx.insert_event(NewEvent(id=f"ev-{run_id}", name="go", data="{}", ts=2, received_at=NOW))
            tx.create_run(
                NewRun(
                    id=run_id,
                    function_id="f",
                    event_seqs=[seq],
                    event_ids=[f"ev-{run_id}"],
                    available_at=NOW,
                    created_at=NOW,
                    spec=spec,
                )
            )

    pg_store.transact_sync(two_runs)
    first = pg_store.transact_sync(lambda tx: lease(tx, "w1", F_ONLY, 2, NOW, NOW + 60))
    assert [lr.run.id for lr in first] == ["a"]  # b waits for a's slot
    pg_store.transact_sync(lambda tx: tx.lower_partition("f:k", "f", "k", NOW))  # due again (any wake)

    with uncommitted(
        pg_url,
        lambda tx: tx.finish_run(
            RunEnd(fence=None, run_id="a", status=RunStatus.COMPLETED, output="null", now=NOW + 1)
        ),
    ):
        racing = pg_store.transact_sync(lambda tx: lease(tx, "w2", F_ONLY, 2, NOW + 1, NOW + 61))
        assert racing == []  # a's slot is not free until the release commits
    after = pg_store.transact_sync(lambda tx: lease(tx, "w2", F_ONLY, 2, NOW + 1, NOW + 61))
    assert [lr.run.id for lr in after] == ["b"]  # due at once, not at the next re-check


def test_a_lease_cannot_change_hands_inside_a_checkpoint(pg_url: str, pg_store: PostgresStore) -> None:
    """A worker that passed its fence check and has not committed yet still
    owns the run: a lease pass after the lease expired skips it rather than
    hand the run to a second worker that would not see this checkpoint."""
    from stepstone.scheduler.leasing import lease
    from stepstone.store.rows import Fence
    from tests.integration.test_store_contract import F_ONLY, NOW, step

    pg_store.transact_sync(_new_run("a"))
    [held] = pg_store.transact_sync(lambda tx: lease(tx, "w1", F_ONLY, 1, NOW, NOW + 10))
    with uncommitted(
        pg_url,
        lambda tx: tx.checkpoint(Fence(run_id="a", owner="w1", epoch=held.epoch), [step("a", "charge")], []),
    ):
        assert pg_store.transact_sync(lambda tx: lease(tx, "w2", F_ONLY, 1, NOW + 20, NOW + 80)) == []
    # The skipped item is looked at again a moment later (not forgotten):
    [taken] = pg_store.transact_sync(lambda tx: lease(tx, "w2", F_ONLY, 1, NOW + 21, NOW + 80))
    assert taken.epoch == held.epoch + 1
    assert [s.step_id for s in taken.steps] == ["charge"]  # the new owner sees the checkpoint


def test_closing_a_listener_never_writes_to_a_closed_pipe(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``close`` sets the stop flag, then wakes the listener thread through a
    pipe. The thread may see the flag first (its select timed out) and end
    before that write: the pipe must outlive the write (the thread used to
    close it on its way out, and the write failed with EBADF, a flaky error in
    test teardowns, or could hit a reused descriptor). The interleaving is
    forced here: the flag is set, the thread ends, then close wakes it."""
    from stepstone.store import pglisten

    monkeypatch.setattr(pglisten, "PING_EVERY", 0.01)  # the thread looks at the flag often
    listener = pglisten.Listener(lambda: psycopg.connect(pg_url, autocommit=True), CHANNEL)
    listener.start()
    assert listener.connected.wait(10)
    thread = listener._thread
    assert thread is not None
    listener._stop.set()  # close()'s first half
    thread.join(10)  # the thread saw it before being woken
    assert not thread.is_alive()
    listener._wake_and_release(thread, 5.0)  # close()'s second half: raised OSError (EBADF)


def _holding(store: PostgresStore) -> tuple[threading.Thread, threading.Event, threading.Event, list[str]]:
    """A blocking caller inside its own write until ``release`` is set; ``where``
    gets the name of the thread that ran the write."""
    inside, release, where = threading.Event(), threading.Event(), []

    def held(tx: Tx) -> None:
        where.append(threading.current_thread().name)
        tx.get_run("-")  # the transaction is open on the server
        inside.set()
        assert release.wait(10)

    thread = threading.Thread(target=lambda: store.transact_sync(held), name="blocking-caller")
    thread.start()
    assert inside.wait(10)
    return thread, inside, release, where


def _where_ran(store: PostgresStore) -> str:
    names: list[str] = []
    store.transact_sync(lambda tx: names.append(threading.current_thread().name))
    return names[0]


def test_a_blocking_write_runs_on_its_callers_thread_when_a_writer_is_idle(pg_url: str) -> None:
    store = PostgresStore.from_url(pg_url + "?writers=2")
    request_close(store)
    assert _where_ran(store) == threading.current_thread().name  # no hand-off to a writer thread
    thread, _inside, release, where = _holding(store)
    assert where == ["blocking-caller"]
    try:
        # one writer is lent out: the next caller borrows the other one
        assert _where_ran(store) == threading.current_thread().name
    finally:
        release.set()
        thread.join(10)


def test_work_queued_while_a_writer_is_lent_is_committed(pg_url: str) -> None:
    """With its only writer lent to a blocking caller, an event loop's write
    waits for it to come back, then commits on that writer's thread."""
    store = PostgresStore.from_url(pg_url + "?writers=1")
    request_close(store)
    store.transact_sync(_new_run("before"))  # connect the writer
    thread, _inside, release, _where = _holding(store)
    names: list[str] = []

    async def submit() -> None:
        def op(tx: Tx) -> None:
            names.append(threading.current_thread().name)
            _new_run("queued")(tx)

        future = store.submit(op)
        await asyncio.sleep(0.2)
        assert not future.done()  # the writer is lent out
        release.set()
        await asyncio.wait_for(future, 10)

    asyncio.run(submit())
    thread.join(10)
    assert names and names[0].startswith("stepstone-pg-writer")
    assert store.read_sync(lambda tx: tx.get_run("queued")) is not None
    # Lent again once idle: the writer thread resolves the loop's future before
    # it is idle, so a blocking write just after may still be handed to it.
    me = threading.current_thread().name
    wait_for(lambda: _where_ran(store) == me, 10, "the writer lent to a blocking caller once idle")


def test_closing_while_a_writer_is_lent_waits_for_it_and_no_longer(pg_url: str) -> None:
    store = PostgresStore.from_url(pg_url + "?writers=1")
    store.transact_sync(_new_run("x"))
    thread, _inside, release, _where = _holding(store)
    closing = threading.Thread(target=store.close)
    closing.start()
    closing.join(0.3)
    assert closing.is_alive()  # the lent connection is in use
    started = time.monotonic()
    release.set()
    closing.join(10)
    thread.join(10)
    assert not closing.is_alive() and time.monotonic() - started < 5  # not the writers' 10 s join timeout
