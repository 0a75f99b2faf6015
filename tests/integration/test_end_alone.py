"""A held run's end sent unread on PostgreSQL (``end_alone``, migration 0025):
most ends resolve nothing more than themselves (no parent's ``step.invoke``
waiting, no wait for ``function.finished``, no concurrency slot to hand on),
so where a function's last end read in this process was such an end, the
next one goes out with its ``COMMIT`` and the server checks the guess. A
wrong guess aborts the transaction (SQLSTATE SS002) and the end runs again
the way that reads what it resolves (``end_held_run``); the function's next
end is read first, until one reads alone again. Nothing is guessed on SQLite
(in-process, an end's read costs no round trip). Counted, not timed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import stepstone as ss
from stepstone.errors import LeaseLostError
from stepstone.registry import FINISHED_EVENT
from stepstone.store.base import Store, Tx
from stepstone.store.rows import (
    Fence,
    NewEvent,
    NewRun,
    QueueSpec,
    RunClosed,
    RunEnd,
    RunRow,
    RunStatus,
    WaitKind,
)
from tests.batches import checkpoint, group_commit
from tests.conftest import BACKENDS, send_and_wait

from .test_pg_notify import heard  # noqa: F401 - a fixture
from .test_statement_counts import _held, statements  # noqa: F401 - a fixture
from .test_store_contract import NOW, add_runs, lease, step, wait

SQL_ONLY = pytest.mark.parametrize("db_url", BACKENDS, indirect=True)
PG_ONLY = pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
PLAIN = RunClosed(invoked=False, waited=False)


def _end(store: Store, fence: Fence, function_id: str = "f") -> RunClosed | None:
    return store.transact_sync(lambda tx: tx.close_run(_run_end(fence, function_id), FINISHED_EVENT))


def _run_end(fence: Fence, function_id: str = "f") -> RunEnd:
    return RunEnd(
        fence=fence,
        run_id=fence.run_id,
        status=RunStatus.COMPLETED,
        output="1",
        now=NOW + 1,
        function_id=function_id,
    )


def _run(store: Store, run_id: str) -> RunRow | None:
    return store.read_sync(lambda tx: tx.get_run(run_id))


def _invoked_by_a_parent(store: Store, child: str) -> None:
    add_runs(store, [f"parent-of-{child}"], at=NOW + 1000)  # (not due: no lease takes it)
    parent = f"parent-of-{child}"
    store.transact_sync(lambda tx: tx.insert_wait(wait(parent, "call", kind=WaitKind.INVOKE, event_name="")))
    store.transact_sync(lambda tx: tx.set_wait_match(parent, "call", child))


@SQL_ONLY
def test_an_end_is_guessed_alone_while_its_functions_last_end_here_was(
    db_url: str,
    store: Store,
    statements: list[str],  # noqa: F811
) -> None:
    ends = []
    for run_id, invoked in [("a", False), ("b", True), ("c", False), ("d", False), ("e", True)]:
        fence = _held(store, run_id)
        if invoked:
            _invoked_by_a_parent(store, run_id)
        statements.clear()
        assert _end(store, fence) == RunClosed(invoked=invoked, waited=False)
        ends.append([name for name in statements if name.startswith("end_") or name == "run_end_probe"])
        run = _run(store, run_id)
        assert run is not None and run.status == RunStatus.COMPLETED and run.output == "1"
    if store.dialect == "postgres":
        assert ends == [
            ["end_alone"],  # nothing known: guessed alone
            ["end_alone", "end_held_run"],  # wrong: run again, read
            ["end_held_run"],  # f's last end resolved more: read (and it was alone)
            ["end_alone"],
            ["end_alone", "end_held_run"],
        ]
    else:
        assert ends == [["run_end_probe"]] * 5


@PG_ONLY
def test_an_end_guessed_alone_is_read_when_its_run_had_already_ended_or_held_a_slot(
    db_url: str,
    store: Store,
    statements: list[str],  # noqa: F811
) -> None:
    """The guess covers every answer the end's row gives: a run ended already
    (nothing to resolve, and ``None``) and a queue item holding a concurrency
    slot (its key's partitions are woken: ``wake_ckey``)."""
    fence = _held(store, "ended")
    with psycopg.connect(db_url, autocommit=True) as conn:  # its row ended, its queue item still held
        conn.execute("UPDATE runs SET status = 'failed', ended_at = %s WHERE id = 'ended'", (NOW,))
    statements.clear()
    assert _end(store, fence, "g") is None
    assert statements == ["end_alone", "end_held_run"]
    run = _run(store, "ended")
    assert run is not None and run.status == RunStatus.FAILED  # the first end stays

    def keyed(tx: Tx) -> None:
        seq = tx.insert_event(NewEvent(id="ev-k", name="go", data="{}", ts=7, received_at=NOW))
        spec = QueueSpec(partition_key="f:k", ckey1="k", limit1=1)
        tx.create_run(
            NewRun(
                id="k",
                function_id="f",
                event_seqs=[seq],
                event_ids=["ev-k"],
                available_at=NOW,
                created_at=NOW,
                spec=spec,
            )
        )

    store.transact_sync(keyed)
    [leased] = store.transact_sync(lambda tx: lease(tx, "w", 1, NOW, NOW + 60))
    statements.clear()
    assert _end(store, Fence(run_id="k", owner="w", epoch=leased.epoch), "h") == PLAIN
    assert statements == ["end_alone", "end_held_run", "wake_ckey"]


@PG_ONLY
def test_a_wrong_guess_in_a_group_commit_fails_no_other_operation(
    db_url: str, one_writer: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch whose guessed end was wrong runs again whole, pipelined, the
    end read (not with a savepoint per operation): every operation commits,
    the end reports its parent."""
    from stepstone.store import batching, pgpipeline

    store = one_writer
    plain, child = _held(store, "plain"), _held(store, "child")
    _invoked_by_a_parent(store, "child")
    fallbacks: list[int] = []
    run_batch = batching.run_batch

    def counted(*args: Any) -> Any:
        fallbacks.append(1)
        return run_batch(*args)

    monkeypatch.setattr(pgpipeline, "run_batch", counted)
    flag, closed = group_commit(
        store, [checkpoint(plain, "s"), lambda tx: tx.close_run(_run_end(child), FINISHED_EVENT)]
    )
    assert flag() is False
    assert closed == RunClosed(invoked=True, waited=False)
    assert [s.step_id for s in store.read_sync(lambda tx: tx.get_steps("plain"))] == ["s"]
    assert fallbacks == []


@PG_ONLY
def test_a_plain_end_notifies_no_one_and_one_that_frees_a_slot_does(
    db_url: str,
    make_app: Callable[..., ss.App],
    heard: Callable[[], list[str]],  # noqa: F811
) -> None:
    """No other process waits for a plain end (its worker's own slot re-leases
    itself): no ``NOTIFY``. An end freeing a concurrency slot wakes the other
    processes' workers waiting for the key (``wake_ckey``)."""
    app = make_app()

    @app.function(id="plain", trigger=ss.on_event("plain"))
    def plain(ctx: ss.Context) -> int:
        return int(ctx.step.run("a", lambda: 1))

    @app.function(
        id="keyed", trigger=ss.on_event("keyed"), concurrency=ss.Concurrency(limit=1, key="event.data.k")
    )
    def keyed(ctx: ss.Context) -> int:
        return int(ctx.step.run("a", lambda: 1))

    app.start(concurrency=2)
    assert send_and_wait(app, ss.Event("plain")).status == "completed"
    assert heard() == []
    assert send_and_wait(app, ss.Event("keyed", {"k": "x"})).status == "completed"
    assert "" in heard()


@SQL_ONLY
def test_a_checkpoint_of_several_memos_under_a_lapsed_lease_writes_nothing(db_url: str, store: Store) -> None:
    """``fence_or_raise`` (several memos, or spans) and ``fenced_step`` (one):
    the fence's locking read, and ``stepstone_fence`` only where it fails."""
    fence = _held(store, "r")
    [new] = store.transact_sync(lambda tx: lease(tx, "w2", 1, NOW + 61, NOW + 120))
    with pytest.raises(LeaseLostError):
        store.transact_sync(lambda tx: tx.checkpoint(fence, [step("r", "s1"), step("r", "s2")], []))
    with pytest.raises(LeaseLostError):
        store.transact_sync(lambda tx: tx.checkpoint(fence, [step("r", "s1")], []))
    assert store.read_sync(lambda tx: tx.get_steps("r")) == []
    held = Fence(run_id="r", owner="w2", epoch=new.epoch)
    flag = store.transact_sync(lambda tx: tx.checkpoint(held, [step("r", "s1"), step("r", "s2")], []))
    assert flag() is False
    assert [s.step_id for s in store.read_sync(lambda tx: tx.get_steps("r"))] == ["s1", "s2"]
