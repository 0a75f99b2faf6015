"""Group commit for PostgreSQL: writer threads draining one queue.

Each writer thread owns one connection. An idle writer waits for work, then
takes every operation queued (up to ``max_batch``) and runs them in one
transaction. New work goes to the writer that became idle *last*: its
connection and its server process are warm, so a sequence of commits stays on
one connection (alternating between two cost ~150 µs a commit here), and the
other writers only join in under load. Callers on
an event loop get an ``asyncio`` future resolved with
``loop.call_soon_threadsafe``, so the loop never waits on the network;
synchronous callers block on a ``concurrent.futures`` future.

A writer whose connection broke reconnects before its next batch, backing off
while the server stays away; meanwhile batches fail at once with
``StoreUnavailableError`` so that callers apply their own retry policy.

An operation chosen as a deadlock victim (or failing serialisation) was rolled
back alone, leaving nothing behind: it is queued again, up to
``MAX_ATTEMPTS`` times, before its caller hears of it.

A caller whose operations meet idle writers and an empty queue need not
hand them over (``run_here``): it borrows the connection of the writer that
went idle last, while that writer stays parked, and runs them on its own
thread, saving the two thread hand-offs (queue and wake-up, then the result
back). Whatever is queued meanwhile goes to the other writers, or waits for
the borrower to give the connection back. A blocking caller always tries.
An event loop's writes go through its ``LoopLane``: they gather until the
loop's next turn and are then handed over together, unless their submitter
awaits them while nothing else is ready on the loop (``store/eager.py``) and
no commit is in flight, when they run on the loop's thread. Borrowing for *every* commit of a loop
was measured to end group commit (each commit held the loop for a round
trip, so the next one found the queue empty again: 3.5 transactions per
queued run instead of 1.3, half the throughput); the idle-loop condition is
what keeps it under load.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from stepstone.errors import StoreError, StoreUnavailableError
from stepstone.store.batching import OpResult
from stepstone.store.eager import Eager, EagerTurns

log = logging.getLogger("stepstone.store.postgres")

Resolve = Callable[[bool, Any], None]
BatchRunner = Callable[[Any, list[Callable[[Any], Any]]], list[OpResult]]
MAX_ATTEMPTS = 5


class _Slot:
    """A writer's connection and wake-up. Only the writer's thread uses the
    connection, except while the slot is off the idle stack for ``run_here``."""

    __slots__ = ("conn", "wake")

    def __init__(self) -> None:
        self.conn: Any = None
        self.wake = threading.Event()


@dataclass(frozen=True)
class _Item:
    op: Callable[[Any], Any]
    resolve: Resolve
    attempt: int = 1


def _settle_async(future: asyncio.Future[Any], ok: bool, value: Any) -> None:
    if future.cancelled():
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


def async_resolver(loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any]) -> Resolve:
    def resolve(ok: bool, value: Any) -> None:
        if asyncio.events._get_running_loop() is loop:  # on the loop's own thread (run there)
            _settle_async(future, ok, value)
            return
        with contextlib.suppress(RuntimeError):  # the loop was closed meanwhile
            loop.call_soon_threadsafe(_settle_async, future, ok, value)

    return resolve


def sync_resolver(future: concurrent.futures.Future[Any]) -> Resolve:
    def resolve(ok: bool, value: Any) -> None:
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)

    return resolve


class Writers:
    """``count`` writer threads sharing one queue of operations."""

    def __init__(
        self,
        connect: Callable[[], Any],
        run: BatchRunner,
        backoff: Backoff,
        retryable: Callable[[BaseException], bool],
        *,
        count: int = 2,
        max_batch: int = 256,
        name: str = "stepstone-pg-writer",
    ) -> None:
        self.connect = connect
        self.run = run
        self.retryable = retryable
        self.max_batch = max_batch
        self.items: deque[_Item] = deque()
        self.idle: list[_Slot] = []  # a stack: the last writer to go idle is woken first
        self.lock = threading.Lock()
        self.closed = False
        self.borrowed = 0  # batches run on a caller's thread (``run_here``), for tests and benchmarks
        self._threads = [
            threading.Thread(target=self._loop, name=f"{name}-{i}", daemon=True) for i in range(count)
        ]
        self._backoff = backoff
        for thread in self._threads:
            thread.start()

    def put(self, op: Callable[[Any], Any], resolve: Resolve) -> None:
        self._put([_Item(op, resolve)])

    def put_many(self, ops: Sequence[tuple[Callable[[Any], Any], Resolve]]) -> None:
        """Queue several operations at once: one idle writer woken per
        ``max_batch`` of them, not one per operation."""
        self._put([_Item(op, resolve) for op, resolve in ops])

    def _put(self, items: list[_Item]) -> None:
        with self.lock:
            if not self.closed:
                self.items.extend(items)
                for _ in range(0, len(items), self.max_batch):
                    if self.idle:
                        self.idle.pop().wake.set()
                return
        for item in items:
            item.resolve(False, StoreError("postgresql: the store is closed"))

    def close(self, timeout: float = 10.0) -> None:
        """Finish what is queued, then stop the writers."""
        with self.lock:
            self.closed = True
            for slot in self.idle:
                slot.wake.set()
        for thread in self._threads:
            thread.join(timeout)
        with self.lock:
            left, self.items = list(self.items), deque()
        for item in left:  # only if a writer could not finish in time
            item.resolve(False, StoreError("postgresql: the store is closed"))

    def run_here(
        self, ops: Sequence[Callable[[Any], Any]], resolves: Sequence[Resolve], *, alone: bool = False
    ) -> bool:
        """Run ``ops`` together on the calling thread, on the connection of the
        writer that went idle last, and hand each outcome to its ``resolve``;
        ``False`` (nothing done) unless every queued operation is taken and a
        writer is idle (``alone``: every writer, no commit in flight). A
        deadlock victim is queued again for the writers."""
        with self.lock:
            if self.items or not self.idle or self.closed or (alone and not self._all_idle()):
                return False
            slot = self.idle.pop()  # parked until given back: no other user of its connection
            self.borrowed += 1
        try:
            slot.conn = self._usable(slot.conn)
            if slot.conn is None:
                outcomes: list[OpResult] = [(False, self._backoff.failure()) for _ in ops]
            else:
                outcomes = self.run(slot.conn, list(ops))
        except Exception as exc:  # noqa: BLE001 - a bug below: every caller hears of it, none hangs
            outcomes = [(False, exc) for _ in ops]
        finally:
            with self.lock:
                if self.items or self.closed:
                    slot.wake.set()  # its thread takes what was queued meanwhile (or stops)
                else:
                    self.idle.append(slot)
        if all(ok for ok, _ in outcomes):  # the common case: nothing to queue again
            for resolve, (_, value) in zip(resolves, outcomes, strict=True):
                resolve(True, value)
        else:
            self._settle([_Item(op, resolve) for op, resolve in zip(ops, resolves, strict=True)], outcomes)
        return True

    def idle_all(self) -> bool:
        """Whether no commit is in flight: every writer idle, nothing queued."""
        with self.lock:
            return not self.items and self._all_idle()

    def _all_idle(self) -> bool:
        return len(self.idle) == len(self._threads)

    def _settle(self, items: list[_Item], outcomes: list[OpResult]) -> None:
        """Hand each outcome to its caller; a deadlock victim (or a
        serialisation failure) is queued again, up to ``MAX_ATTEMPTS``."""
        for item, (ok, value) in zip(items, outcomes, strict=True):
            if not ok and item.attempt < MAX_ATTEMPTS and self.retryable(value):
                log.info("postgresql: retrying an operation (%s)", value)
                self._put([_Item(item.op, item.resolve, item.attempt + 1)])
            else:
                item.resolve(ok, value)

    # -- writer thread ----------------------------------------------------------------
    def _take(self, slot: _Slot) -> list[_Item] | None:
        """The next batch; ``None`` once closed and drained."""
        while True:
            with self.lock:
                if self.items:
                    count = min(len(self.items), self.max_batch)
                    return [self.items.popleft() for _ in range(count)]
                if self.closed:
                    return None
                slot.wake.clear()
                self.idle.append(slot)
            slot.wake.wait()

    def _loop(self) -> None:
        slot = _Slot()
        while True:
            batch = self._take(slot)
            if batch is None:
                break
            slot.conn = self._usable(slot.conn)
            if slot.conn is None:
                outcomes: list[OpResult] = [(False, self._backoff.failure()) for _ in batch]
            else:
                outcomes = self.run(slot.conn, [item.op for item in batch])
            self._settle(batch, outcomes)
        if slot.conn is not None:
            with contextlib.suppress(Exception):
                slot.conn.close()

    def _usable(self, conn: Any) -> Any:
        """The thread's connection, reconnected if it broke; ``None`` while backing off."""
        if conn is not None and not (conn.closed or conn.broken):
            return conn
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()
        return self._backoff.attempt(self.connect)


class LoopLane:
    """An event loop's writes: gathered until the loop's next turn, then handed
    to the writers together; or run on the loop's own thread, on an idle
    writer's connection, when their submitter awaits them while nothing else
    is ready on the loop (``store/eager.py``) and no commit is in flight (every
    writer idle): the loop, held for the round trip, then delays no other
    commit's outcome (measured with two worker processes: running beside a
    busy writer cost throughput although it saved CPU)."""

    def __init__(self, writers: Writers, loop: asyncio.AbstractEventLoop) -> None:
        self.writers = writers
        self.loop = loop
        self.turns = EagerTurns(loop)
        self.pending: list[tuple[Callable[[Any], Any], Eager]] = []
        self._flush: asyncio.Handle | None = None  # the scheduled hand-over of ``pending``

    def submit(self, op: Callable[[Any], Any]) -> asyncio.Future[Any]:
        future = Eager(self, self.loop)
        if not self.pending:
            self._flush = self.loop.call_soon(self.flush)
        self.pending.append((op, future))
        return future

    def flush(self) -> None:
        """The scheduled hand-over: run here if the loop has still nothing
        else to do (the loop turned: no cap), else hand over to the writers."""
        flush, self._flush = self._flush, None
        if not self.pending or (self.turns.alone(flush) and self._run_here()):
            return
        batch, self.pending = self.pending, []
        self.writers.put_many([(op, async_resolver(self.loop, future)) for op, future in batch])

    def commit_now(self) -> None:
        """Run what is pending here and now if the loop has nothing else ready."""
        if self._flush is not None and self.turns.may_commit(self._flush) and self._run_here():
            self.turns.took()
            if not self.pending and self._flush is not None:
                self._flush.cancel()
                self._flush = None

    def _run_here(self) -> bool:
        """Run what is pending on this thread if a writer is idle and nothing is
        queued. A user's SQL (``step.transaction``) never runs on the loop: it
        may take as long as its bound, and the heartbeat must not wait."""
        batch = self.pending
        ops: list[Callable[[Any], Any]] = []
        resolves: list[Resolve] = []
        for op, future in batch:
            if getattr(op, "user_sql", False):
                return False
            ops.append(op)
            resolves.append(functools.partial(_settle_async, future))  # resolved on this thread
        if not self.writers.run_here(ops, resolves, alone=True):
            return False  # a commit is in flight: its outcome must not wait for this one
        self.pending = self.pending[len(batch) :]
        return True


class Backoff:
    """Reconnection attempts shared by a store's connections: after a failure,
    none before the delay has passed (50 ms doubling to 1 s); meanwhile callers
    fail at once with the last error."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.delay = 0.0
        self.not_before = 0.0
        self.error: StoreUnavailableError = StoreUnavailableError("postgresql: not connected")

    def waiting(self) -> bool:
        """Whether the server was unreachable and the next attempt is not due yet."""
        with self.lock:
            return time.monotonic() < self.not_before

    def failure(self) -> StoreUnavailableError:
        """A fresh error for one caller, caused by the last connection failure."""
        err = StoreUnavailableError(str(self.error))
        err.__cause__ = self.error.__cause__
        return err

    def attempt(self, connect: Callable[[], Any]) -> Any:
        with self.lock:
            if time.monotonic() < self.not_before:
                return None
        try:
            conn = connect()
        except StoreUnavailableError as exc:
            with self.lock:
                self.error = exc
                self.delay = min(max(self.delay * 2, 0.05), 1.0)
                self.not_before = time.monotonic() + self.delay
            log.warning("postgresql: cannot connect (%s); retrying in %.2fs", exc, self.delay)
            return None
        with self.lock:
            self.delay = 0.0
        return conn
