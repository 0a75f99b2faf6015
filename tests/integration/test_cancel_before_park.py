"""A cancel, a finish timeout or a wake-up that reaches a held run just before
its invocation parks, with real workers on both backends (issue 12, defects 2
and 3): the park honours it, so the run never waits for ever nor sleeps out a
cancel."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import stepstone as ss

from ..conftest import query, run_of
from ..polling import wait_for

PAUSES: dict[str, Callable[[ss.Context], Any]] = {
    "wait_for_event": lambda ctx: ctx.step.wait_for_event("never", event="never.sent"),
    "sleep": lambda ctx: ctx.step.sleep("nap", "1h"),
    "invoke": lambda ctx: ctx.step.invoke("child", function="child", data={}),
}


def of_run(url: str, what: str, table: str, run_id: str) -> list[tuple[Any, ...]]:
    return query(url, f"SELECT {what} FROM {table} WHERE run_id = '{run_id}'")


def start(app: ss.App, event: ss.Event) -> str:
    [event_id] = app.send(event)
    return run_of(app, event_id, "job").id


@pytest.mark.parametrize("pause", sorted(PAUSES))
def test_a_step_that_cancels_its_own_run_ends_it_before_the_pause(app: ss.App, pause: str) -> None:
    after: list[str] = []

    @app.function(id="child", trigger=ss.on_event("child.never"))
    def child(ctx: ss.Context) -> None:
        ctx.step.wait_for_event("forever", event="never.sent")

    @app.function(id="job", trigger=ss.on_event("job"))
    def job(ctx: ss.Context) -> None:
        ctx.step.run("cancel-me", lambda: app.runs.cancel(ctx.run_id))
        PAUSES[pause](ctx)
        ctx.step.run("after", lambda: after.append("ran"))

    app.start()
    run = app.runs.wait(start(app, ss.Event("job")), timeout="5s")
    assert run.status == "cancelled"
    assert (run.steps[0].id, run.steps[0].status) == ("cancel-me", "completed")
    assert after == []
    assert of_run(app.database_url, "run_id", "queue", run.id) == []


def test_a_cancel_on_event_sent_by_the_run_itself_ends_it_before_its_wait(app: ss.App) -> None:
    """The cancel_on wait is resolved in the same commit as the step that sends
    the event, after that commit's fence read the flag: the park must see it."""

    @app.function(
        id="job",
        trigger=ss.on_event("job"),
        cancel_on=[ss.CancelOn(event="job.stop", if_="async.data.k == event.data.k")],
    )
    def job(ctx: ss.Context) -> None:
        ctx.step.send_event("stop-myself", ss.Event("job.stop", {"k": ctx.event.data["k"]}))
        ctx.step.wait_for_event("never", event="never.sent")

    app.start()
    run = app.runs.wait(start(app, ss.Event("job", {"k": 1})), timeout="5s")
    assert run.status == "cancelled"
    assert run.error is not None and "job.stop" in run.error.message  # the reason is kept


def test_a_finish_timeout_during_a_step_cancels_at_the_wait_with_its_reason(app: ss.App) -> None:
    flagged = threading.Event()

    @app.function(id="job", trigger=ss.on_event("job"), timeouts=ss.Timeouts(finish="300ms"))
    def job(ctx: ss.Context) -> None:
        ctx.step.run("slow", lambda: flagged.wait(10))
        ctx.step.wait_for_event("never", event="never.sent")

    app.start()
    run_id = start(app, ss.Event("job"))
    url = app.database_url

    def timed_out() -> bool:  # the duty flagged the held run (deadlines cleared)
        return of_run(url, "cancel_requested", "queue", run_id) == [(1,)]

    wait_for(timed_out, 10, "the finish timeout to flag the run")
    flagged.set()
    run = app.runs.wait(run_id, timeout="5s")
    assert run.status == "cancelled"
    assert run.error is not None and run.error.type == "Timeout" and "timeouts.finish" in run.error.message


def test_a_wake_while_the_loop_is_blocked_past_the_lease_is_not_lost(make_app: Callable[..., ss.App]) -> None:
    """Defect 3: an async step blocks the event loop past the lease (no
    heartbeat) while a parallel wait_for_event's event arrives; once the loop
    runs again the invocation parks the run, which must then resume."""
    app, sender = make_app(), make_app("sender")
    release = threading.Event()

    async def blocking_step() -> str:
        release.wait(10)  # blocks the loop on purpose, as a stuck async step would
        await asyncio.sleep(0)
        return "slow"

    @app.function(id="job", trigger=ss.on_event("job"))
    async def job(ctx: ss.Context) -> list[Any]:
        got = await ctx.step.parallel(
            lambda: ctx.step.wait_for_event("go", event="go"),
            lambda: ctx.step.run("slow", blocking_step),
        )
        return [got[0].name if got[0] else None, got[1]]

    app.start(lease_ttl=0.6)
    run_id = start(app, ss.Event("job"))
    url = app.database_url
    wait_for(lambda: of_run(url, "COUNT(*)", "waits", run_id) == [(1,)], 10, "the wait to be recorded")

    def lapsed() -> bool:
        rows = of_run(url, "available_at", "queue", run_id)
        return bool(rows) and rows[0][0] is not None and rows[0][0] < time.time()

    wait_for(lapsed, 10, "the lease to lapse")
    sender.send(ss.Event("go"))
    assert of_run(url, "COUNT(*)", "waits", run_id) == [(0,)]  # resolved
    release.set()
    run = app.runs.wait(run_id, timeout="10s")
    assert run.status == "completed" and run.output == ["go", "slow"]


def test_a_singleton_replacement_started_by_the_run_itself_ends_it_before_its_wait(app: ss.App) -> None:
    @app.function(
        id="job", trigger=ss.on_event("job"), singleton=ss.Singleton(key="event.data.k", mode="cancel")
    )
    def job(ctx: ss.Context) -> str:
        if ctx.event.data["first"]:
            ctx.step.run("replace-me", lambda: app.send(ss.Event("job", {"k": 1, "first": False})))
            ctx.step.wait_for_event("never", event="never.sent")
        return "replacement"

    app.start()
    first = app.runs.wait(start(app, ss.Event("job", {"k": 1, "first": True})), timeout="5s")
    assert first.status == "cancelled"
    assert first.error is not None and "singleton" in first.error.message
    [replacement] = [r for r in app.runs.list(function_id="job") if r.id != first.id]
    assert app.runs.wait(replacement.id, timeout="5s").output == "replacement"
