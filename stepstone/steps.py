"""The step API handlers see as ``ctx.step``: one facade for ``async def``
handlers (every call returns an awaitable) and one for plain ``def`` handlers
(every call returns its value; the handler runs in a worker thread and step
bookkeeping is driven on the worker's event loop). Both delegate to the
``Interpreter``."""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import threading
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from datetime import datetime
from typing import Any, TypeVar

from stepstone.bridge import call_in
from stepstone.durations import Duration, parse_duration
from stepstone.errors import ConfigError, Interrupt, NonRetriableError
from stepstone.events import Event
from stepstone.interpreter import Interpreter
from stepstone.signals import StepScope, as_timestamp, current_step

T = TypeVar("T")
FunctionRef = str | Callable[..., Any]


def _first_failure(results: list[tuple[bool, Any]]) -> BaseException | None:
    errors = [value for ok, value in results if not ok]
    for err in errors:
        if isinstance(err, Interrupt):
            return err
    return errors[0] if errors else None


def _timeout(timeout: Duration | None) -> float | None:
    return None if timeout is None else parse_duration(timeout, field="timeout")


def _step_timeout(timeout: Duration | None) -> float | None:
    """A ``step.run`` timeout in seconds; a bad one fails the run at once, naming the field."""
    if timeout is None:
        return None
    try:
        seconds = parse_duration(timeout, field="timeout")
    except ConfigError as exc:
        raise NonRetriableError(str(exc)) from exc
    if seconds <= 0:
        raise NonRetriableError(f"timeout: must be a positive duration, got {timeout!r}")
    return seconds


def _event_names(event: str | Sequence[str]) -> list[str]:
    """The names a wait listens to: one, or a non-empty list without repeats."""
    names = [event] if isinstance(event, str) else list(event) if isinstance(event, list | tuple) else None
    if not names or any(not isinstance(n, str) or not n.strip() for n in names):
        raise NonRetriableError(f"event: expected an event name or a non-empty list of names, got {event!r}")
    return list(dict.fromkeys(names))


def _lookback(lookback: Duration | None) -> float | None:
    try:
        return None if lookback is None else parse_duration(lookback, field="lookback")
    except ConfigError as exc:
        raise NonRetriableError(str(exc)) from exc


def _check_retries(retries: int | None) -> int | None:
    if retries is not None and (
        isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= 100
    ):
        raise NonRetriableError(f"retries must be an integer between 0 and 100, got {retries!r}")
    return retries


def _plain(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A transaction's function runs on the store's writer, where nothing is awaited."""
    if inspect.iscoroutinefunction(fn):
        raise NonRetriableError("step.transaction needs a plain function, not a coroutine function")
    return fn


class AsyncStep:
    """``ctx.step`` for ``async def`` handlers."""

    def __init__(self, interp: Interpreter) -> None:
        self._i = interp

    def run(
        self,
        id: str,
        fn: Callable[..., Any],
        *args: Any,
        retries: int | None = None,
        timeout: Duration | None = None,
    ) -> Coroutine[Any, Any, Any]:
        """Run ``fn(*args)`` once, durably; its JSON result is memoized. An attempt
        past ``timeout`` (else the function's ``step_timeout``) fails with
        ``StepTimeoutError``."""
        step_id = self._i.claim_id(id)
        if retries is None and timeout is None:  # most calls: nothing to check
            return self._i.run(step_id, fn, args, None, None)
        return self._i.run(step_id, fn, args, _check_retries(retries), _step_timeout(timeout))

    def transaction(
        self, id: str, fn: Callable[..., Any], *args: Any, retries: int | None = None
    ) -> Coroutine[Any, Any, Any]:
        """Run ``fn(conn, *args)`` inside the transaction that commits its memo:
        its writes to the Stepstone database commit exactly once, with the step."""
        step_id = self._i.claim_id(id)
        return self._i.transaction(step_id, _plain(fn), args, _check_retries(retries))

    async def sleep(self, id: str, duration: Duration) -> None:
        step_id = self._i.claim_id(id)
        seconds = parse_duration(duration, field="duration")
        await self._i.sleep_until(step_id, self._i.clock.now() + seconds)

    async def sleep_until(self, id: str, until: datetime) -> None:
        step_id = self._i.claim_id(id)
        await self._i.sleep_until(step_id, as_timestamp(until))

    def wait_for_event(
        self,
        id: str,
        *,
        event: str | Sequence[str],
        if_: str | None = None,
        timeout: Duration | None = None,
        lookback: Duration | None = None,
    ) -> Coroutine[Any, Any, Event | None]:
        """The first matching event of any of the names sent after the wait began
        (or up to ``lookback`` before), or ``None`` at the timeout."""
        step_id = self._i.claim_id(id)
        names, seconds = _event_names(event), _lookback(lookback)
        return self._i.wait_for_event(step_id, names, if_, _timeout(timeout), seconds)

    def wait_for_signal(
        self, id: str, name: str, timeout: Duration | None = None
    ) -> Coroutine[Any, Any, Any]:
        """The data of the oldest signal ``name`` sent to this run and not yet
        received (sent before the wait began, or after), or ``None`` at the timeout."""
        step_id = self._i.claim_id(id)
        return self._i.wait_for_signal(step_id, name, _timeout(timeout))

    def invoke(
        self,
        id: str,
        *,
        function: FunctionRef,
        data: dict[str, Any] | None = None,
        timeout: Duration | None = None,
    ) -> Coroutine[Any, Any, Any]:
        """Run another function and return its output (``StepError`` if it fails)."""
        step_id = self._i.claim_id(id)
        return self._i.invoke(step_id, function, data or {}, _timeout(timeout))

    def send_event(self, id: str, events: Event | Sequence[Event]) -> Coroutine[Any, Any, list[str]]:
        """Send events exactly once, even if the run replays; returns their ids."""
        step_id = self._i.claim_id(id)
        return self._i.send_event(step_id, events)

    async def parallel(self, *branches: Callable[[], Awaitable[Any]]) -> list[Any]:
        """Run the branches concurrently; wait for all, then return their results."""
        futures = [asyncio.ensure_future(_as_awaitable(branch())) for branch in branches]
        results: list[tuple[bool, Any]] = []
        for future in futures:
            try:
                results.append((True, await future))
            except BaseException as exc:  # noqa: BLE001 - re-raised once all branches end
                results.append((False, exc))
        failure = _first_failure(results)
        if failure is not None:
            raise failure
        return [value for _, value in results]

    async def patched(self, id: str) -> bool:
        """Whether this run reaches here under the code with change ``id`` (docs/versioning.md)."""
        return await self._i.patched(self._i.claim_id(id))

    def idempotency_key(self, id: str | None = None) -> str:
        return self._i.idempotency_key(id)


async def _as_awaitable(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


class SyncStep:
    """``ctx.step`` for plain ``def`` handlers."""

    def __init__(self, interp: Interpreter, loop: asyncio.AbstractEventLoop) -> None:
        self._i = interp
        self._loop = loop
        interp.branches.start_threads()  # the handler's own thread

    def _on_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        return call_in(self._loop, coro)

    def run(
        self,
        id: str,
        fn: Callable[..., Any],
        *args: Any,
        retries: int | None = None,
        timeout: Duration | None = None,
    ) -> Any:
        step_id = self._i.claim_id(id)
        retries = _check_retries(retries)
        seconds = _step_timeout(timeout)
        done, value = self._on_loop(self._i.begin_step(step_id, fn))
        if done:
            return value
        attempt = int(value)
        started = self._i.clock.now()
        token = current_step.set(StepScope(step_id, attempt))
        result: Any = None
        failure: BaseException | None = None
        try:
            if self._i.time_limit(seconds) is None and not inspect.iscoroutinefunction(fn):
                result = fn(*args)  # untimed: on this handler thread, as the handler's own code
            else:  # the one timed path, on the loop (a timed sync step gets a thread of its own)
                context = contextvars.copy_context()
                result, failure = self._on_loop(self._i.call(step_id, fn, args, context, seconds))
        except Exception as exc:  # noqa: BLE001 - recorded as the step's failure
            failure = exc
        finally:
            current_step.reset(token)
        return self._on_loop(self._i.finish_step(step_id, attempt, started, result, failure, retries))

    def transaction(self, id: str, fn: Callable[..., Any], *args: Any, retries: int | None = None) -> Any:
        step_id = self._i.claim_id(id)
        return self._on_loop(self._i.transaction(step_id, _plain(fn), args, _check_retries(retries)))

    def sleep(self, id: str, duration: Duration) -> None:
        step_id = self._i.claim_id(id)
        seconds = parse_duration(duration, field="duration")
        self._on_loop(self._i.sleep_until(step_id, self._i.clock.now() + seconds))

    def sleep_until(self, id: str, until: datetime) -> None:
        step_id = self._i.claim_id(id)
        self._on_loop(self._i.sleep_until(step_id, as_timestamp(until)))

    def wait_for_event(
        self,
        id: str,
        *,
        event: str | Sequence[str],
        if_: str | None = None,
        timeout: Duration | None = None,
        lookback: Duration | None = None,
    ) -> Event | None:
        step_id = self._i.claim_id(id)
        names, seconds = _event_names(event), _lookback(lookback)
        return self._on_loop(self._i.wait_for_event(step_id, names, if_, _timeout(timeout), seconds))

    def wait_for_signal(self, id: str, name: str, timeout: Duration | None = None) -> Any:
        step_id = self._i.claim_id(id)
        return self._on_loop(self._i.wait_for_signal(step_id, name, _timeout(timeout)))

    def invoke(
        self,
        id: str,
        *,
        function: FunctionRef,
        data: dict[str, Any] | None = None,
        timeout: Duration | None = None,
    ) -> Any:
        step_id = self._i.claim_id(id)
        return self._on_loop(self._i.invoke(step_id, function, data or {}, _timeout(timeout)))

    def send_event(self, id: str, events: Event | Sequence[Event]) -> list[str]:
        step_id = self._i.claim_id(id)
        return self._on_loop(self._i.send_event(step_id, events))

    def parallel(self, *branches: Callable[[], Any]) -> list[Any]:
        results: list[tuple[bool, Any]] = [(True, None)] * len(branches)
        fork = self._i.branches.fork(len(branches))  # this thread joins; a verdict waits for the rest

        def branch(i: int, context: contextvars.Context) -> None:
            try:
                results[i] = (True, context.run(branches[i]))
            except BaseException as exc:  # noqa: BLE001 - re-raised below, signals included
                results[i] = (False, exc)
            finally:
                fork.ended()

        threads = [
            threading.Thread(target=branch, args=(i, contextvars.copy_context()), daemon=True)
            for i in range(len(branches))
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        failure = _first_failure(results)
        if failure is not None:
            raise failure
        return [value for _, value in results]

    def patched(self, id: str) -> bool:
        step_id = self._i.claim_id(id)
        return self._on_loop(self._i.patched(step_id))

    def idempotency_key(self, id: str | None = None) -> str:
        return self._i.idempotency_key(id)
