"""The public API's types as a user's strict type checker sees them: ``ctx.step``,
async middleware hooks, ``Runs.list``. mypy runs over ``tests/`` in the test
command, so the ``assert_type`` lines and the ``async`` hooks below fail it if
the annotations regress; pytest runs the same handlers for real, so the runtime
agrees with the types."""

from __future__ import annotations

from typing import assert_type

import stepstone as ss
from stepstone.testing import TestEnv


class AsyncHooks(ss.Middleware):
    """Any hook may be ``async def`` (README, ``Middleware``)."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def before_execution(self, ctx: ss.Context) -> None:
        self.seen.append(f"before_execution:{ctx.function_id}")

    async def before_send_events(self, ctx: ss.Context | None, events: list[ss.Event]) -> list[ss.Event]:
        self.seen.append("before_send_events")
        return [ss.Event(e.name, {**e.data, "hooked": True}, e.id, e.ts) for e in events]


def test_the_handlers_annotation_types_ctx_step_and_hooks_may_be_async() -> None:
    hooks = AsyncHooks()
    app = ss.App("types", database_url="sqlite:///never-opened.db", middleware=[hooks])

    @app.function(id="a", trigger=ss.on_event("a"))
    async def a(ctx: ss.Context[ss.AsyncStep]) -> list[str]:
        assert_type(ctx.step, ss.AsyncStep)
        assert isinstance(ctx.step, ss.AsyncStep)
        return await ctx.step.send_event("ping", ss.Event("ping"))

    @app.function(id="s", trigger=ss.on_event("s"))
    def s(ctx: ss.Context[ss.SyncStep]) -> list[str]:
        assert_type(ctx.step, ss.SyncStep)
        assert isinstance(ctx.step, ss.SyncStep)
        return ctx.step.send_event("ping", ss.Event("ping"))

    with TestEnv(app) as env:
        runs = {r.function_id: env.wait(r.id) for r in env.send([ss.Event("a"), ss.Event("s")])}
        listed = app.runs.list(function_id="a", status=["completed"], limit=10)  # keywords, as remotely
        assert_type(listed, list[ss.Run])
        assert [r.id for r in listed] == [runs["a"].id]
    assert {f: (r.status, r.error) for f, r in runs.items()} == {
        "a": ("completed", None),
        "s": ("completed", None),
    }
    assert {"before_execution:a", "before_execution:s", "before_send_events"} <= set(hooks.seen)
