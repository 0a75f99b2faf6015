"""The blocking faces of ``App`` and ``app.runs`` work wherever they are called:
on a plain thread, inside a running event loop, and inside a handler running on
the app's own background loop (``app.start``), send middleware included."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import stepstone as ss
from tests.conftest import run_of


class Tagger(ss.Middleware):
    async def before_send_events(self, ctx: ss.Context | None, events: list[ss.Event]) -> list[ss.Event]:
        await asyncio.sleep(0)
        return [ss.Event(e.name, {**e.data, "tagged": True}, e.id, e.ts) for e in events]


def test_a_blocking_send_with_middleware_inside_a_running_loop(make_app: Callable[..., ss.App]) -> None:
    app = make_app(middleware=[Tagger()])

    @app.function(id="echo", trigger=ss.on_event("go"))
    async def echo(ctx: ss.Context[ss.AsyncStep]) -> Any:
        return ctx.event.data

    async def scenario() -> ss.Run:
        [event_id] = app.send(ss.Event("go", {"n": 1}))  # blocking, from a coroutine
        await app.start_async(concurrency=2)
        try:
            return await app.runs.wait_async(run_of(app, event_id).id, timeout="10s")
        finally:
            await app.stop_async()

    assert asyncio.run(scenario()).output == {"n": 1, "tagged": True}


def test_blocking_calls_from_a_handler_on_the_apps_background_loop(make_app: Callable[..., ss.App]) -> None:
    app = make_app(middleware=[Tagger()])

    @app.function(id="child", trigger=ss.on_event("child"))
    async def child(ctx: ss.Context[ss.AsyncStep]) -> Any:
        return ctx.event.data

    @app.function(id="parent", trigger=ss.on_event("parent"))
    async def parent(ctx: ss.Context[ss.AsyncStep]) -> Any:
        # blocking calls made by a coroutine on the app's background loop (no step: a
        # test of the bridge, and the event id makes the send idempotent anyway)
        app.send(ss.Event("child", {"n": 2}, id="child-event"))
        return len(app.runs.list(event_id="child-event"))

    app.start(concurrency=2)
    try:
        [event_id] = app.send(ss.Event("parent"))
        assert app.runs.wait(run_of(app, event_id).id, timeout="10s").output == 1
        child_run = run_of(app, "child-event").id
        assert app.runs.wait(child_run, timeout="10s").output == {"n": 2, "tagged": True}
    finally:
        app.stop()
