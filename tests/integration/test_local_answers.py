"""Reads a process answers from what it knows (issue 18, target 4), with
exactly what a read would return, on SQLite and PostgreSQL.

``runs.wait`` for a run this process's own worker holds: the worker tells the
waiter of the run's end with the run as the end left it, so the waiter reads
nothing: for a run that completed, failed or was cancelled while held. A run
watched as its invocation began whose whole history is that invocation's
``step.run`` memos is built from them and the row it was leased with (session
11); any other is read back by the end's own transaction (``RunsTx.ended_run_later``: on PostgreSQL sent
with the end and read after its ``COMMIT``, no round trip of its own). A run that
parks instead is read as before (the wake-up carries nothing), and so is a
run no local worker holds.

``runs.list(event_id=)`` right after a send that started every run of its one
new event on a local worker: those runs as the send's take returned them,
while none of their invocations has begun; otherwise (begun, a run left
queued, an event seen before) it reads.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import stepstone as ss
from stepstone import runs
from stepstone.direct import unstarted
from stepstone.errors import NonRetriableError
from stepstone.runs import _list_op
from stepstone.store.rows import RunFilter, RunRead
from stepstone.store.sqltx import SqlTx
from tests.conftest import add_effect_once, run_of
from tests.polling import wait_for


def _reads_of(app: ss.App, kind: str) -> Iterator[list[str]]:
    """The reads of ``kind`` (``_ended_op``: ``runs.wait``'s poll; ``_list_op``:
    ``runs.list``) made through the app's store."""
    seen: list[str] = []
    store: Any = app.store
    read, read_sync = store.read, store.read_sync

    def noted(op: Callable[..., Any]) -> None:
        if kind in getattr(op, "__qualname__", ""):
            seen.append(op.__qualname__)

    async def counted(op: Callable[..., Any]) -> Any:
        noted(op)
        return await read(op)

    def counted_sync(op: Callable[..., Any]) -> Any:
        noted(op)
        return read_sync(op)

    store.read, store.read_sync = counted, counted_sync
    yield seen
    del store.read, store.read_sync


@pytest.fixture
def waits_read(app: ss.App, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    # No poll within a test's time-outs (a loaded host may take 100 ms, the
    # default, to end a run): a read then comes only from what is asserted.
    monkeypatch.setattr(runs, "LOCAL_POLL", 60.0)
    yield from _reads_of(app, "_ended_op")


@pytest.fixture
def lists_read(app: ss.App) -> Iterator[list[str]]:
    yield from _reads_of(app, "_list_op")


def _gated(app: ss.App, ending: str) -> tuple[threading.Event, threading.Event]:
    """A function ``gated`` whose second step waits for ``gate`` (``entered``
    says it got there), then ends as ``ending`` says."""
    entered, gate = threading.Event(), threading.Event()

    def hold() -> int:
        entered.set()
        assert gate.wait(10)
        return 2

    @app.function(id="gated", trigger=ss.on_event("go"), retries=0)
    async def gated(ctx: ss.Context) -> dict[str, int]:
        await ctx.step.run("a", lambda: 1)
        await ctx.step.run("b", hold)
        if ending == "failed":
            raise NonRetriableError("no")
        if ending == "parked":
            await ctx.step.sleep("nap", "10ms")
        await ctx.step.run("c", lambda: 3)
        return {"x": 3}

    return entered, gate


def _wait_while_held(app: ss.App, ending: str) -> tuple[ss.Run, ss.Run]:
    """``runs.wait`` called while the local worker holds the run; what it
    returned and what a read returns afterwards."""
    entered, gate = _gated(app, ending)
    app.start(concurrency=1)
    [event_id] = app.send(ss.Event("go"))
    run_id = run_of(app, event_id).id
    assert entered.wait(10)
    waited: list[ss.Run] = []
    waiter = threading.Thread(target=lambda: waited.append(app.runs.wait(run_id, timeout="10s")))
    waiter.start()
    wait_for(lambda: run_id in app._watchers, 10, "the waiter watching")
    if ending == "cancelled":
        assert app.runs.cancel(run_id) == "running"  # flagged: the worker ends it at its next step
    gate.set()
    waiter.join(10)
    [run] = waited
    return run, app.runs.get(run_id)


@pytest.fixture
def read_back(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The runs whose end's transaction read them back for a waiter."""
    seen: list[str] = []
    later = SqlTx.ended_run_later

    def counted(tx: SqlTx, run_id: str) -> Any:
        seen.append(run_id)
        return later(tx, run_id)

    monkeypatch.setattr(SqlTx, "ended_run_later", counted)
    return seen


@pytest.mark.parametrize("ending", ["completed", "failed", "cancelled"])
def test_a_wait_for_a_run_its_local_worker_ends_reads_nothing(
    app: ss.App, waits_read: list[str], read_back: list[str], ending: str
) -> None:
    """A waiter that came once the invocation had begun: the end's own
    transaction reads the run back for it."""
    run, read = _wait_while_held(app, ending)
    assert run.status == ending
    assert run == read  # every field: output, error, steps, times
    assert waits_read == [] and read_back == [run.id]
    if ending == "completed":
        assert run.output == {"x": 3} and [s.id for s in run.steps] == ["a", "b", "c"]


def _varied(app: ss.App, ending: str) -> None:
    """``varied``: its steps' outputs of many JSON shapes, a repeated id, a
    step that failed for good (its error caught), then it ends as ``ending`` says."""

    def refuse() -> None:
        raise NonRetriableError("no, ü")

    @app.function(id="varied", trigger=ss.on_event("go"), retries=0)
    async def varied(ctx: ss.Context) -> Any:
        values = [await ctx.step.run("v", lambda v=v: v) for v in (0.1 + 0.2, {"é": [None, -1e300]}, "")]
        try:
            await ctx.step.run("refused", refuse)
        except ss.StepError:
            pass
        if ending == "failed":
            raise NonRetriableError("the run, ✓")
        return {"values": values, "big": 2**62}


def _told_from_its_start(app: ss.App) -> tuple[str, RunRead]:
    """Send ``go`` to an app without a worker, watch the run, then start the
    worker (a lease pass takes it: watched as its invocation begins); the run
    as its end told it."""
    told: list[RunRead | None] = []
    [event_id] = app.send(ss.Event("go"))
    run_id = run_of(app, event_id).id
    app._watch(run_id, told.append)
    app.start(concurrency=1)
    app.runs.wait(run_id, timeout="10s")
    [ended] = [t for t in told if t is not None]
    return run_id, ended


def _told_after_a_direct_start(app: ss.App) -> tuple[str, RunRead]:
    """Send ``go`` to a started app (the send starts the run here), then list
    and wait on the loop as a sequential caller does: watched before the
    invocation's first turn (the same turn as the send); the run as its end
    told it."""
    told: list[RunRead | None] = []

    async def scenario() -> str:
        await app.start_async(concurrency=1)
        [event_id] = await app.send_async(ss.Event("go"))
        [run] = await app.runs.list_async(event_id=event_id)
        app._watch(run.id, told.append)
        await app.runs.wait_async(run.id, timeout="10s")
        await app.stop_async()
        return run.id

    run_id = asyncio.run(scenario())
    [ended] = [t for t in told if t is not None]
    return run_id, ended


@pytest.mark.parametrize("start", ["direct", "queued"])
@pytest.mark.parametrize("ending", ["completed", "failed"])
def test_a_run_told_from_what_its_end_wrote_equals_a_read(
    app: ss.App, read_back: list[str], start: str, ending: str
) -> None:
    """A run watched as its invocation begins, whose whole history is that
    invocation's ``step.run`` memos, ends without reading itself back
    (``RunJournal.written``, ``RunRow.ended``): what its end tells the waiter
    is built from the memos and the row the run was leased with, and equals
    a read field for field (times, outputs, errors, order), whether a send
    started it here or a lease pass took it."""
    _varied(app, ending)
    run_id, ended = _told_from_its_start(app) if start == "queued" else _told_after_a_direct_start(app)
    run = runs._seen(ended, run_id)
    assert run == app.runs.get(run_id)
    assert isinstance(run, ss.Run) and run.status == ending
    assert [s.id for s in run.steps] == ["v", "v:1", "v:2", "refused"] and read_back == []


def test_a_run_with_steps_from_an_earlier_invocation_is_read_back_by_its_end(
    app: ss.App, read_back: list[str]
) -> None:
    """A run resumed after a retry's back-off: its earlier memos are not the
    invocation's, and its end reads the run back for the waiter."""
    failures: list[int] = []

    def flaky() -> int:
        if not failures:
            failures.append(1)
            raise RuntimeError("once")
        return 2

    @app.function(id="flaky", trigger=ss.on_event("go"), retries=1, backoff=ss.Backoff(initial=0.01))
    async def retried(ctx: ss.Context) -> int:
        done: int = await ctx.step.run("a", lambda: 1) + await ctx.step.run("b", flaky)
        return done

    run_id, ended = _told_from_its_start(app)
    assert runs._seen(ended, run_id) == app.runs.get(run_id)
    assert app.runs.get(run_id).steps[1].attempts == 2 and read_back == [run_id]


def test_a_run_with_another_kind_of_step_is_read_back_by_its_end(app: ss.App, read_back: list[str]) -> None:
    """An event sent from a step (its memo written with an effect) makes the
    end read the run back: only ``step.run`` memos are the journal's alone."""

    @app.function(id="sends", trigger=ss.on_event("go"))
    async def sends(ctx: ss.Context) -> int:
        await ctx.step.run("a", lambda: 1)
        await ctx.step.send_event("tell", ss.Event("told"))
        return 1

    run_id, ended = _told_from_its_start(app)
    assert runs._seen(ended, run_id) == app.runs.get(run_id)
    assert [s.kind for s in app.runs.get(run_id).steps] == ["run", "send"] and read_back == [run_id]


def test_a_wait_for_a_run_that_parks_reads_it_after_the_invocation(
    app: ss.App, waits_read: list[str]
) -> None:
    """The parked invocation tells nothing of an end: the waiter reads (and
    the next invocation, ending it, may tell it)."""
    run, read = _wait_while_held(app, "parked")
    assert run.status == "completed" and run == read
    assert waits_read != []


def _one_step(app: ss.App) -> None:
    @app.function(id="one", trigger=ss.on_event("go"))
    async def one(ctx: ss.Context) -> int:
        done: int = await ctx.step.run("a", lambda: 1)
        return done


def test_a_wait_for_a_run_that_ended_before_reads_it(app: ss.App, waits_read: list[str]) -> None:
    _one_step(app)
    app.start(concurrency=1)
    [event_id] = app.send(ss.Event("go"))
    run_id = run_of(app, event_id).id
    wait_for(lambda: app.runs.get(run_id).status == "completed", 10, "the run's end")
    assert app.runs.wait(run_id, timeout="5s") == app.runs.get(run_id)
    assert len(waits_read) == 1


def test_a_wait_for_a_run_no_local_worker_holds_reads_until_it_ends(
    make_app: Callable[..., ss.App],
) -> None:
    """Another app (a worker elsewhere) ends it: this app's waiter polls."""
    sender, worker = make_app("sender"), make_app("worker")
    _one_step(worker)
    worker.start(concurrency=1)
    [event_id] = sender.send(ss.Event("go"))
    run = sender.runs.wait(run_of(sender, event_id).id, timeout="10s")
    assert run.status == "completed" and run == sender.runs.get(run.id)


def _blocked(app: ss.App, gate: threading.Event, **flow: Any) -> None:
    """``blocked``: its first step waits for ``gate``."""

    @app.function(id="blocked", trigger=ss.on_event("go"), **flow)
    async def blocked(ctx: ss.Context) -> int:
        done: int = await ctx.step.run("a", lambda: int(gate.wait(10)))
        return done


def _read_list(app: ss.App, event_id: str) -> list[ss.Run]:
    """``runs.list(event_id=)`` as the store reads it (blocking: on a loop, nothing else runs meanwhile)."""
    listed: list[ss.Run] = app.store.read_sync(_list_op(RunFilter(event_id=event_id)))
    return listed


def test_a_list_by_event_right_after_a_send_that_started_its_run_reads_nothing(
    app: ss.App, lists_read: list[str]
) -> None:
    gate = threading.Event()
    _blocked(app, gate)

    async def scenario() -> tuple[list[ss.Run], list[ss.Run]]:
        await app.start_async(concurrency=2)
        [event_id] = await app.send_async(ss.Event("go"))
        listed = await app.runs.list_async(event_id=event_id)
        read = _read_list(app, event_id)  # before the worker's turn: nothing written since
        gate.set()
        await app.runs.wait_async(listed[0].id, timeout="10s")
        await app.stop_async()
        return listed, read

    listed, read = asyncio.run(scenario())
    assert listed == read and [run.status for run in listed] == ["running"]
    assert lists_read == ["_list_op.<locals>.op"]  # the test's own read only


def test_a_list_by_event_once_the_run_began_reads_it(app: ss.App, lists_read: list[str]) -> None:
    gate = threading.Event()
    _blocked(app, gate)
    app.start(concurrency=2)
    [event_id] = app.send(ss.Event("go"))
    wait_for(lambda: not unstarted(app._local_workers[0], run_of(app, event_id).id), 10, "its start")
    lists_read.clear()
    [run] = app.runs.list(event_id=event_id)
    assert lists_read == ["_list_op.<locals>.op"] and run.status == "running"
    gate.set()
    assert app.runs.wait(run.id, timeout="10s").status == "completed"


@pytest.mark.parametrize("case", ["queued", "seen before", "no worker"])
def test_a_list_by_event_after_a_send_that_did_not_start_every_run_here_reads(
    app: ss.App, lists_read: list[str], case: str
) -> None:
    gate = threading.Event()
    if case == "queued":  # a concurrency key: never started directly
        _blocked(app, gate, concurrency=ss.Concurrency(limit=1, key="event.data.k"))
    else:
        _blocked(app, gate)
    if case != "no worker":
        app.start(concurrency=2)
    if case == "seen before":
        app.send(ss.Event("go", id="e1"))
    [event_id] = app.send(ss.Event("go", {"k": "x"}, id="e1"))
    lists_read.clear()
    [run] = app.runs.list(event_id=event_id)
    assert lists_read == ["_list_op.<locals>.op"]
    assert run.status in ("queued", "running")
    gate.set()


def test_a_list_by_event_after_the_sends_lease_lapsed_reads(make_app: Callable[..., ss.App]) -> None:
    """The runs a send started here are answered from memory only while
    nothing else may write them: their invocations not begun and their
    leases still known live. A worker loop held up right after the hand-over
    (a handler blocking it) past the lease: another process's worker takes
    the run and completes it; a list by the event then reads it completed.
    Before: the send's rows, ``running``, with the run long completed."""
    app, other = make_app("here"), make_app("there")
    executed = add_effect_once(app, other)

    app.start(lease_ttl=1)
    other.start()
    [worker] = app._local_workers
    adopted, listed = threading.Event(), threading.Event()
    adopt = worker._adopt

    def adopt_then_hold_up_the_loop(*args: Any) -> None:
        adopt(*args)
        adopted.set()
        wait_for(listed.is_set, 30, "the list by event")  # the loop blocked: the run's task not begun

    worker._adopt = adopt_then_hold_up_the_loop  # type: ignore[method-assign,assignment]
    try:
        [event_id] = app.send(ss.Event("once"))
        assert adopted.wait(10)
        run_id = run_of(other, event_id).id
        wait_for(lambda: other.runs.get(run_id).status == "completed", 20, "the other worker's run")
        [run] = app.runs.list(event_id=event_id)
    finally:
        listed.set()
    assert run.status == "completed" and run.id == run_id
    assert executed == [run_id]
