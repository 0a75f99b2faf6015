"""Middleware: shared behaviour plugged into every function (``App(middleware=)``)
or one function (``@app.function(middleware=)``).

Subclass ``Middleware`` and override any hook; each hook may be a plain or an
``async`` method (the engine awaits what needs awaiting). Hooks never repeat
external actions on replays: ``before_step``/``after_step`` run only around
steps that execute (never memoized ones), ``before_execution`` runs once per
invocation when the replay has caught up with new code, and ``on_failure``
runs once, after the run's failure is committed.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Sequence
from typing import TYPE_CHECKING, Any

from stepstone.errors import ErrorInfo, NonRetriableError
from stepstone.events import Event

if TYPE_CHECKING:
    from stepstone.context import Context


class Middleware:
    """Override the hooks you need, as plain or ``async`` methods; the defaults do nothing."""

    def transform_input(
        self, ctx: Context, steps: dict[str, Any]
    ) -> dict[str, Any] | Awaitable[dict[str, Any] | None] | None:
        """Every invocation, before the handler: may change ``ctx.events`` and the
        memoized step values (``steps``: step id -> value); return a new dict
        to replace them."""
        return None

    def before_execution(self, ctx: Context) -> Awaitable[None] | None:
        """Once per invocation, when the replay of memoized steps has caught up."""

    def after_execution(self, ctx: Context) -> Awaitable[None] | None:
        """When the handler returned, paused or raised (after ``before_execution``)."""

    def before_step(self, ctx: Context, step_id: str) -> Awaitable[None] | None:
        """Before a step's function runs (not for memoized steps)."""

    def after_step(
        self, ctx: Context, step_id: str, output: Any, error: BaseException | None
    ) -> Awaitable[None] | None:
        """After a step's function ran, with its result or exception."""

    def transform_output(self, ctx: Context, output: Any, step_id: str | None) -> Any:
        """The value about to be stored: a step's result (``step_id``) or the
        function's (``None``). Return what to store; the handler keeps the original."""
        return output

    def before_send_events(
        self, ctx: Context | None, events: list[Event]
    ) -> list[Event] | Awaitable[list[Event]]:
        """Events about to be sent (``app.send``, ``step.send_event``, and the event
        carrying ``step.invoke``'s data); return what to send."""
        return events

    def after_send_events(self, ctx: Context | None, ids: list[str]) -> Awaitable[None] | None:
        """Events were sent (committed)."""

    def on_failure(self, ctx: Context, error: ErrorInfo) -> Awaitable[None] | None:
        """The run failed (called once, after the failure is committed)."""


_HOOKS = (
    "transform_input",
    "before_execution",
    "after_execution",
    "before_step",
    "after_step",
    "transform_output",
    "before_send_events",
    "after_send_events",
    "on_failure",
)


_NO_METHODS: dict[str, list[Any]] = {hook: [] for hook in _HOOKS}  # shared: only ever read


async def _call(method: Any, *args: Any) -> Any:
    result = method(*args)
    if inspect.isawaitable(result):
        result = await result
    return result


class Hooks:
    """The middleware of one invocation (or one send), called in order."""

    def __init__(self, middleware: Sequence[Middleware]) -> None:
        self.middleware = list(middleware)
        if not self.middleware:  # every run of an app without middleware: nothing to look up
            self._by_hook, self.active = _NO_METHODS, False
        else:
            self._by_hook = {
                hook: [
                    getattr(m, hook)
                    for m in self.middleware
                    if getattr(type(m), hook, None) is not getattr(Middleware, hook)
                ]
                for hook in _HOOKS
            }
            self.active = any(self._by_hook.values())
        self.executing = False

    def has(self, hook: str) -> bool:
        return bool(self._by_hook[hook])

    async def _each(self, hook: str, *args: Any) -> None:
        for method in self._by_hook[hook]:
            await _call(method, *args)

    async def transform_input(self, ctx: Context, steps: dict[str, Any]) -> dict[str, Any]:
        for method in self._by_hook["transform_input"]:
            replaced = await _call(method, ctx, steps)
            if replaced is not None:
                steps = replaced
        return steps

    async def before_execution(self, ctx: Context) -> None:
        if not self.executing:
            self.executing = True
            await self._each("before_execution", ctx)

    async def after_execution(self, ctx: Context) -> None:
        if self.executing:
            self.executing = False
            await self._each("after_execution", ctx)

    async def before_step(self, ctx: Context, step_id: str) -> None:
        await self._each("before_step", ctx, step_id)

    async def after_step(self, ctx: Context, step_id: str, output: Any, error: BaseException | None) -> None:
        await self._each("after_step", ctx, step_id, output, error)

    async def transform_output(self, ctx: Context | None, output: Any, step_id: str | None) -> Any:
        for method in self._by_hook["transform_output"]:
            output = await _call(method, ctx, output, step_id)
        return output

    def transform_output_now(self, ctx: Context | None, output: Any, step_id: str | None) -> Any:
        """``transform_output`` where nothing can be awaited (a ``step.transaction``'s
        result, inside its commit): every such hook must be synchronous."""
        for method in self._by_hook["transform_output"]:
            output = method(ctx, output, step_id)
            if inspect.isawaitable(output):
                if inspect.iscoroutine(output):
                    output.close()
                raise NonRetriableError(
                    f"{type(method.__self__).__name__}.transform_output is async; "
                    "step.transaction needs a synchronous one"
                )
        return output

    async def before_send_events(self, ctx: Context | None, events: list[Event]) -> list[Event]:
        for method in self._by_hook["before_send_events"]:
            events = list(await _call(method, ctx, events))
        return events

    async def after_send_events(self, ctx: Context | None, ids: list[str]) -> None:
        await self._each("after_send_events", ctx, ids)

    async def on_failure(self, ctx: Context, error: ErrorInfo) -> None:
        await self._each("on_failure", ctx, error)


NO_HOOKS = Hooks(())
