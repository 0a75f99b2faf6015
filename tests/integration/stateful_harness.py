"""The world the stateful test (test_stateful.py) drives: one app per store
with the functions of the model, simulated workers, invocations that can be
held mid-step, and commits that can be made ambiguous.

Kept apart from the state machine so that it reads as the model's rules and
invariants only.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import stepstone as ss
from stepstone.errors import StoreUnavailableError
from stepstone.executor import Outcome
from stepstone.store.base import Store, Tx
from stepstone.testing import VirtualClock

from .stateful_db import Reader

T = TypeVar("T")
START = 1_800_000_000.0  # the virtual clock's start


class Model(Protocol):
    """What the app's step functions call: the model's side effect."""

    async def effect(self, run_id: str, step: str) -> str: ...


CURRENT: contextvars.ContextVar[Invocation] = contextvars.ContextVar("stateful_invocation")


@dataclass
class Invocation:
    """One ``execute()`` of a leased run by a simulated worker."""

    name: str
    worker: int
    run_id: str
    epoch: int
    hold: bool  # hold executed steps, from the ``hold_from``-th on
    hold_from: int = 1
    executed: int = 0
    fail: bool = False  # its first executed step fails after its side effect
    task: asyncio.Task[Outcome | None] | None = None
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    at_hold: str | None = None  # the step it is held in
    crashed: bool = False
    reported: bool = False  # its end was looked at
    owner: str = ""
    until: float = float("inf")  # virtual time its worker knows the lease live until (``Presence``)

    @property
    def live(self) -> bool:
        return self.task is not None and not self.task.done()


class AmbiguousCommits:
    """A worker's view of the real store, except that its next ``armed``
    commits are reported lost (a dropped connection) after they committed:
    an ambiguous commit, which the journal retries."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.armed = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def transact(self, op: Callable[[Tx], T]) -> T:
        result = await self.store.transact(op)
        if self.armed:
            self.armed -= 1
            raise StoreUnavailableError("connection lost after COMMIT (injected by the test)")
        return result

    def submit(self, op: Callable[[Tx], T]) -> asyncio.Future[T]:
        return asyncio.ensure_future(self.transact(op))


@dataclass
class SimWorker:
    index: int
    store: AmbiguousCommits
    generation: int = 0

    @property
    def owner(self) -> str:
        return f"w{self.index}/g{self.generation}"


TABLES = (
    "batches",
    "crons",
    "debounces",
    "dedupe",
    "events",
    "gcra",
    "jobs",
    "partitions",
    "queue",
    "run_events",
    "runs",
    "signals",
    "spans",
    "steps",
    "wait_keys",
    "waits",
    "workers",
)


class Harness:
    """One app, database, loop and virtual clock per store, shared by the
    examples (creating a PostgreSQL database and store per example would cost
    most of the budget); every table but the function registry is emptied
    before each example."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.clock = VirtualClock(START)
        self.loop = asyncio.new_event_loop()
        self.model: Model | None = None
        self.app = self._build_app()
        self.threads = ThreadPoolExecutor(max_workers=4, thread_name_prefix="stateful")
        self.db = Reader(url)

    def reset(self, model: Model) -> None:
        for table in TABLES:
            self.db.execute(f"DELETE FROM {table}")
        self.model = model

    def reopen(self) -> None:
        """A new store (new connections) for the app: what a refused commit, a
        crash or an error left in a connection must not reach the next example."""
        self.app._rebind(self.url, self.clock)
        self.app.store  # noqa: B018 - open it now

    def close(self) -> None:
        self.app.close()
        self.db.close()
        self.threads.shutdown(wait=False)
        self.loop.close()

    # -- the app under test ----------------------------------------------------------------------
    def _build_app(self) -> ss.App:
        app = ss.App("stateful", database_url=self.url, clock=self.clock)

        async def effect(run_id: str, step: str) -> str:
            assert self.model is not None
            return await self.model.effect(run_id, step)

        match = "async.data.k == event.data.k"

        @app.function(
            id="seq",
            trigger=ss.on_event("go.seq"),
            retries=0,
            singleton=ss.Singleton(key="event.data.g", mode="skip"),
        )
        async def seq(ctx: ss.Context) -> list[str]:
            a = await ctx.step.run("a", effect, ctx.run_id, "a")
            b = await ctx.step.run("b", effect, ctx.run_id, "b")
            await ctx.step.sleep("nap", "5s")
            c = await ctx.step.run("c", effect, ctx.run_id, "c")
            return [a, b, c]

        @app.function(id="waiter", trigger=ss.on_event("go.waiter"), retries=0)
        async def waiter(ctx: ss.Context) -> list[Any]:
            a = await ctx.step.run("a", effect, ctx.run_id, "a")
            got = await ctx.step.wait_for_event("w", event="poke", if_=match, timeout="20s")
            b = await ctx.step.run("b", effect, ctx.run_id, "b")
            return [a, got is not None, b]

        @app.function(id="forever", trigger=ss.on_event("go.forever"), retries=0)
        async def forever(ctx: ss.Context) -> list[Any]:
            a = await ctx.step.run("a", effect, ctx.run_id, "a")
            got = await ctx.step.wait_for_event("w", event="poke", if_=match)
            b = await ctx.step.run("b", effect, ctx.run_id, "b")
            return [a, got is not None, b]

        @app.function(id="signalled", trigger=ss.on_event("go.signalled"), retries=0)
        async def signalled(ctx: ss.Context) -> list[Any]:
            a = await ctx.step.run("a", effect, ctx.run_id, "a")
            got = await ctx.step.wait_for_signal("w", "s", timeout="20s")
            b = await ctx.step.run("b", effect, ctx.run_id, "b")
            return [a, got, b]

        @app.function(id="beside", trigger=ss.on_event("go.beside"), retries=0)
        async def beside(ctx: ss.Context) -> list[Any]:
            # The wait runs beside a step: its wait row commits (at the step's
            # start) while the run is still leased.
            a = await ctx.step.run("a", effect, ctx.run_id, "a")
            got, b = await asyncio.gather(
                ctx.step.wait_for_event("w", event="poke", if_=match),
                ctx.step.run("b", effect, ctx.run_id, "b"),
            )
            c = await ctx.step.run("c", effect, ctx.run_id, "c")
            return [a, got is not None, b, c]

        @app.function(id="child", trigger=ss.on_event("never.sent"), retries=0)
        async def child(ctx: ss.Context) -> list[str]:
            a = await ctx.step.run("a", effect, ctx.run_id, "a")
            await ctx.step.sleep("nap", "3s")
            b = await ctx.step.run("b", effect, ctx.run_id, "b")
            return [a, b]

        @app.function(id="parent", trigger=ss.on_event("go.parent"), retries=0)
        async def parent(ctx: ss.Context) -> list[Any]:
            a = await ctx.step.run("a", effect, ctx.run_id, "a")
            try:
                got = await ctx.step.invoke(
                    "call", function="child", data={"k": ctx.event.data["k"]}, timeout="40s"
                )
            except ss.StepError as exc:
                got = exc.error_type
            b = await ctx.step.run("b", effect, ctx.run_id, "b")
            return [a, got, b]

        @app.function(id="fork", trigger=ss.on_event("go.fork"), retries=0)
        async def fork(ctx: ss.Context) -> list[Any]:
            # The invoke runs beside a step: the child starts (at the step's
            # start) while the parent is still leased, and may end before it parks.
            a = await ctx.step.run("a", effect, ctx.run_id, "a")
            got, b = await asyncio.gather(
                ctx.step.invoke("call", function="child", data={"k": ctx.event.data["k"]}),
                ctx.step.run("b", effect, ctx.run_id, "b"),
            )
            c = await ctx.step.run("c", effect, ctx.run_id, "c")
            return [a, got, b, c]

        app.store  # noqa: B018 - migrate and register the functions now
        return app
