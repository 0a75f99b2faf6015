"""``bridge``: the one way synchronous code runs a coroutine (``Portal``), and
one body for a blocking and an ``async`` face (plans)."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from typing import Any

import pytest

from stepstone.bridge import Call, Plan, Portal, Wakeup, async_face, run_async, run_sync, sync_face

scope: contextvars.ContextVar[str] = contextvars.ContextVar("scope", default="none")


async def where() -> tuple[str, str]:
    return threading.current_thread().name, scope.get()


def test_a_portal_runs_coroutines_on_its_thread_in_the_callers_context() -> None:
    portal = Portal("test-portal")
    try:
        token = scope.set("caller")
        try:
            assert portal.call(where()) == ("test-portal", "caller")
        finally:
            scope.reset(token)
    finally:
        portal.close()


def test_a_call_from_the_portals_own_loop_runs_aside_instead_of_deadlocking() -> None:
    portal = Portal("test-portal")

    async def nested() -> tuple[str, str]:
        return portal.call(where())  # a blocking call made by a coroutine the portal runs

    try:
        assert portal.call(nested()) == ("test-portal-nested", "none")
    finally:
        portal.close()


def test_errors_cross_the_portal_unchanged() -> None:
    portal = Portal()

    async def fail() -> None:
        raise KeyError("k")

    try:
        with pytest.raises(KeyError, match="k"):
            portal.call(fail())
    finally:
        portal.close()


class Counter:
    """A plan method and its two derived faces."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def _count(self, fail: bool) -> Plan[int]:
        """Doc of both faces."""
        first: int = yield Call(lambda: 1, _after(1))
        try:
            yield Call(_raise, _raise_async) if fail else Call(lambda: 0, _after(0))
        except KeyError:
            self.seen.append("handled inside the plan")
        return first + 1

    count = sync_face(_count)
    count_async = async_face(_count)


def _after(value: int) -> Any:
    async def awaiting() -> int:
        await asyncio.sleep(0)
        return value

    return awaiting


def _raise() -> None:
    raise KeyError("k")


async def _raise_async() -> None:
    raise KeyError("k")


def test_both_faces_of_a_plan_run_the_same_body() -> None:
    counter = Counter()
    assert counter.count(False) == asyncio.run(counter.count_async(False)) == 2
    assert counter.count(True) == asyncio.run(counter.count_async(True)) == 2
    assert counter.seen == ["handled inside the plan"] * 2
    assert (Counter.count.__name__, Counter.count_async.__qualname__) == ("count", "Counter.count_async")
    assert Counter.count_async.__doc__ == "Doc of both faces."


def test_a_wakeup_set_from_another_thread_ends_either_wait_early() -> None:
    for face in ("sync", "async"):
        wakeup = Wakeup()
        threading.Timer(0.05, wakeup.set).start()
        started = time.monotonic()
        if face == "sync":
            run_sync(_waits(wakeup))
        else:
            asyncio.run(run_async(_waits(wakeup)))
        assert time.monotonic() - started < 5, face


def _waits(wakeup: Wakeup) -> Plan[None]:
    yield wakeup.wait(30)


def test_a_wakeup_never_set_ends_either_wait_at_its_time_out_each_time() -> None:
    """The async face's time-out is a timer setting its event (not
    ``asyncio.timeout``): the wait ends once it has passed, and not before,
    the next wait waits its own time-out again, and a wait a set ended early
    leaves no timer live on the loop."""
    for face in ("sync", "async"):
        wakeup = Wakeup()

        def twice() -> Plan[None]:
            yield wakeup.wait(0.05)
            yield wakeup.wait(0.05)

        started = time.monotonic()
        if face == "sync":
            run_sync(twice())
        else:
            asyncio.run(run_async(twice()))
        assert 0.1 <= time.monotonic() - started < 5, face

    async def set_early() -> list[asyncio.TimerHandle]:
        wakeup = Wakeup()
        asyncio.get_running_loop().call_soon(wakeup.set)
        await run_async(_waits(wakeup))
        return [h for h in asyncio.get_running_loop()._scheduled if not h.cancelled()]  # type: ignore[attr-defined]

    assert asyncio.run(set_early()) == []
