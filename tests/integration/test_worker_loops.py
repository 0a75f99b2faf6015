"""A worker's background loops (leasing, heartbeat, periodic duties) outlive
any exception, and a loop that still ends makes the worker report not ready.

Faults enter through a real seam: a wrapper around the app's real store that
makes one operation of one loop raise, inside its transaction, an error no
code expects (not a ``StoreError``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

import stepstone as ss
from stepstone import metrics
from stepstone.store import faults
from stepstone.store.base import Store, Tx
from stepstone.worker import Worker

T = TypeVar("T")

# Operations of each loop, by the qualified name of the function the worker
# hands the store: a lease pass, a heartbeat, the timeouts duty.
LOOPS = {"lease": "Worker._lease.", "heartbeat": "Presence.beat.", "duties": "timeouts_op."}


class Injected(RuntimeError):
    """The unexpected error."""


class LoopKiller(BaseException):
    """What no ``except Exception`` catches."""


class FaultyStore:
    """The app's real store; the first operation whose qualified name contains
    ``marker`` raises ``fault`` (inside its transaction for an ``Exception``;
    before reaching the store for a ``BaseException``, which a store thread must
    not see). Counts the matching operations that ran after it."""

    def __init__(self, inner: Store, marker: str, fault: BaseException) -> None:
        self.inner = inner
        self.marker = marker
        self.fault: BaseException | None = fault
        self.passed_after = 0

    def _wrap(self, op: Callable[[Tx], T]) -> Callable[[Tx], T]:
        if self.marker not in faults.site(op):
            return op
        fault, self.fault = self.fault, None
        if fault is None:
            self.passed_after += 1
            return op
        if not isinstance(fault, Exception):
            raise fault

        def failing(tx: Tx) -> T:
            raise fault

        return failing

    async def transact(self, op: Callable[[Tx], T]) -> T:
        return await self.inner.transact(self._wrap(op))

    async def read(self, op: Callable[[Tx], T]) -> T:
        return await self.inner.read(self._wrap(op))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _app(make_app: Callable[..., ss.App], started: threading.Event, release: threading.Event) -> ss.App:
    """One run at a time; a run still queued 1.5 s after it was created (longer
    than a loop's pause after a fault) is cancelled by the timeouts duty."""
    app = make_app("loops")

    def step() -> str:
        started.set()
        return "done" if release.wait(10) else "stuck"

    @app.function(
        id="f",
        trigger=ss.on_event("go"),
        concurrency=ss.Concurrency(limit=1),
        timeouts=ss.Timeouts(start="1500ms"),
    )
    def f(ctx: ss.Context) -> str:
        return str(ctx.step.run("one", step))

    return app


def _worker(app: ss.App, store: FaultyStore) -> Worker:
    return Worker(
        store=store,
        registry=app.registry,
        clock=app.clock,
        app_name=app.name,
        lease_ttl=0.6,
        instance_id="faulty",
    )


async def _until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_a_loop_that_raises_once_keeps_working(
    make_app: Callable[..., ss.App], loop: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Each loop's first operation raises. Afterwards the worker still leases
    (the first run completes), the duties still run (the second run, queued
    behind the first past its start timeout, is cancelled) and the heartbeat
    still beats (the worker is ready)."""
    started, release = threading.Event(), threading.Event()
    app = _app(make_app, started, release)
    store = FaultyStore(app.store, LOOPS[loop], Injected(f"injected into the {loop}"))

    async def scenario() -> list[ss.Run]:
        worker = _worker(app, store)
        await worker.start()
        try:
            [first_event] = await app.send_async(ss.Event("go"))
            worker.notify()
            [first] = await app.runs.list_async(event_id=first_event)
            await _until(started.is_set, 10, "the first run's step")
            [second_event] = await app.send_async(ss.Event("go"))
            [second] = await app.runs.list_async(event_id=second_event)
            queued = await app.runs.wait_async(second.id, timeout="10s")  # its start timed out
            release.set()
            done = await app.runs.wait_async(first.id, timeout="10s")
            await _until(
                lambda: store.fault is None and store.passed_after >= 1,
                10,
                f"the {loop} to run again after the fault",
            )
            await _until(lambda: bool(worker.health()["ready"]), 5, "the worker to be ready")
            assert worker.dead_loops() == []
            return [done, queued]
        finally:
            release.set()
            await worker.stop(5)

    with caplog.at_level(logging.WARNING, logger="stepstone"):
        done, queued = asyncio.run(scenario())
    assert (done.status, done.output, queued.status) == ("completed", "done", "cancelled")
    assert f"injected into the {loop}" in caplog.text  # logged with its traceback
    assert "Traceback" in caplog.text


class NthFaultStore(FaultyStore):
    """Once armed, the ``position``-th operation (of any kind) raises; records
    the qualified names of the operations it sees."""

    def __init__(self, inner: Store, position: int) -> None:
        super().__init__(inner, "", Injected(f"injected into operation {position}"))
        self.position = position
        self.armed = False
        self.seen: list[str] = []

    def _wrap(self, op: Callable[[Tx], T]) -> Callable[[Tx], T]:
        if not self.armed:
            return op
        self.seen.append(faults.site(op))
        if len(self.seen) != self.position:
            return op
        fault, self.fault = self.fault, None
        assert isinstance(fault, Exception)

        def failing(tx: Tx) -> T:
            raise fault

        return failing


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("position", range(1, 13))
def test_any_one_operation_raising_stops_nothing(
    make_app: Callable[..., ss.App], position: int, caplog: pytest.LogCaptureFixture
) -> None:
    """The class, not three instances: whichever store operation the worker
    issues after it started raises an unexpected error (a duty, a lease pass, a
    heartbeat or its clock reading, a checkpoint), every run still completes, no
    loop dies, and the worker stays ready."""
    app = make_app("loops")

    @app.function(id="f", trigger=ss.on_event("go"))
    def f(ctx: ss.Context) -> str:
        return str(ctx.step.run("one", lambda: "a") + ctx.step.run("two", lambda: "b"))

    @app.function(id="tick", trigger=ss.on_cron("0 0 1 1 *"))  # its duties run; it never fires
    def tick(ctx: ss.Context) -> None:
        return None

    store = NthFaultStore(app.store, position)

    async def scenario() -> list[ss.Run]:
        worker = _worker(app, store)
        await worker.start()  # its registration is not a loop: a fault there fails start()
        store.armed = True
        try:
            ids = await app.send_async([ss.Event("go"), ss.Event("go")])
            worker.notify()
            runs = [r for i in ids for r in await app.runs.list_async(event_id=i)]
            done = [await app.runs.wait_async(r.id, timeout="15s") for r in runs]
            await _until(lambda: len(store.seen) > position + 2, 10, "more operations after the fault")
            await _until(lambda: bool(worker.health()["ready"]), 5, "the worker to be ready")
            assert worker.dead_loops() == []
            return done
        finally:
            await worker.stop(5)

    with caplog.at_level(logging.WARNING, logger="stepstone"):
        done = asyncio.run(scenario())
    assert [(r.status, r.output) for r in done] == [("completed", "ab")] * 2, store.seen
    assert store.fault is None and f"injected into operation {position}" in caplog.text, store.seen


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _readyz(port: int) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_a_dead_loop_makes_the_worker_not_ready(
    make_app: Callable[..., ss.App], caplog: pytest.LogCaptureFixture
) -> None:
    """The lease loop's task ends (a ``BaseException`` no handler catches): the
    heartbeat still beats, but the worker takes no work, so ``health()`` and the
    ``--metrics-port`` probe ``/readyz`` say not ready (503) and name the loop."""
    app = _app(make_app, threading.Event(), threading.Event())
    store = FaultyStore(app.store, LOOPS["lease"], LoopKiller("the lease loop dies"))
    store.fault = None  # (armed once started: a start waits for its first lease pass)
    port = _free_port()

    async def scenario() -> None:
        worker = _worker(app, store)
        metrics.serve("127.0.0.1", port, worker.health)
        await worker.start()
        try:
            assert worker.health()["ready"]
            store.fault = LoopKiller("the lease loop dies")
            worker.notify()  # its next pass
            await _until(lambda: store.fault is None, 10, "the lease loop to be killed")
            await _until(lambda: not worker.health()["ready"], 5, "the worker to say not ready")
            status, state = await asyncio.to_thread(_readyz, port)
            assert (status, state["ready"], state["draining"]) == (503, False, False)
            assert state["dead_loops"] == ["stepstone-worker-faulty"]
            assert state["seconds_since_heartbeat"] < 0.6  # the heartbeat alone is not readiness
        finally:
            await worker.stop(5)

    with caplog.at_level(logging.ERROR, logger="stepstone"):
        asyncio.run(scenario())
    assert "stepstone-worker-faulty ended" in caplog.text
