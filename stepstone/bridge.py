"""The one bridge from synchronous code to coroutines.

A ``Portal`` is an event loop on a daemon thread, started when the portal is
made and stopped once by ``close``. A synchronous caller hands it a coroutine
and blocks until the coroutine is done (``call``); the coroutine runs in a copy
of the caller's context, so context variables (a trace context, a step scope)
cross the bridge as they cross an ``await``. ``call_in`` is the same crossing
onto a loop that something else runs: the worker's loop, for the step
bookkeeping of plain ``def`` handlers.

Every synchronous surface goes through here: ``App.start``/``stop`` and
``app.send``'s middleware hooks, ``ss.Client``'s blocking methods
(``portal_face``), ``TestEnv``,
and ``ctx.step`` in plain ``def`` handlers. The blocking and ``async`` faces of
``App`` and ``app.runs`` are both derived from one body (a plan, below).
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Awaitable, Callable, Coroutine, Generator
from dataclasses import dataclass
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar

T = TypeVar("T")
S = TypeVar("S")
P = ParamSpec("P")


def call_in(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on ``loop``, which runs in another thread, and wait for its result."""
    return asyncio.run_coroutine_threadsafe(coro, loop).result()


class Portal:
    """An event loop on a daemon thread that runs coroutines for synchronous callers."""

    def __init__(self, name: str = "stepstone-portal") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the portal's loop and wait for its result. Called from
        a coroutine the portal itself runs (whose loop is busy waiting for this
        call), it runs ``coro`` on a loop of its own instead of deadlocking."""
        if threading.current_thread() is self._thread:
            aside = Portal(f"{self._thread.name}-nested")
            try:
                return aside.call(coro)
            finally:
                aside.close()
        return call_in(self.loop, coro)

    def close(self) -> None:
        """Stop the loop and its thread; coroutines still pending are abandoned."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


# -- one body, two faces ---------------------------------------------------------------
# A public operation that has a blocking and an ``async`` face (``app.send`` and
# ``app.send_async``, ``app.runs.get`` and ``app.runs.get_async``...) is written
# once, as a *plan*: a generator that yields a ``Call`` wherever it needs
# something done (a store read, a commit, a middleware hook, a pause) and gets
# its result back. ``sync_face`` drives the plan by calling each ``Call``'s
# blocking form on the caller's thread; ``async_face`` awaits each one's
# awaitable form. The blocking face thus costs what a hand-written one did: no
# thread or loop is involved unless a ``Call`` asks for one.


@dataclass(frozen=True)
class Call(Generic[T]):
    """One thing a plan needs done, in both styles."""

    blocking: Callable[[], T]
    awaiting: Callable[[], Awaitable[T]]


Plan = Generator[Call[Any], Any, T]


def coroutine_call(coro: Coroutine[Any, Any, T], portal: Callable[[], Portal]) -> Call[T]:
    """A coroutine as a plan's ``Call``: awaited by the async face, run on
    ``portal()`` by the blocking one."""

    def blocking() -> T:
        return portal().call(coro)

    return Call(blocking, lambda: coro)


def run_sync(plan: Plan[T]) -> T:
    """Drive ``plan`` on this thread; a failed ``Call`` is raised inside the plan."""
    resume: Callable[[Any], Call[Any]] = plan.send
    value: Any = None
    while True:
        try:
            call = resume(value)
        except StopIteration as done:
            result: T = done.value
            return result
        try:
            value, resume = call.blocking(), plan.send
        except BaseException as exc:  # noqa: BLE001 - raised inside the plan, which may handle it
            value, resume = exc, plan.throw


async def run_async(plan: Plan[T]) -> T:
    """Drive ``plan`` on the running event loop; a failed ``Call`` is raised inside the plan."""
    resume: Callable[[Any], Call[Any]] = plan.send
    value: Any = None
    while True:
        try:
            call = resume(value)
        except StopIteration as done:
            result: T = done.value
            return result
        try:
            value, resume = await call.awaiting(), plan.send
        except BaseException as exc:  # noqa: BLE001 - raised inside the plan, which may handle it
            value, resume = exc, plan.throw


def _named(face: Callable[..., Any], source: Callable[..., Any], name: str) -> None:
    """``face`` is called ``name`` and shows ``source``'s docstring and parameters
    (not its return type: a plan or a coroutine) to help() and IDEs."""
    face.__name__ = name
    face.__qualname__ = source.__qualname__.removesuffix(source.__name__) + name
    face.__doc__ = source.__doc__
    face.__signature__ = inspect.signature(source).replace(  # type: ignore[attr-defined]
        return_annotation=inspect.Signature.empty
    )


def sync_face(plan: Callable[Concatenate[S, P], Plan[T]]) -> Callable[Concatenate[S, P], T]:
    """The blocking method of a plan method ``_name``: ``name``."""

    def method(self: S, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return run_sync(plan(self, *args, **kwargs))

    _named(method, plan, plan.__name__.removeprefix("_"))
    return method


def async_face(
    plan: Callable[Concatenate[S, P], Plan[T]],
) -> Callable[Concatenate[S, P], Coroutine[Any, Any, T]]:
    """The ``async`` method of a plan method ``_name``: ``name_async``."""

    async def method(self: S, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await run_async(plan(self, *args, **kwargs))

    _named(method, plan, plan.__name__.removeprefix("_") + "_async")
    return method


def portal_face(
    method: Callable[Concatenate[S, P], Coroutine[Any, Any, T]],
    portal: Callable[[S], Portal],
) -> Callable[Concatenate[S, P], T]:
    """The blocking twin ``name`` of an ``async`` method ``name_async`` whose
    coroutines need a loop of their own (``ss.Client``: httpx clients are per
    loop): it runs them on ``portal(self)``."""

    def blocking(self: S, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return portal(self).call(method(self, *args, **kwargs))

    _named(blocking, method, method.__name__.removesuffix("_async"))
    return blocking


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


async def wait_event(event: asyncio.Event, timeout: float) -> bool:
    """Wait until ``event`` is set (``True``) or ``timeout`` seconds passed
    (``False``), in the calling task: ``asyncio.wait_for`` would wrap the wait
    in a task of its own, two more turns of the loop per wake-up."""
    if event.is_set():
        return True
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        return False
    return True


class Wakeup:
    """A flag set from any thread (``set``) and waited for, with a time-out, by a
    plan's blocking or ``async`` face (``wait``). Each face makes what it waits
    on when it first waits (a ``runs.wait`` on an event loop makes no
    ``threading.Event``): ``set`` raises the flag, then sets whichever exists; a
    wait makes its own, then looks at the flag, so neither misses the other."""

    def __init__(self) -> None:
        self._set = False
        self._flag: threading.Event | None = None  # the blocking face's
        self._loop: asyncio.AbstractEventLoop | None = None
        self._async: asyncio.Event | None = None  # the async face's, on ``_loop``

    def set(self) -> None:
        self._set = True
        if self._flag is not None:
            self._flag.set()
        loop, flag = self._loop, self._async
        if loop is not None and flag is not None:
            if _running_loop() is loop:
                flag.set()  # on the waiter's own loop (a local worker): no self-pipe write
            else:
                loop.call_soon_threadsafe(flag.set)

    def wait(self, timeout: float) -> Call[None]:
        """Return when set (then clear it) or after ``timeout`` seconds."""
        return Call(lambda: self._wait(timeout), lambda: self._wait_async(timeout))

    def _wait(self, timeout: float) -> None:
        if self._flag is None:
            self._flag = threading.Event()
        if not self._set:  # a set() from now on also sets self._flag
            self._flag.wait(timeout)
        self._set = False
        self._flag.clear()

    async def _wait_async(self, timeout: float) -> None:
        if self._async is None:
            self._async, self._loop = asyncio.Event(), asyncio.get_running_loop()
        if not self._set:  # a set() from now on also sets self._async
            # The time-out sets the event itself (its wait then ends as a set's
            # would: the caller looks again either way); ``asyncio.timeout``'s
            # context manager cost ~20 K instructions a ``runs.wait``.
            timer = asyncio.get_running_loop().call_later(timeout, self._async.set)
            try:
                await self._async.wait()
            finally:
                timer.cancel()
        self._set = False
        if self._flag is not None:
            self._flag.clear()
        self._async.clear()
