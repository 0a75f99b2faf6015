"""One attempt of a step's function, under its time limit.

A step that hangs (a provider call that never answers) must not hold a worker
slot and its run's concurrency slot for ever: past its timeout the attempt
fails with ``StepTimeoutError``, which the interpreter records like any other
failure (retried with back-off: the run parks, giving back its lease).

How an attempt is stopped depends on what it runs. A coroutine is cancelled.
A plain function runs in a thread, which Python cannot kill: a timed attempt
gets a thread of its own (never one of the worker's pool, which an abandoned
attempt would keep for ever), and past the timeout that thread is *abandoned*:
nothing waits for it any more and its late result is dropped on the floor, so
it can never be committed. Abandoned threads still cost memory and may still
hold a connection, so a worker counts them (``AbandonedThreads``): at its bound
the worker stops leasing and reports not ready until some return.

Both faces of ``ctx.step`` come here (``Interpreter.call``): the async face on
the worker's loop, the sync face through the loop from its handler thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import threading
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

from stepstone import metrics
from stepstone.errors import StepTimeoutError

DEFAULT_MAX_ABANDONED = 16  # abandoned step threads per worker before it stops leasing

Outcome = tuple[Any, BaseException | None]  # (result, failure)


class AbandonedThreads:
    """The threads of timed-out sync attempts that have not returned yet, in one
    worker (thread-safe). ``full`` once ``limit`` of them are still running."""

    def __init__(
        self, limit: int = DEFAULT_MAX_ABANDONED, on_change: Callable[[], Any] | None = None
    ) -> None:
        if limit < 1:
            raise ValueError("max_abandoned_threads must be at least 1")
        self.limit = limit
        self.on_change = on_change
        self._lock = threading.Lock()
        self._count = 0

    @property
    def count(self) -> int:
        return self._count

    @property
    def full(self) -> bool:
        return self._count >= self.limit

    def changed(self, delta: int) -> None:
        with self._lock:
            self._count += delta
        metrics.abandoned_threads(delta)
        if self.on_change is not None:
            self.on_change()


class _TimedThread:
    """A sync attempt on a thread of its own; its outcome reaches the loop's
    future unless the attempt was abandoned first (then it is discarded)."""

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], context: contextvars.Context) -> None:
        self.loop = asyncio.get_running_loop()
        self.future: asyncio.Future[Outcome] = self.loop.create_future()
        self._lock = threading.Lock()
        self._abandoned: AbandonedThreads | None = None
        self._done = False
        self._call = (fn, args, context)

    def start(self) -> None:
        threading.Thread(target=self._run, name="stepstone-timed-step", daemon=True).start()

    def _run(self) -> None:
        fn, args, context = self._call
        outcome: Outcome
        try:
            outcome = (context.run(fn, *args), None)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting attempt as its failure
            outcome = (None, exc)
        with self._lock:
            self._done = True
            abandoned = self._abandoned
        if abandoned is not None:
            abandoned.changed(-1)  # nobody waits: the late outcome is discarded
            return
        try:
            self.loop.call_soon_threadsafe(self._settle, outcome)
        except RuntimeError:  # the loop closed meanwhile (the worker stopped)
            pass

    def _settle(self, outcome: Outcome) -> None:
        if not self.future.done():
            self.future.set_result(outcome)

    def abandon(self, ledger: AbandonedThreads) -> None:
        """Stop waiting; count the thread until it returns (unless it just did)."""
        with self._lock:
            if self._done:
                return
            self._abandoned = ledger
        ledger.changed(1)


def _timed_out(step_id: str, timeout: float) -> StepTimeoutError:
    return StepTimeoutError(f"step {step_id!r} ran past its timeout of {timeout:g}s")


async def attempt(
    step_id: str,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    *,
    context: contextvars.Context | None,
    timeout: float | None,
    threads: Executor,
    abandoned: AbandonedThreads,
) -> Outcome:
    """Run ``fn(*args)`` once (a coroutine function awaited on this loop, a plain
    one in a thread, in ``context``: ``None``, a copy of the caller's); past
    ``timeout`` seconds the outcome is a ``StepTimeoutError``. Returns
    ``(result, failure)``."""
    try:
        if _is_coroutine_function(fn):
            if timeout is None:  # most steps: awaited here, no coroutine between
                return await fn(*args), None
            return await _attempt_coroutine(step_id, fn, args, timeout), None
        if context is None:
            context = contextvars.copy_context()
        if timeout is None:
            result = await in_pool(threads, fn, args, context)
        else:
            result, failure = await _attempt_thread(step_id, fn, args, context, timeout, abandoned)
            if failure is not None:
                raise failure  # a control-flow signal goes on up; an error is caught below
        if inspect.isawaitable(result):
            result = await _attempt_coroutine(step_id, lambda: result, (), timeout)
        return result, None
    except Exception as exc:  # noqa: BLE001 - recorded as the step's failure
        return None, exc


def in_pool(
    threads: Executor, fn: Callable[..., Any], args: tuple[Any, ...], context: contextvars.Context
) -> asyncio.Future[Any]:
    """``fn(*args)`` in ``context`` on a thread of ``threads``, as
    ``loop.run_in_executor`` runs it, without its two chained futures: the
    pool's thread settles the loop's future itself (one
    ``call_soon_threadsafe``; ~8 µs a hand-off less here). Cancelled before
    its thread takes it (the invocation stopped), ``fn`` never runs."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def run() -> None:
        if future.cancelled():
            return
        outcome: Outcome
        try:
            outcome = (context.run(fn, *args), None)
        except BaseException as exc:  # noqa: BLE001 - raised again by the awaiting task
            outcome = (None, exc)
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile (the worker stopped)
            loop.call_soon_threadsafe(_settle_pooled, future, outcome)

    threads.submit(run)
    return future


def _settle_pooled(future: asyncio.Future[Any], outcome: Outcome) -> None:
    if future.cancelled():
        return
    result, failure = outcome
    if failure is None:
        future.set_result(result)
    else:
        future.set_exception(failure)


def _is_coroutine_function(fn: Callable[..., Any]) -> bool:
    """``inspect.iscoroutinefunction``, answered from the code's flags for a
    plain ``async def`` function or method (every step of an async handler,
    asked once per step: inspect unwraps and checks ~1 µs more)."""
    code = getattr(fn, "__code__", None)
    if code is not None and code.co_flags & inspect.CO_COROUTINE:
        return True
    return inspect.iscoroutinefunction(fn)


async def _attempt_coroutine(
    step_id: str, fn: Callable[..., Any], args: tuple[Any, ...], timeout: float | None
) -> Any:
    if timeout is None:
        return await fn(*args)
    scope = asyncio.timeout(timeout)
    try:
        async with scope:
            return await fn(*args)  # cancelled at the deadline
    except TimeoutError:
        if scope.expired():
            raise _timed_out(step_id, timeout) from None
        raise  # the step's own TimeoutError


async def _attempt_thread(
    step_id: str,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    context: contextvars.Context,
    timeout: float,
    abandoned: AbandonedThreads,
) -> Outcome:
    timed = _TimedThread(fn, args, context)
    timed.start()
    try:
        return await asyncio.wait_for(asyncio.shield(timed.future), timeout)
    except TimeoutError:
        timed.abandon(abandoned)
        return None, _timed_out(step_id, timeout)
    except asyncio.CancelledError:
        timed.abandon(abandoned)  # the invocation itself was cancelled (worker stop)
        raise
