"""Payloads as large as the limits admit commit, in every way a write commits.

A store operation reaches the database in one of three ways: alone (on
PostgreSQL: pipelined, see ``store/pgpipeline.py``), batched with other runs'
operations by group commit, or batched next to an operation that fails and is
rolled back to its savepoint. The largest statements the limits allow (a 4 MB
step output committed together with a 4 MB function output, a 512 KB event, the
largest stored error) must commit in each, on both stores, within a deadline:
a hung writer fails the test instead of hanging the suite. On PostgreSQL the
writer's socket has a small send buffer, as over a real network link (on
loopback the kernel buffers absorb most of 8 MB and hide the hang).

The hang this guards against: psycopg's ``Pipeline.sync()`` could start waiting
for results while the tail of a large statement still sat unsent in libpq's
output buffer; the server waited for the rest of the statement (``ClientRead``)
and the writer thread for its results, for ever.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import stepstone as ss
from stepstone import limits, serde
from stepstone.errors import ErrorInfo, LeaseLostError
from stepstone.store import make_store
from stepstone.store.base import Store, Tx
from stepstone.store.rows import Fence, NewEvent, RunEnd, RunStatus, SpanRow, StepKind, StepRow, StepStatus
from tests.batches import submitted_together
from tests.integration.test_store_contract import NOW, add_runs, lease

DEADLINE = 30.0  # seconds for one commit (or one batch) of the largest payloads
GROUP = 3  # operations committed together


def json_text(size: int, fill: str = "x") -> str:
    """A JSON string value whose encoding is exactly ``size`` bytes."""
    text = serde.dumps(fill * (size - 2), what="payload", limit=size)
    assert len(text.encode()) == size
    return text


def largest_error() -> str:
    """The largest error a store is asked to keep (clipped by ``ErrorInfo``)."""
    huge = "e" * (2 * limits.MAX_ERROR_TEXT_BYTES)
    return serde.dumps(ErrorInfo("ValueError", huge, huge).to_json(), what="error")


# -- one run's final write, per payload kind ------------------------------------------------
def outputs(fence: Fence) -> Callable[[Tx], Any]:
    """A 4 MB last step committed together with a 4 MB function output."""
    payload = json_text(limits.MAX_STEP_OUTPUT_BYTES)

    def op(tx: Tx) -> Any:
        step = StepRow(
            run_id=fence.run_id,
            step_id="last",
            position=0,
            kind=StepKind.RUN,
            status=StepStatus.COMPLETED,
            attempts=1,
            output=payload,
            error=None,
            wake_at=None,
            started_at=NOW,
            ended_at=NOW,
        )
        cancel = tx.checkpoint(fence, [step], [])
        assert tx.finish_run(
            RunEnd(
                fence=fence,
                run_id=fence.run_id,
                status=RunStatus.COMPLETED,
                output=payload,
                now=NOW + 1,
            )
        )
        return cancel

    return op


def event(fence: Fence) -> Callable[[Tx], Any]:
    """An event of the largest size admitted, sent by the run's last step."""
    data = serde.dumps(
        {"blob": "x" * (limits.MAX_EVENT_BYTES - 11)}, what="event", limit=limits.MAX_EVENT_BYTES
    )
    assert len(data.encode()) == limits.MAX_EVENT_BYTES

    def op(tx: Tx) -> Any:
        cancel = tx.checkpoint(fence, [], [])
        tx.insert_event(NewEvent(id=f"big-{fence.run_id}", name="big", data=data, ts=1, received_at=NOW))
        assert tx.finish_run(
            RunEnd(
                fence=fence,
                run_id=fence.run_id,
                status=RunStatus.COMPLETED,
                output="null",
                now=NOW + 1,
            )
        )
        return cancel

    return op


def error(fence: Fence) -> Callable[[Tx], Any]:
    """The largest error, stored as a step memo, a span and the run's error."""
    err = largest_error()

    def op(tx: Tx) -> Any:
        step = StepRow(
            run_id=fence.run_id,
            step_id="last",
            position=0,
            kind=StepKind.RUN,
            status=StepStatus.FAILED,
            attempts=2,
            output=None,
            error=err,
            wake_at=None,
            started_at=NOW,
            ended_at=NOW,
        )
        span = SpanRow(
            run_id=fence.run_id,
            kind="step",
            name="last",
            started_at=NOW,
            ended_at=NOW,
            status="retrying",
            attempt=0,
            error=err,
        )
        cancel = tx.checkpoint(fence, [step], [span])
        assert tx.finish_run(
            RunEnd(fence=fence, run_id=fence.run_id, status=RunStatus.FAILED, error=err, now=NOW + 1)
        )
        return cancel

    return op


PAYLOADS: dict[str, Callable[[Fence], Callable[[Tx], Any]]] = {
    "outputs": outputs,
    "event": event,
    "error": error,
}


def failing(fence: Fence) -> Callable[[Tx], Any]:
    """A 4 MB write, then the operation fails: only it is rolled back."""
    payload = json_text(limits.MAX_STEP_OUTPUT_BYTES)

    def op(tx: Tx) -> Any:
        step = StepRow(
            run_id=fence.run_id,
            step_id="doomed",
            position=0,
            kind=StepKind.RUN,
            status=StepStatus.COMPLETED,
            attempts=1,
            output=payload,
            error=None,
            wake_at=None,
            started_at=NOW,
            ended_at=NOW,
        )
        tx.checkpoint(fence, [step], [])
        raise LeaseLostError("this operation fails after its large write")

    return op


# -- committing, in each mode ---------------------------------------------------------------
def narrow_pipe_store(url: str) -> Store:
    """A PostgreSQL store whose writer sockets have a 64 KB send buffer, as on a
    network link where unacknowledged data fills the buffer: one write sends at
    most that much, so a 4 MB statement needs many."""
    from stepstone.store.postgres import PostgresStore

    class NarrowPipe(PostgresStore):
        def _connect(self) -> Any:
            conn = super()._connect()
            with socket.socket(fileno=os.dup(conn.pgconn.socket)) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
                assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) <= 256 * 1024
            return conn

    return NarrowPipe.from_url(url)


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    """On PostgreSQL: one writer, so that the test decides what is batched, over
    a narrow pipe."""
    opened = make_store(db_url) if db_url.startswith("sqlite") else narrow_pipe_store(f"{db_url}?writers=1")
    opened.migrate()
    yield opened
    opened.close()


def leased(store: Store, count: int) -> list[Fence]:
    ids = [f"r{i}" for i in range(count)]
    add_runs(store, ids)
    runs = store.transact_sync(lambda tx: lease(tx, "w", count, NOW, NOW + 3600))
    assert [lr.run.id for lr in runs] == ids
    return [Fence(run_id=lr.run.id, owner="w", epoch=lr.epoch) for lr in runs]


def tracked(op: Callable[[Tx], Any], seen: list[Tx]) -> Callable[[Tx], Any]:
    def run(tx: Tx) -> Any:
        seen.append(tx)
        return op(tx)

    return run


async def within(awaitable: Any) -> Any:
    """``awaitable``'s result; a commit still pending at the deadline fails the test."""
    try:
        return await asyncio.wait_for(awaitable, DEADLINE)
    except TimeoutError:
        raise AssertionError(f"a commit still pending after {DEADLINE}s: a hung writer") from None


async def commit_alone(store: Store, ops: list[Callable[[Tx], Any]]) -> list[Any]:
    results = []
    for op in ops:
        seen: list[Tx] = []
        results.append(await within(store.transact(tracked(op, seen))))
    return results


async def commit_together(store: Store, ops: list[Callable[[Tx], Any]]) -> list[Any]:
    """``ops`` in one group commit; asserts they shared one transaction."""
    seen: list[Tx] = []
    futures = await submitted_together(store, [tracked(op, seen) for op in ops], DEADLINE)
    results: list[Any] = await within(asyncio.gather(*futures, return_exceptions=True))
    # The last attempt's: on PostgreSQL a batch in which an operation fails is
    # rolled back whole and runs again with a savepoint per operation.
    last = seen[-len(ops) :]
    assert len(last) == len(ops) and len({id(tx) for tx in last}) == 1, "not one group commit"
    return results


def commit(
    store: Store, mode: str, fences: list[Fence], make: Callable[[Fence], Callable[[Tx], Any]]
) -> None:
    ops = [make(fence) for fence in fences]
    if mode == "alone":
        results = asyncio.run(commit_alone(store, ops))
    elif mode == "group":
        results = asyncio.run(commit_together(store, ops))
    else:  # "savepoint": a failing operation in the middle of the group
        doomed = Fence(run_id="doomed", owner="w", epoch=1)
        ops.insert(1, failing(doomed))
        results = asyncio.run(commit_together(store, ops))
        assert isinstance(results.pop(1), LeaseLostError)
    for result in results:
        assert not isinstance(result, BaseException), result
        assert result() is False  # the checkpoint's cancel flag: not cancelled


def stored(store: Store, run_id: str) -> tuple[str, str | None, str | None]:
    run = store.read_sync(lambda tx: tx.get_run(run_id))
    assert run is not None
    return run.status, run.output, run.error


# -- the class: every payload the limits admit commits in every mode ------------------------------
@pytest.mark.parametrize("mode", ["alone", "group", "savepoint"])
@pytest.mark.parametrize("payload", sorted(PAYLOADS))
def test_the_largest_payloads_commit_in_every_commit_mode(store: Store, payload: str, mode: str) -> None:
    fences = leased(store, 1 if mode == "alone" else GROUP)
    commit(store, mode, fences, PAYLOADS[payload])
    for fence in fences:
        status, output, err = stored(store, fence.run_id)
        if payload == "outputs":
            assert (status, len(output or "")) == (RunStatus.COMPLETED, limits.MAX_STEP_OUTPUT_BYTES)
            [memo] = store.read_sync(lambda tx: tx.get_steps(fence.run_id))
            assert len(memo.output or "") == limits.MAX_STEP_OUTPUT_BYTES
        elif payload == "error":
            assert (status, err) == (RunStatus.FAILED, largest_error())
        else:
            assert status == RunStatus.COMPLETED
    if mode == "savepoint":  # the failed operation's large write was rolled back alone
        assert store.read_sync(lambda tx: tx.get_steps("doomed")) == []


# -- the instance: a lone pipelined checkpoint of the largest statements, many times ----------------
@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_lone_pipelined_checkpoints_of_the_largest_statements_never_hang(store: Store) -> None:
    """A 4 MB last step and a 4 MB function output in one pipelined checkpoint,
    several times, over a narrow pipe; before the fix the writer hung at the
    first one."""
    fences = leased(store, 4)
    for fence in fences:
        commit(store, "alone", [fence], outputs)
    assert {stored(store, f.run_id)[0] for f in fences} == {RunStatus.COMPLETED}


def test_runs_with_4mb_outputs_complete_together(make_app: Callable[..., ss.App]) -> None:
    """End to end: several runs at once, each committing a 4 MB function output
    together with its 4 MB last step (group commit batches them under load)."""
    app = make_app()
    big = "x" * (limits.MAX_STEP_OUTPUT_BYTES - 2)

    @app.function(id="big", trigger=ss.on_event("go"))
    def big_output(ctx: ss.Context) -> str:
        return str(ctx.step.run("last", lambda: big))

    app.start()
    ids = app.send([ss.Event("go", {}) for _ in range(GROUP)])
    runs = [app.runs.list(event_id=event_id)[0] for event_id in ids]
    for run in runs:
        done = app.runs.wait(run.id, timeout="60s")
        assert done.status == "completed" and done.output == big
        assert done.steps[0].output == big
