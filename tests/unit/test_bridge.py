"""``bridge.Portal``: the one way synchronous code runs a coroutine."""

from __future__ import annotations

import contextvars
import threading

import pytest

from stepstone.bridge import Portal

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
