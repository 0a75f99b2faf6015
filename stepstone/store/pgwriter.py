"""Group commit for PostgreSQL: writer threads draining one queue.

Each writer thread owns one connection. It blocks for the first queued
operation, takes every operation queued behind it (up to ``max_batch``) and
runs them in one transaction (``run_batch``: each in a savepoint). Callers on
an event loop get an ``asyncio`` future resolved with
``loop.call_soon_threadsafe``, so the loop never waits on the network;
synchronous callers block on a ``concurrent.futures`` future.

A writer whose connection broke reconnects before its next batch, backing off
while the server stays away; meanwhile batches fail at once with
``StoreUnavailableError`` so that callers apply their own retry policy.

An operation chosen as a deadlock victim (or failing serialisation) was rolled
back alone, leaving nothing behind: it is queued again, up to
``MAX_ATTEMPTS`` times, before its caller hears of it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stepstone.errors import StoreError, StoreUnavailableError
from stepstone.store.batching import Outcome

log = logging.getLogger("stepstone.store.postgres")

Resolve = Callable[[bool, Any], None]
BatchRunner = Callable[[Any, list[Callable[[Any], Any]]], list[Outcome]]
MAX_ATTEMPTS = 5


@dataclass(frozen=True)
class _Item:
    op: Callable[[Any], Any]
    resolve: Resolve
    attempt: int = 1


_STOP = object()


def _settle_async(future: asyncio.Future[Any], ok: bool, value: Any) -> None:
    if future.cancelled():
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


def async_resolver(loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any]) -> Resolve:
    def resolve(ok: bool, value: Any) -> None:
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

    def __init__(self, connect: Callable[[], Any], run: BatchRunner, backoff: Backoff,
                 retryable: Callable[[BaseException], bool], *, count: int = 2, max_batch: int = 256,
                 name: str = "stepstone-pg-writer") -> None:
        self.connect = connect
        self.run = run
        self.retryable = retryable
        self.max_batch = max_batch
        self.queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.closed = False
        self._threads = [
            threading.Thread(target=self._loop, name=f"{name}-{i}", daemon=True) for i in range(count)
        ]
        self._backoff = backoff
        for thread in self._threads:
            thread.start()

    def put(self, op: Callable[[Any], Any], resolve: Resolve) -> None:
        if self.closed:
            resolve(False, StoreError("postgresql: the store is closed"))
            return
        self.queue.put(_Item(op, resolve))

    def close(self, timeout: float = 10.0) -> None:
        self.closed = True
        for _ in self._threads:
            self.queue.put(_STOP)
        for thread in self._threads:
            thread.join(timeout)
        while True:  # anything queued after the stop markers
            try:
                item = self.queue.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, _Item):
                item.resolve(False, StoreError("postgresql: the store is closed"))

    # -- writer thread ----------------------------------------------------------------
    def _take(self) -> list[_Item] | None:
        first = self.queue.get()
        if first is _STOP:
            return None
        batch = [first]
        while len(batch) < self.max_batch:
            try:
                item = self.queue.get_nowait()
            except queue.Empty:
                break
            if item is _STOP:
                self.queue.put(_STOP)  # leave it for the next round: finish this batch first
                break
            batch.append(item)
        return batch

    def _loop(self) -> None:
        conn: Any = None
        while True:
            batch = self._take()
            if batch is None:
                break
            conn = self._usable(conn)
            if conn is None:
                outcomes: list[Outcome] = [(False, self._backoff.failure()) for _ in batch]
            else:
                outcomes = self.run(conn, [item.op for item in batch])
            for item, (ok, value) in zip(batch, outcomes, strict=True):
                if not ok and item.attempt < MAX_ATTEMPTS and self.retryable(value):
                    log.info("postgresql: retrying an operation (%s)", value)
                    self.queue.put(_Item(item.op, item.resolve, item.attempt + 1))
                else:
                    item.resolve(ok, value)
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def _usable(self, conn: Any) -> Any:
        """The thread's connection, reconnected if it broke; ``None`` while backing off."""
        if conn is not None and not (conn.closed or conn.broken):
            return conn
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()
        return self._backoff.attempt(self.connect)


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
