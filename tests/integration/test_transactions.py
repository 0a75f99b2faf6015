"""Transactional steps (issue 15): ``step.transaction`` commits the user's
writes to the Stepstone database exactly once, together with the step's memo.

Every test runs on SQLite and PostgreSQL. The user's table lives in the
Stepstone database (on PostgreSQL in its own schema, as the README advises).
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

import stepstone as ss
from stepstone import limits
from stepstone.errors import LeaseLostError
from stepstone.middleware import NO_HOOKS
from stepstone.store import faults
from stepstone.store.base import Store, Tx
from stepstone.store.rows import Fence, StepKind, StepRow, StepStatus
from stepstone.testing import VirtualClock
from stepstone.txstep import TransactionCommit

from ..batches import submitted_together
from ..conftest import FAST, query, run_of, send_and_wait
from ..polling import wait_for
from ..usertables import create_table, inserter, rows
from .test_store_contract import NOW, add_runs, lease, step


@pytest.fixture
def table(db_url: str) -> str:
    return create_table(db_url)


def test_a_transaction_step_writes_one_row_and_returns_what_fn_returned(
    app: ss.App, db_url: str, table: str
) -> None:
    insert = inserter(db_url)
    calls: Counter[str] = Counter()

    keys: list[str] = []

    @app.function(id="sub", trigger=ss.on_event("go"), backoff=FAST)
    def sub(ctx: ss.Context) -> Any:
        def record(conn: Any, user_id: str) -> dict[str, Any]:
            calls["fn"] += 1
            keys.append(ctx.step.idempotency_key())  # fn runs in its step's scope
            return {"user": insert(conn, user_id)}

        created = ctx.step.transaction("create-record", record, ctx.event.data["user"])
        ctx.step.sleep("nap", "10ms")  # a replay: the memo is returned, fn is not called again
        keys.append(ctx.step.idempotency_key("create-record"))
        return created

    app.start()
    run = send_and_wait(app, ss.Event("go", {"user": "u1"}))
    assert run.status == "completed", run.error
    assert run.output == {"user": "u1"}
    assert rows(db_url) == [("u1", 0)]
    assert calls["fn"] == 1
    assert len(keys) == 2 and keys[0] == keys[1]
    step = run.steps[0]
    assert (step.id, step.kind, step.status, step.attempts, step.output) == (
        "create-record",
        "transaction",
        "completed",
        1,
        {"user": "u1"},
    )


def test_an_async_handler_awaits_a_transaction_and_a_coroutine_fn_is_refused(
    app: ss.App, db_url: str, table: str
) -> None:
    insert = inserter(db_url)

    async def not_plain(conn: Any) -> None:
        return None

    @app.function(id="sub", trigger=ss.on_event("go"), backoff=FAST)
    async def sub(ctx: ss.Context) -> Any:
        user = await ctx.step.transaction("create-record", insert, "u1")
        try:
            await ctx.step.transaction("async-fn", not_plain)
        except ss.NonRetriableError as exc:
            return [user, str(exc)]
        return [user, None]

    app.start()
    run = send_and_wait(app, ss.Event("go"))
    assert run.status == "completed", run.error
    assert run.output == ["u1", "step.transaction needs a plain function, not a coroutine function"]
    assert rows(db_url) == [("u1", 0)]


def test_a_failing_fn_leaves_no_row_and_is_retried_until_it_succeeds(
    make_app: Callable[..., ss.App], db_url: str, table: str
) -> None:
    app = make_app(middleware=[ss.EncryptionMiddleware("a long random secret for tests")])
    insert = inserter(db_url)
    attempts: list[int] = []

    def flaky(conn: Any, user_id: str) -> str:
        attempts.append(len(attempts))
        insert(conn, user_id, len(attempts) - 1)  # written, then rolled back on failure
        if len(attempts) < 3:
            raise RuntimeError(f"attempt {len(attempts)} broke")
        return user_id

    seen: list[Any] = []

    @app.function(id="sub", trigger=ss.on_event("go"), backoff=FAST)
    def sub(ctx: ss.Context) -> None:
        seen.append(ctx.step.transaction("create-record", flaky, "u1"))

    app.start()
    run = send_and_wait(app, ss.Event("go"))
    assert run.status == "completed", run.error
    assert attempts == [0, 1, 2]
    assert rows(db_url) == [("u1", 2)]  # only the attempt that succeeded left its row
    assert run.steps[0].attempts == 3 and seen == ["u1"]
    assert ss.is_encrypted(run.steps[0].output)  # middleware applies as to any output
    [(stored,)] = query(db_url, "SELECT output FROM steps")
    assert '"u1"' not in stored  # the JSON of the plaintext (base64 ciphertext has no quotes)
    steps = [s for s in app.runs.trace(run.id) if s.kind == "step"]
    assert [(s.attempt, s.status, s.error and s.error.message) for s in steps] == [
        (1, "retrying", "attempt 1 broke"),
        (2, "retrying", "attempt 2 broke"),
        (3, "completed", None),
    ]


def test_a_fn_that_always_fails_fails_the_step_and_leaves_no_row(
    app: ss.App, db_url: str, table: str
) -> None:
    insert = inserter(db_url)

    def broken(conn: Any) -> None:
        insert(conn, "u1")
        raise ValueError("constraint the user's code enforces")

    @app.function(id="sub", trigger=ss.on_event("go"), retries=2, backoff=FAST)
    def sub(ctx: ss.Context) -> None:
        ctx.step.transaction("create-record", broken)

    app.start()
    run = send_and_wait(app, ss.Event("go"))
    assert run.status == "failed"
    assert run.steps[0].attempts == 3 and run.steps[0].status == "failed"
    assert run.error is not None and run.error.type == "ValueError"
    assert rows(db_url) == []


def test_a_fn_running_past_its_bound_is_rolled_back_and_retried(
    app: ss.App, db_url: str, table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first attempt's SQL runs past the bound: the database interrupts it
    (SQLite's progress handler, PostgreSQL's statement_timeout); the second is quick."""
    monkeypatch.setattr(limits, "MAX_TRANSACTION_SECONDS", 0.3)
    insert = inserter(db_url)
    slow = (
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT COUNT(*) FROM c"
        if db_url.startswith("sqlite:")
        else "SELECT pg_sleep(30)"
    )
    attempts: list[int] = []

    def once_slow(conn: Any) -> str:
        attempts.append(len(attempts))
        insert(conn, "u1", len(attempts) - 1)
        if len(attempts) == 1:
            conn.execute(slow)  # never finishes on its own
        return "done"

    @app.function(id="sub", trigger=ss.on_event("go"), backoff=FAST)
    def sub(ctx: ss.Context) -> str:
        return str(ctx.step.transaction("create-record", once_slow))

    app.start()
    run = send_and_wait(app, ss.Event("go"), timeout="20s")
    assert run.status == "completed", run.error
    assert attempts == [0, 1] and rows(db_url) == [("u1", 1)]


def test_a_fn_that_swallows_a_failed_statement_never_spoils_the_commit(
    app: ss.App, db_url: str, table: str
) -> None:
    """On PostgreSQL a failed statement aborts the transaction even if ``fn``
    catches the error: that attempt fails and is rolled back alone (SQLite goes on)."""
    insert = inserter(db_url)
    attempts: list[int] = []

    def swallows(conn: Any) -> str:
        attempts.append(len(attempts))
        insert(conn, "u1", len(attempts) - 1)
        if len(attempts) == 1:
            try:
                conn.execute("SELECT * FROM no_such_table")
            except Exception:  # noqa: BLE001 - what the test is about
                pass
        return "done"

    @app.function(id="sub", trigger=ss.on_event("go"), backoff=FAST)
    def sub(ctx: ss.Context) -> str:
        return str(ctx.step.transaction("create-record", swallows))

    app.start()
    run = send_and_wait(app, ss.Event("go"))
    assert run.status == "completed", run.error
    if db_url.startswith("sqlite:"):
        assert attempts == [0] and rows(db_url) == [("u1", 0)]
    else:
        assert attempts == [0, 1] and rows(db_url) == [("u1", 1)]
        [failed] = [s for s in app.runs.trace(run.id) if s.status == "retrying"]
        assert failed.error is not None and failed.error.type == "InFailedSqlTransaction"


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_a_fn_may_nest_savepoints_of_its_own(app: ss.App, db_url: str, table: str) -> None:
    insert = inserter(db_url)

    def nested(conn: Any) -> str:
        with conn.transaction():
            insert(conn, "kept")
        try:
            with conn.transaction():
                insert(conn, "dropped", 1)
                raise ValueError("undo this part only")
        except ValueError:
            pass
        return "ok"

    @app.function(id="sub", trigger=ss.on_event("go"), backoff=FAST)
    def sub(ctx: ss.Context) -> str:
        return str(ctx.step.transaction("create-record", nested))

    app.start()
    run = send_and_wait(app, ss.Event("go"))
    assert run.status == "completed" and run.steps[0].attempts == 1, run.error
    assert rows(db_url) == [("kept", 0)]


def test_a_fn_may_not_end_the_engines_transaction(app: ss.App, db_url: str, table: str) -> None:
    insert = inserter(db_url)

    def commits(conn: Any) -> None:
        insert(conn, "u1")
        conn.commit()

    @app.function(id="sub", trigger=ss.on_event("go"), backoff=FAST)
    def sub(ctx: ss.Context) -> None:
        ctx.step.transaction("create-record", commits)

    app.start()
    run = send_and_wait(app, ss.Event("go"))
    assert run.status == "failed" and run.error is not None
    assert "must not call commit()" in run.error.message
    assert run.steps[0].attempts == 1  # refused for good: NonRetriableError
    assert rows(db_url) == []


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_commit_whose_answer_was_lost_writes_the_row_once(
    app: ss.App, db_url: str, table: str, when: faults.When
) -> None:
    """``after``: the transaction committed but the worker saw the connection
    die; the journal retries the commit, which finds its memo and runs nothing."""
    insert = inserter(db_url)
    calls: Counter[str] = Counter()

    def record(conn: Any) -> str:
        calls["fn"] += 1
        return insert(conn, "u1")

    @app.function(id="sub", trigger=ss.on_event("go"), backoff=FAST)
    def sub(ctx: ss.Context) -> str:
        return str(ctx.step.transaction("create-record", record))

    with faults.inject("journal(checkpoint+transaction)", when) as plan:
        app.start()
        run = send_and_wait(app, ss.Event("go"))
    assert plan.fired
    assert run.status == "completed", run.error
    assert rows(db_url) == [("u1", 0)]
    assert calls["fn"] == 1  # "before": failed before fn ran; "after": the retry found the memo


def test_cancelling_a_run_whose_transaction_step_is_retrying(app: ss.App, db_url: str, table: str) -> None:
    insert = inserter(db_url)
    calls: Counter[str] = Counter()

    def broken(conn: Any) -> None:
        calls["fn"] += 1
        insert(conn, "u1")
        raise RuntimeError("not yet")

    @app.function(id="sub", trigger=ss.on_event("go"), backoff=ss.Backoff(initial="1h", jitter=0))
    def sub(ctx: ss.Context) -> None:
        ctx.step.transaction("create-record", broken)

    app.start()
    [event_id] = app.send(ss.Event("go"))
    run = run_of(app, event_id)
    wait_for(lambda: [s.status for s in app.runs.get(run.id).steps] == ["retrying"], 10, "a failed attempt")
    app.runs.cancel(run.id)
    ended = app.runs.wait(run.id, timeout="10s")
    assert ended.status == "cancelled"
    assert calls["fn"] == 1 and rows(db_url) == []


def test_a_cancel_the_transaction_commit_reports_stops_the_run_before_its_next_step(
    make_app: Callable[..., ss.App], db_url: str, table: str
) -> None:
    """The cancel arrives after the step's work began (a middleware hook asks
    for it) and before its commit: the commit's fence reports it, as any
    checkpoint's does, and no further step runs."""
    insert = inserter(db_url)
    after: list[str] = []

    class CancelBeforeTheCommit(ss.Middleware):
        async def before_step(self, ctx: ss.Context, step_id: str) -> None:
            if step_id == "create-record":
                await app.runs.cancel_async(ctx.run_id)

    app = make_app(middleware=[CancelBeforeTheCommit()])

    @app.function(id="sub", trigger=ss.on_event("go"), backoff=FAST)
    def sub(ctx: ss.Context) -> None:
        ctx.step.transaction("create-record", insert, "u1")
        ctx.step.run("next", after.append, "ran")

    app.start()
    run = send_and_wait(app, ss.Event("go"))
    assert run.status == "cancelled"
    assert after == []
    assert rows(db_url) == [("u1", 0)]  # its commit was the step's: the row came with it
    assert [(s.id, s.status) for s in run.steps] == [("create-record", "completed")]


def test_rerun_from_the_transaction_step_writes_once_more_and_replay_after_it_never(
    app: ss.App, db_url: str, table: str
) -> None:
    """Re-running from the step (a new run) executes fn once more: one more row,
    as the operator asked. Replaying a failed run whose transaction step
    completed returns its memo: no new row."""
    insert = inserter(db_url)
    calls: Counter[str] = Counter()
    broken = threading.Event()
    broken.set()

    def record(conn: Any, user_id: str) -> str:
        calls["fn"] += 1
        return insert(conn, user_id, calls["fn"])

    def notify() -> str:
        if broken.is_set():
            raise ss.NonRetriableError("mail server down")
        return "sent"

    @app.function(id="sub", trigger=ss.on_event("go"), backoff=FAST)
    def sub(ctx: ss.Context) -> str:
        ctx.step.transaction("create-record", record, "u1")
        return str(ctx.step.run("notify", notify))

    app.start()
    run = send_and_wait(app, ss.Event("go"))
    assert run.status == "failed"
    broken.clear()
    app.runs.replay(run.id)
    assert app.runs.wait(run.id, timeout="10s").status == "completed"
    assert calls["fn"] == 1 and rows(db_url) == [("u1", 1)]

    forked = app.runs.rerun_from(run.id, "create-record")
    assert app.runs.wait(forked, timeout="10s").status == "completed"
    assert calls["fn"] == 2 and rows(db_url) == [("u1", 1), ("u1", 2)]


def test_a_memo_recorded_by_run_is_not_returned_to_a_transaction(
    app: ss.App, db_url: str, table: str
) -> None:
    """A deploy that turns ``step.run`` into ``step.transaction`` under the same
    id meets a memo of another kind: the run fails with NondeterminismError."""
    insert = inserter(db_url)
    deployed = {"transaction": False}

    def record(conn: Any = None) -> str:
        return "x" if conn is None else insert(conn, "u1")

    @app.function(id="sub", trigger=ss.on_event("go"), backoff=FAST)
    def sub(ctx: ss.Context) -> None:
        if deployed["transaction"]:
            ctx.step.transaction("create-record", record)
        else:
            ctx.step.run("create-record", record)
        ctx.step.sleep("nap", "200ms")

    app.start()
    [event_id] = app.send(ss.Event("go"))
    run = run_of(app, event_id)
    wait_for(lambda: app.runs.get(run.id).status == "sleeping", 10, "the first deploy's step")
    deployed["transaction"] = True
    ended = app.runs.wait(run.id, timeout="10s")
    assert ended.status == "failed" and ended.error is not None
    assert ended.error.type == "NondeterminismError"
    assert rows(db_url) == []


# -- the store side: group commit and the fence ----------------------------------------------


def _attempt(db_url: str, run_id: str, fail: bool, swallow: bool = False) -> TransactionCommit:
    """One ``step.transaction`` attempt of ``run_id``, as its journal commits it
    (``swallow``: its function catches the error of a failed statement)."""
    insert = inserter(db_url)

    def fn(conn: Any) -> Any:
        insert(conn, run_id)
        if fail:
            raise RuntimeError(f"{run_id} broke")
        if swallow:
            try:
                conn.execute("SELECT * FROM no_such_table")
            except Exception:  # noqa: BLE001 - what the test is about
                pass
            return None
        if isinstance(conn.driver_connection, sqlite3.Connection):
            return None
        return conn.execute("SELECT txid_current()").fetchone()["txid_current"]

    row = StepRow(
        run_id=run_id,
        step_id="t",
        position=0,
        kind=StepKind.TRANSACTION,
        status=StepStatus.COMPLETED,
        attempts=1,
        started_at=NOW,
    )
    return TransactionCommit(fn=fn, args=(), row=row, clock=VirtualClock(NOW), hooks=NO_HOOKS, ctx=None)


def _fenced(fence: Fence, then: Callable[[Tx], Any]) -> Callable[[Tx], Any]:
    """The journal's commit: the fence (and checkpoint), then the step's own write."""

    def op(tx: Tx) -> Any:
        tx.checkpoint(fence, [], [])
        return then(tx)

    op.user_sql = True  # type: ignore[attr-defined]
    return op


def _after(tx: Tx) -> Any:
    """A last operation in the batch: the transaction id and statement timeout it sees."""
    if isinstance(getattr(tx, "conn", None), sqlite3.Connection):
        return None, None
    row = tx.conn.execute(  # type: ignore[attr-defined]
        "SELECT txid_current() AS tx, current_setting('statement_timeout') AS timeout"
    ).fetchone()
    return row["tx"], row["timeout"]


async def _one_batch(store: Store, ops: list[Callable[[Tx], Any]]) -> list[Any]:
    """``ops`` committed in one group-commit transaction (``tests/batches.py``)."""
    futures = await submitted_together(store, ops)
    return list(await asyncio.gather(*futures, return_exceptions=True))


def test_in_a_group_commit_a_failing_fn_rolls_back_only_its_own_writes(
    one_writer: Store, db_url: str, table: str
) -> None:
    """Four runs' commits share one transaction: r0's transaction step fails,
    r1's plain checkpoint and r2's transaction step commit; r3's function
    swallows a failed statement (on PostgreSQL that aborts the transaction: its
    savepoint is rolled back and the attempt fails, alone)."""
    store = one_writer
    add_runs(store, ["r0", "r1", "r2", "r3"])
    fences = {
        lr.run.id: Fence(run_id=lr.run.id, owner="w", epoch=lr.epoch)
        for lr in store.transact_sync(lambda tx: lease(tx, "w", 4, NOW, NOW + 3600))
    }
    before = store.commits  # type: ignore[attr-defined]
    failed, checkpointed, committed, swallowed, (after_tx, timeout) = asyncio.run(
        _one_batch(
            store,
            [
                _fenced(fences["r0"], _attempt(db_url, "r0", fail=True)),
                lambda tx: tx.checkpoint(fences["r1"], [step("r1", "charge")], []),
                _fenced(fences["r2"], _attempt(db_url, "r2", fail=False)),
                _fenced(fences["r3"], _attempt(db_url, "r3", fail=False, swallow=True)),
                _after,
            ],
        )
    )
    assert isinstance(failed, RuntimeError) and str(failed) == "r0 broke"
    assert callable(checkpointed)
    assert isinstance(committed, StepRow) and committed.run_id == "r2"
    memos = store.read_sync(lambda tx: {r: [s.step_id for s in tx.get_steps(r)] for r in fences})
    if db_url.startswith("sqlite:"):  # a failed statement does not abort SQLite's transaction
        assert isinstance(swallowed, StepRow)
        assert sorted(r[0] for r in rows(db_url)) == ["r2", "r3"]
        assert memos == {"r0": [], "r1": ["charge"], "r2": ["t"], "r3": ["t"]}
    else:
        assert type(swallowed).__name__ == "InFailedSqlTransaction"
        assert [r[0] for r in rows(db_url)] == ["r2"]
        assert memos == {"r0": [], "r1": ["charge"], "r2": ["t"], "r3": []}
    if db_url.startswith("sqlite:"):
        assert store.commits - before == 1  # type: ignore[attr-defined]  # one transaction for the four
    else:
        assert int(committed.output or "0") == int(after_tx)  # r2's fn ran in the batch's transaction
        assert timeout == "0"  # the bound on user SQL did not outlive its savepoint


def test_a_fenced_out_transaction_step_runs_nothing_and_writes_nothing(
    one_writer: Store, db_url: str, table: str
) -> None:
    """A worker whose lease moved on: the fence refuses the commit before fn runs."""
    store = one_writer
    add_runs(store, ["r0"])
    [old] = store.transact_sync(lambda tx: lease(tx, "w1", 1, NOW, NOW + 1))
    store.transact_sync(lambda tx: lease(tx, "w2", 1, NOW + 2, NOW + 3600))  # the lease lapsed: w2 took it
    attempt = _attempt(db_url, "r0", fail=False)
    stale = Fence(run_id="r0", owner="w1", epoch=old.epoch)
    with pytest.raises(LeaseLostError):
        store.transact_sync(_fenced(stale, attempt))
    assert rows(db_url) == []
    assert store.read_sync(lambda tx: tx.get_steps("r0")) == []


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_an_operation_that_leaves_the_transaction_aborted_fails_alone(one_writer: Store) -> None:
    """An operation that returns normally although a statement of its failed
    (PostgreSQL aborts the transaction): its savepoint's release fails, so it
    gets that error, once; the others keep their own outcomes, and the writer
    goes on (found while testing user SQL that swallows an error)."""

    def spoils(tx: Tx) -> str:
        try:
            tx.conn.execute("SELECT * FROM no_such_table")  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001 - what the test is about
            pass
        return "returned"

    def fine(tx: Tx) -> int:
        return int(tx.conn.execute("SELECT 1 AS x").fetchone()["x"])  # type: ignore[attr-defined]

    async def batch() -> list[Any]:
        return await asyncio.wait_for(_one_batch(one_writer, [fine, spoils, fine]), 10)

    first, spoiled, last = asyncio.run(batch())
    assert (first, last) == (1, 1)
    assert isinstance(spoiled, ss.StoreError) and "aborted" in str(spoiled)
    assert one_writer.transact_sync(fine) == 1  # the writer is still there
