"""A commit that succeeded while its client saw an error (the connection died at
``COMMIT``) is retried: the retry must be a no-op, never a second effect
(issue 12, defect 9). Each test fails one named commit site "after" its
commit with ``stepstone.store.faults`` and checks that every effect happened
once, on both stores."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest

import stepstone as ss
from stepstone.store import faults
from stepstone.store.base import Store, Tx
from stepstone.store.rows import Fence, RunEnd, RunStatus, StepKind, StepRow, StepStatus, WaitKind, WaitRow
from tests.conftest import FAST, query
from tests.faultrun import Driver, virtual_app
from tests.integration.test_store_contract import NOW, add_runs, lease

INVOKE_SITE = "journal(checkpoint+invoke.start_child)"
WAIT_SITE = "journal(checkpoint+wait_for_event.insert_wait)"
SEND_SITE = "journal(checkpoint+send_event.ingest_sent)"
FINISH_SITE = "journal(checkpoint+_finish.final)"
PARK_SITE = "journal(checkpoint+_park_or_cancel.park)"


def count(db_url: str, sql: str) -> int:
    [(n,)] = query(db_url, sql)
    return int(n)


async def ended(app: ss.App, *run_ids: str) -> bool:
    runs = [await app.runs.get_async(r) for r in run_ids]
    return all(r.ended for r in runs)


def test_an_ambiguous_commit_carrying_an_invoke_starts_one_child(db_url: str) -> None:
    app = virtual_app(db_url)

    @app.function(id="child", retries=0)
    async def child(ctx: ss.Context) -> int:
        return int(ctx.event.data["n"]) * 2

    @app.function(id="parent", trigger=ss.on_event("go"), retries=0)
    async def parent(ctx: ss.Context) -> Any:
        # The invoke's memo and child are committed by the flush before "other".
        return await asyncio.gather(
            ctx.step.invoke("inv", function=child, data={"n": 21}), ctx.step.run("other", lambda: "x")
        )

    async def main() -> None:
        driver = Driver(app)
        with faults.inject(INVOKE_SITE, "after") as plan:
            [event_id] = await driver.send([ss.Event("go", {}, id="go-1")])
            [run] = await app.runs.list_async(event_id=event_id)
            await driver.settle(lambda: ended(app, run.id))
        assert plan.fired, plan.sites
        done = await app.runs.get_async(run.id)
        assert (done.status, done.output) == ("completed", [42, "x"])

    try:
        asyncio.run(main())
        assert count(db_url, "SELECT COUNT(*) FROM runs WHERE function_id = 'child'") == 1
        assert count(db_url, "SELECT COUNT(*) FROM events WHERE name = 'stepstone/function.invoked'") == 1
    finally:
        app.close()


def with_a_wait_beside_a_step(app: ss.App) -> None:
    """A function whose wait commits in a flush (a step runs beside it), not at a park."""

    @app.function(id="waiter", trigger=ss.on_event("go"), retries=0)
    async def waiter(ctx: ss.Context) -> Any:
        found, _ = await asyncio.gather(
            ctx.step.wait_for_event("w", event="answer", timeout="1h"), ctx.step.run("other", lambda: "x")
        )
        return found.data if found else None


def test_an_ambiguous_commit_carrying_a_wait_inserts_one_wait_row(db_url: str) -> None:
    app = virtual_app(db_url)

    with_a_wait_beside_a_step(app)

    async def main() -> None:
        driver = Driver(app)
        with faults.inject(WAIT_SITE, "after") as plan:
            [event_id] = await driver.send([ss.Event("go", {}, id="go-1")])
            [run] = await app.runs.list_async(event_id=event_id)
            await driver.drain()
        assert plan.fired, plan.sites
        assert count(db_url, f"SELECT COUNT(*) FROM waits WHERE run_id = '{run.id}'") == 1
        await driver.send([ss.Event("answer", {"v": 1}, id="answer-1")])
        await driver.settle(lambda: ended(app, run.id))
        done = await app.runs.get_async(run.id)
        assert (done.status, done.output) == ("completed", {"v": 1})

    try:
        asyncio.run(main())
        assert count(db_url, "SELECT COUNT(*) FROM waits") == 0
    finally:
        app.close()


def test_an_ambiguous_commit_of_send_event_ingests_each_event_once(db_url: str) -> None:
    app = virtual_app(db_url)
    received: list[Any] = []

    @app.function(id="pinged", trigger=ss.on_event("ping"), retries=0)
    async def pinged(ctx: ss.Context) -> None:
        received.append(ctx.event.data)

    @app.function(id="sender", trigger=ss.on_event("go"), retries=0)
    async def sender(ctx: ss.Context[ss.AsyncStep]) -> list[str]:
        return await ctx.step.send_event("s", [ss.Event("ping", {"n": 1}), ss.Event("ping", {"n": 2})])

    async def main() -> None:
        driver = Driver(app)
        with faults.inject(SEND_SITE, "after") as plan:
            [event_id] = await driver.send([ss.Event("go", {}, id="go-1")])
            [run] = await app.runs.list_async(event_id=event_id)
            await driver.settle(lambda: ended(app, run.id))
        assert plan.fired, plan.sites
        await driver.settle(lambda: asyncio.sleep(0, len(received) >= 2))

    try:
        asyncio.run(main())
        assert sorted(r["n"] for r in received) == [1, 2]
        assert count(db_url, "SELECT COUNT(*) FROM events WHERE name = 'ping'") == 2
        assert count(db_url, "SELECT COUNT(*) FROM runs WHERE function_id = 'pinged'") == 2
    finally:
        app.close()


class _Failures(ss.Middleware):
    def __init__(self) -> None:
        self.seen: list[str] = []

    def on_failure(self, ctx: ss.Context, error: ss.ErrorInfo) -> None:
        self.seen.append(ctx.run_id)


def test_an_ambiguous_commit_ending_a_run_is_recognised_as_done(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    hook = _Failures()
    app = virtual_app(db_url)
    handled: list[str] = []

    def notify(ctx: ss.Context) -> None:
        handled.append(ctx.run_id)

    @app.function(id="doomed", trigger=ss.on_event("go"), retries=0, on_failure=notify, middleware=[hook])
    async def doomed(ctx: ss.Context) -> None:
        await ctx.step.run("boom", _raise)

    async def main() -> str:
        driver = Driver(app)
        with faults.inject(FINISH_SITE, "after") as plan:
            [event_id] = await driver.send([ss.Event("go", {}, id="go-1")])
            [run] = await app.runs.list_async(event_id=event_id, function_id="doomed")
            await driver.settle(lambda: ended(app, run.id))
        assert plan.fired, plan.sites
        await driver.settle(lambda: asyncio.sleep(0, bool(handled)))
        return run.id

    caplog.set_level(logging.WARNING, "stepstone")
    try:
        run_id = asyncio.run(main())
        assert app.runs.get(run_id).status == "failed"
        assert hook.seen == [run_id]  # the worker knew the run had ended: its hook ran
        assert len(handled) == 1
        assert count(db_url, "SELECT COUNT(*) FROM events WHERE name = 'stepstone/function.failed'") == 1
        assert not [r for r in caplog.records if "lease lost" in r.getMessage()]
    finally:
        app.close()


def test_an_ambiguous_commit_of_an_end_sent_unread_is_recognised_as_done(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """On PostgreSQL a plain run's end goes out unread with its ``COMMIT``
    (``end_alone``). Its retry after an ambiguous ``COMMIT`` finds the queue
    item gone (the server raises a lost lease, not a wrong guess) and asks the
    run whose end it was: its own, so the run ended once and its step ran once."""
    app = virtual_app(db_url)
    ran: list[str] = []

    @app.function(id="plain", trigger=ss.on_event("go"), retries=0)
    async def plain(ctx: ss.Context) -> int:
        def once() -> int:
            ran.append(ctx.run_id)
            return 1

        result: int = await ctx.step.run("only", once)
        return result

    guesses = getattr(app.store, "_end_guesses", None)

    async def main() -> str:
        driver = Driver(app)
        assert guesses is None or guesses.alone("plain")  # PostgreSQL: this end is sent unread
        with faults.inject(FINISH_SITE, "after") as plan:
            [event_id] = await driver.send([ss.Event("go", {}, id="go-1")])
            [run] = await app.runs.list_async(event_id=event_id)
            await driver.settle(lambda: ended(app, run.id))
        assert plan.fired, plan.sites
        return run.id

    caplog.set_level(logging.WARNING, "stepstone")
    try:
        run_id = asyncio.run(main())
        done = app.runs.get(run_id)
        assert (done.status, done.output) == ("completed", 1)
        assert ran == [run_id]
        assert count(db_url, f"SELECT COUNT(*) FROM steps WHERE run_id = '{run_id}'") == 1
        assert count(db_url, "SELECT COUNT(*) FROM queue") == 0  # nothing left to lease
        assert not [r for r in caplog.records if "lease lost" in r.getMessage()]
    finally:
        app.close()


def test_an_ambiguous_commit_parking_a_run_is_recognised_as_done(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = virtual_app(db_url)
    calls: list[str] = []

    @app.function(id="napper", trigger=ss.on_event("go"), retries=1, backoff=FAST)
    async def napper(ctx: ss.Context) -> str:
        await ctx.step.run("a", lambda: calls.append("a"))
        await ctx.step.sleep("nap", "1m")
        await ctx.step.run("b", lambda: calls.append("b"))
        return "ok"

    async def main() -> str:
        driver = Driver(app)
        with faults.inject(PARK_SITE, "after") as plan:
            [event_id] = await driver.send([ss.Event("go", {}, id="go-1")])
            [run] = await app.runs.list_async(event_id=event_id)
            await driver.drain()
            assert plan.fired, plan.sites
            assert (await app.runs.get_async(run.id)).status == "sleeping"
            await driver.settle(lambda: ended(app, run.id))
        return run.id

    caplog.set_level(logging.WARNING, "stepstone")
    try:
        run_id = asyncio.run(main())
        assert app.runs.get(run_id).output == "ok"
        assert calls == ["a", "b"]
        assert not [r for r in caplog.records if "lease lost" in r.getMessage()]
    finally:
        app.close()


def _raise() -> None:
    raise ss.NonRetriableError("boom")


def test_a_wait_resolved_before_the_retry_of_its_ambiguous_commit_stays_resolved(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The event arrives while the worker cannot know its commit succeeded: the
    retry must neither reset the completed step to waiting nor wait again."""
    caplog.set_level(logging.WARNING, "stepstone")
    app = virtual_app(db_url)

    with_a_wait_beside_a_step(app)

    def answer() -> None:
        app.send(ss.Event("answer", {"v": 1}, id="answer-1"))

    async def main() -> None:
        driver = Driver(app)
        with faults.inject(WAIT_SITE, "after", during=answer) as plan:
            [event_id] = await driver.send([ss.Event("go", {}, id="go-1")])
            [run] = await app.runs.list_async(event_id=event_id)
            await driver.drain()
        assert plan.fired, plan.sites
        assert count(db_url, f"SELECT COUNT(*) FROM waits WHERE run_id = '{run.id}'") == 0
        await driver.settle(lambda: ended(app, run.id))
        done = await app.runs.get_async(run.id)
        assert (done.status, done.output) == ("completed", {"v": 1})

    try:
        asyncio.run(main())
        assert not [r.getMessage() for r in caplog.records]
    finally:
        app.close()


def test_a_child_ended_before_the_retry_of_its_ambiguous_invoke_is_not_started_again(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The child ends (here: cancelled) while the parent's worker cannot know its
    commit succeeded: the retry starts no second child and the invocation goes
    on (no crash, no wait for the lease to expire)."""
    caplog.set_level(logging.WARNING, "stepstone")
    app = virtual_app(db_url)

    @app.function(id="child", retries=0)
    async def child(ctx: ss.Context) -> int:
        return 1

    @app.function(id="parent", trigger=ss.on_event("go"), retries=0)
    async def parent(ctx: ss.Context) -> Any:
        try:
            await asyncio.gather(
                ctx.step.invoke("inv", function=child, data={}), ctx.step.run("other", lambda: "x")
            )
        except ss.StepError as exc:
            return exc.error_type
        return "child completed"

    def cancel_child() -> None:
        [(child_id,)] = query(db_url, "SELECT id FROM runs WHERE function_id = 'child'")
        app.runs.cancel(child_id)

    async def main() -> None:
        driver = Driver(app)
        with faults.inject(INVOKE_SITE, "after", during=cancel_child) as plan:
            [event_id] = await driver.send([ss.Event("go", {}, id="go-1")])
            [run] = await app.runs.list_async(event_id=event_id)
            await driver.settle(lambda: ended(app, run.id))
        assert plan.fired, plan.sites
        done = await app.runs.get_async(run.id)
        assert (done.status, done.output) == ("completed", "Cancelled")

    try:
        asyncio.run(main())
        assert count(db_url, "SELECT COUNT(*) FROM runs WHERE function_id = 'child'") == 1
        assert count(db_url, "SELECT COUNT(*) FROM waits") == 0
        assert not [r.getMessage() for r in caplog.records]
    finally:
        app.close()


# -- the store contract behind it (explicit times, both stores) ---------------------------


def test_a_repeated_wait_commit_changes_nothing_even_after_the_wait_was_resolved(
    store: Store, db_url: str
) -> None:
    add_runs(store, ["r"])
    [leased] = store.transact_sync(lambda tx: lease(tx, "w", 1, NOW, NOW + 30))
    fence = Fence(run_id="r", owner="w", epoch=leased.epoch)
    waiting = StepRow(
        run_id="r",
        step_id="w",
        position=0,
        kind=StepKind.WAIT,
        status=StepStatus.WAITING,
        attempts=0,
        wake_at=NOW + 60,
        started_at=NOW,
    )
    wait = WaitRow(
        run_id="r", step_id="w", kind=WaitKind.EVENT, event_name="answer", created_at=NOW, expires_at=NOW + 60
    )

    def commit(tx: Tx) -> Callable[[], bool]:  # what the journal commits for wait_for_event
        tx.checkpoint(fence, [waiting], [])
        return tx.start_wait(wait)

    def waits() -> list[tuple[Any, ...]]:
        return query(db_url, "SELECT step_id, event_name FROM waits WHERE run_id = 'r'")

    assert store.transact_sync(commit)() is True
    assert store.transact_sync(commit)() is False  # the retry of an ambiguous commit
    assert waits() == [("w", "answer")]

    def resolve(tx: Tx) -> None:  # an event wins the wait
        assert tx.claim_step_waits("r", "w")
        tx.complete_waiting_step("r", "w", StepStatus.COMPLETED, '{"v": 1}', None, NOW + 1)

    store.transact_sync(resolve)
    assert store.transact_sync(commit)() is False  # a late retry: nothing waits again
    [memo] = store.read_sync(lambda tx: tx.get_steps("r"))
    assert (memo.status, memo.output) == (StepStatus.COMPLETED, '{"v": 1}')
    assert waits() == []


def test_a_cancel_on_wait_is_inserted_once(store: Store, db_url: str) -> None:
    add_runs(store, ["r"])
    wait = WaitRow(
        run_id="r", step_id="cancel_on[0]", kind=WaitKind.CANCEL, event_name="stop", created_at=NOW
    )
    for _ in range(2):
        store.transact_sync(lambda tx: tx.insert_wait(wait))
    assert count(db_url, "SELECT COUNT(*) FROM waits WHERE run_id = 'r'") == 1


def test_a_park_and_an_end_record_the_invocation_that_wrote_them(store: Store) -> None:
    add_runs(store, ["r"])
    [first] = store.transact_sync(lambda tx: lease(tx, "w1", 1, NOW, NOW + 5))
    parked = Fence(run_id="r", owner="w1", epoch=first.epoch, token="first")
    store.transact_sync(lambda tx: tx.reschedule(parked, RunStatus.SLEEPING, NOW + 10, None, NOW))
    assert store.read_sync(lambda tx: tx.written_by("r")) == "first"
    [second] = store.transact_sync(lambda tx: lease(tx, "w2", 1, NOW + 10, NOW + 20))
    ended = Fence(run_id="r", owner="w2", epoch=second.epoch, token="second")
    assert store.transact_sync(
        lambda tx: tx.finish_run(
            RunEnd(fence=ended, run_id="r", status=RunStatus.COMPLETED, output="1", now=NOW + 11)
        )
    )
    assert store.read_sync(lambda tx: tx.written_by("r")) == "second"
    assert store.read_sync(lambda tx: tx.written_by("missing")) is None
