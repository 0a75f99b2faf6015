"""LISTEN/NOTIFY wake-ups for PostgreSQL workers.

One thread per store holds a connection that LISTENs on the work channel and
calls every subscriber (from that thread) on each notification. Transactions
that make work available (a new run, a parked or released run, a finished
run) issue ``NOTIFY`` before they commit, so an idle worker on any machine
wakes at once.

Notifications are a hint, not a log: any may be lost while the connection is
down. After every (re)connection the listener calls the subscribers once, and
workers keep their ``max_idle_sleep`` safety net.

The store's own commits wake its subscribers at once, from the committing
thread (``wake_local``), so the echo of their ``NOTIFY`` is dropped: a
notification whose sender (``Notify.pid``) is one of the store's own live
connections (``own``) wakes no one. Without this, every run's send and end
woke its worker a second time, for an empty lease pass of four round trips
(1.3 per run). Only a live connection's pid counts as own: a notification
from a connection since closed (its commit's outcome unknown to the store)
still wakes, as does any other process's or store's. (Through a session
pooler that reports its own backend pids, echoes simply wake as before.)
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import selectors
import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import psycopg

from stepstone.errors import StoreError
from stepstone.store.pgerrors import translate

log = logging.getLogger("stepstone.store.postgres")

PING_EVERY = 10.0  # seconds of silence before checking that the connection is alive


class Listener:
    def __init__(self, connect: Callable[[], Any], channel: str) -> None:
        self.connect = connect
        self.channel = channel
        self.token = 0  # bumped on every notification and reconnection
        self.connected = threading.Event()
        self._subscribers: dict[int, Callable[[], Any]] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._stop_r, self._stop_w = os.pipe()  # wakes the thread's select() on close
        self._thread: threading.Thread | None = None
        self._own: weakref.WeakSet[Any] = weakref.WeakSet()  # connections whose NOTIFYs are echoes

    def own(self, conn: Any) -> Any:
        """Count ``conn``'s notifications as this store's own (their commits call
        ``wake_local``); returns it."""
        with self._lock:
            self._own.add(conn)
        return conn

    def wake_local(self) -> None:
        """Wake the subscribers now: one of the store's own commits made work
        available (its ``NOTIFY``'s echo will be dropped)."""
        self._fire()

    def _foreign(self, notifies: Iterable[Any]) -> bool:
        """Whether any notification came from a connection other than the
        store's own live ones."""
        with self._lock:
            own = {conn.info.backend_pid for conn in self._own if not conn.closed}
        return any(note.pid not in own for note in notifies)

    def start(self) -> None:
        with self._lock:
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._loop, name="stepstone-pg-listen", daemon=True)
                self._thread.start()

    def subscribe(self, callback: Callable[[], Any]) -> Callable[[], None]:
        key = next(self._ids)
        with self._lock:
            self._subscribers[key] = callback
        self.start()

        def unsubscribe() -> None:
            with self._lock:
                self._subscribers.pop(key, None)

        return unsubscribe

    def close(self, timeout: float = 5.0) -> None:
        with self._lock:
            if self._stop.is_set():
                return
            self._stop.set()
            thread = self._thread
        self._wake_and_release(thread, timeout)

    def _wake_and_release(self, thread: threading.Thread | None, timeout: float) -> None:
        """Wake the thread (stop already set) and free the pipe once it ended."""
        os.write(self._stop_w, b"x")
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                return  # still selecting on the pipe: leave it open rather than close it under it
        # Closed here, after the thread ended: had the thread closed it on its
        # way out (its select may time out and see the stop flag before this
        # write), the write above could hit a closed or reused descriptor.
        self._close_pipe()

    def _close_pipe(self) -> None:
        os.close(self._stop_r)
        os.close(self._stop_w)

    # -- listener thread ----------------------------------------------------------------
    def _fire(self) -> None:
        with self._lock:
            self.token += 1
            callbacks = list(self._subscribers.values())
        for callback in callbacks:
            try:
                callback()
            except Exception:
                log.exception("postgresql: a wake-up subscriber failed")

    def _loop(self) -> None:
        self._reconnecting()

    def _reconnecting(self) -> None:
        delay = 0.05
        while not self._stop.is_set():
            try:
                self._listen()
                delay = 0.05
            except StoreError as exc:
                self.connected.clear()
                if self._stop.is_set():
                    break
                log.warning("postgresql: LISTEN connection lost (%s); reconnecting in %.2fs", exc, delay)
                with selectors.DefaultSelector() as pause:  # the stop pipe cuts the pause short
                    pause.register(self._stop_r, selectors.EVENT_READ)
                    pause.select(delay)
                delay = min(delay * 2, 2.0)

    def _listen(self) -> None:
        conn = self.connect()
        try:
            conn.execute(f"LISTEN {self.channel}")
            self.connected.set()
            self._fire()  # notifications may have been missed while disconnected
            with selectors.DefaultSelector() as watch:  # epoll: any descriptor number
                watch.register(conn.fileno(), selectors.EVENT_READ, "conn")
                watch.register(self._stop_r, selectors.EVENT_READ, "stop")
                while not self._stop.is_set():
                    ready = {key.data for key, _ in watch.select(PING_EVERY)}
                    if "stop" in ready:
                        break
                    if not ready:  # silence: make sure the connection is still alive
                        conn.execute("SELECT 1")
                    if self._foreign(conn.notifies(timeout=0)):
                        self._fire()  # one wake-up for every notification read at once
        except psycopg.Error as exc:
            raise translate(exc) from exc
        finally:
            with contextlib.suppress(Exception):
                conn.close()
