"""The embedded SQLite store: WAL, ``BEGIN IMMEDIATE``, busy timeout.

Writes submitted from an event loop are group-committed *on that loop's thread*:
the first submission schedules a flush with ``call_soon``; everything submitted
before the flush runs shares its transaction. SQLite writes are short, so
running them inline beats handing them to a thread (measured: 27 µs against
141 µs per sequential write). Several processes may share one file.

URL: ``sqlite:///relative.db`` or ``sqlite:////absolute.db`` with options
``synchronous=full|normal`` (default ``full``: a committed step survives power
loss; ``normal`` survives a process crash but may lose the last commits on
power loss) and ``busy_timeout`` (milliseconds, default 10000). At ``full``, a
lease pass's commit alone skips the fsync (``batching.Unsynced``): the next
synced commit puts it on disk, and losing it loses nothing a step relied on.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

from stepstone.errors import ConfigError, StoreError, StoreUnavailableError
from stepstone.store import faults
from stepstone.store.base import Tx
from stepstone.store.batching import OpResult, run_batch, run_together, unsynced
from stepstone.store.eager import Eager, EagerTurns
from stepstone.store.migrate import CREATE_LEDGER, migration_files
from stepstone.store.rows import RunStatus, StepKind, StepStatus, WaitKind
from stepstone.store.sqlbase import Dialect
from stepstone.store.sqltx import SqlTx
from stepstone.store.viewrows import JobStatus

# The domain's enums bind as their values; registered, sqlite3 finds the adapter
# at once instead of probing each member for a conversion protocol.
for _words in (RunStatus, StepStatus, StepKind, WaitKind, JobStatus):
    sqlite3.register_adapter(_words, str)

T = TypeVar("T")

DIALECT = Dialect("sqlite", output_bytes="length(CAST(output AS BLOB))")
_SYNCED = ("FULL", "EXTRA")  # the settings at which a WAL commit waits for its fsync


def translate(exc: BaseException) -> BaseException:
    """Driver errors become Stepstone errors (``__cause__`` keeps the original)."""
    if isinstance(exc, sqlite3.OperationalError):
        message = str(exc)
        kind = StoreUnavailableError if ("locked" in message or "busy" in message) else StoreError
        err = kind(f"sqlite: {message}")
    elif isinstance(exc, sqlite3.Error):
        err = StoreError(f"sqlite: {exc}")
    else:
        return exc
    err.__cause__ = exc
    return err


class _Lane:
    """Group commit on one event loop.

    The first write submitted schedules a flush with ``call_soon``; every write
    submitted before it runs shares its transaction. A submitter that awaits
    its write while the loop has nothing else ready to run (only that flush)
    commits the batch at once, in its own turn (``commit_now``): the flush
    would have been the next callback and would have carried the same writes,
    so this only saves the turns of the loop that running the flush and then
    waking the submitter cost (each commit of a sequential run). Writes
    awaited otherwise (``asyncio.gather``) keep the scheduled flush. Early
    commits in a row stop after ``EAGER_RUN``; the rule is ``store/eager.py``'s,
    shared with PostgreSQL's event-loop lane.
    """

    EAGER_RUN = EagerTurns.EAGER_RUN

    def __init__(self, store: SqliteStore, loop: asyncio.AbstractEventLoop) -> None:
        self.store = store
        self.conn = store.connect()
        self.loop = loop
        self.pending: list[tuple[Callable[[Tx], Any], asyncio.Future[Any]]] = []
        self.turns = EagerTurns(loop)
        self._flush: asyncio.Handle | None = None  # the scheduled flush of ``pending``
        self._flushing = False

    def submit(self, op: Callable[[Tx], Any]) -> asyncio.Future[Any]:
        future = Eager(self, self.loop)
        if not self.pending:
            self._flush = self.loop.call_soon(self.flush)
        self.pending.append((op, future))
        return future

    def commit_now(self) -> None:
        """Flush now if the scheduled flush is the only callback ready (see the class)."""
        flush = self._flush
        if flush is None or self._flushing or not self.turns.may_commit(flush):
            return
        flush.cancel()
        self.turns.took()
        self.flush()

    def flush(self) -> None:
        batch, self.pending, self._flush = self.pending, [], None
        if not batch:
            return
        self._flushing = True
        try:
            outcomes = self.store.write_batch(self.conn, [op for op, _ in batch])
        finally:
            self._flushing = False
        for (_, future), (ok, value) in zip(batch, outcomes, strict=True):
            if future.cancelled():
                continue
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)


def _make_tx(conn: Any) -> Tx:
    return SqlTx(conn, DIALECT)


class SqliteStore:
    dialect = "sqlite"
    wakes_own_subscribers = False

    def __init__(self, path: str, *, synchronous: str = "full", busy_timeout_ms: int = 10000) -> None:
        if synchronous.lower() not in ("full", "normal", "extra", "off"):
            raise ConfigError("database_url", f"synchronous must be full or normal, not {synchronous!r}")
        self.path = path
        self.synchronous = synchronous.upper()
        self.busy_timeout_ms = busy_timeout_ms
        self._lanes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Lane] = weakref.WeakKeyDictionary()
        # The lane last used (most calls come from one loop), held weakly as the lanes are.
        self._last_lane: Callable[[], _Lane | None] = _no_lane
        self._local = threading.local()
        self._watch: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self.commits = 0  # write transactions that changed data (for tests and benchmarks)
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)

    @classmethod
    def from_url(cls, url: str) -> SqliteStore:
        parts = urlsplit(url)
        path = parts.path
        if url.startswith("sqlite:///"):
            path = url[len("sqlite:///") :].split("?", 1)[0]
        if not path:
            raise ConfigError("database_url", f"no file path in {url!r}")
        options = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        unknown = set(options) - {"synchronous", "busy_timeout"}
        if unknown:
            raise ConfigError("database_url", f"unknown SQLite option(s): {', '.join(sorted(unknown))}")
        try:
            busy = int(options.get("busy_timeout", "10000"))
        except ValueError as exc:
            raise ConfigError("database_url", "busy_timeout must be milliseconds") from exc
        return cls(path, synchronous=options.get("synchronous", "full"), busy_timeout_ms=busy)

    # -- connections --------------------------------------------------------------
    def connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path,
            isolation_level=None,
            check_same_thread=False,
            timeout=self.busy_timeout_ms / 1000,
            cached_statements=256,
        )
        conn.row_factory = sqlite3.Row
        conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_ms)}")
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
        if mode != "wal":
            self._retry_locked(lambda: conn.execute("PRAGMA journal_mode = WAL"))
        conn.execute(f"PRAGMA synchronous = {self.synchronous}")
        return conn

    def _retry_locked(self, fn: Callable[[], Any]) -> Any:
        deadline = time.monotonic() + self.busy_timeout_ms / 1000
        while True:
            try:
                return fn()
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise translate(exc) from exc
                time.sleep(0.01)

    def _thread_conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self.connect()
        return conn

    def _lane(self) -> _Lane:
        loop = asyncio.get_running_loop()
        lane = self._last_lane()
        if lane is not None and lane.loop is loop:
            return lane
        lane = self._lanes.get(loop)
        if lane is None:
            lane = self._lanes[loop] = _Lane(self, loop)
        self._last_lane = weakref.ref(lane)
        return lane

    # -- Store protocol ----------------------------------------------------------------
    async def transact(self, op: Callable[[Tx], T]) -> T:
        result: T = await self._lane().submit(op)
        return result

    def submit(self, op: Callable[[Tx], T]) -> asyncio.Future[T]:
        return self._lane().submit(op)

    def write_batch(self, conn: sqlite3.Connection, ops: list[Callable[[Tx], Any]]) -> list[OpResult]:
        """One write transaction for ``ops``; counts commits that changed data."""
        if faults.active is not None:  # tests only (store/faults.py)
            return faults.active.run(ops, lambda batch: self._write(conn, batch))
        return self._write(conn, ops)

    def _write(self, conn: sqlite3.Connection, ops: list[Callable[[Tx], Any]]) -> list[OpResult]:
        """The batch without savepoints unless an operation fails (``run_together``);
        a batch of lease passes alone (``batching.Unsynced``) without the fsync."""
        before = conn.total_changes
        relaxed = self.synchronous in _SYNCED and unsynced(ops)
        if relaxed:
            conn.execute("PRAGMA synchronous = NORMAL")
        try:
            outcomes = run_together(conn, ops, _make_tx, "BEGIN IMMEDIATE", translate)
        finally:
            if relaxed:
                conn.execute(f"PRAGMA synchronous = {self.synchronous}")
        if conn.total_changes != before:
            self.commits += 1
        return outcomes

    def transact_sync(self, op: Callable[[Tx], T]) -> T:
        [(ok, value)] = self.write_batch(self._thread_conn(), [op])
        if not ok:
            raise value
        result: T = value
        return result

    async def read(self, op: Callable[[Tx], T]) -> T:
        return self._read(self._lane().conn, op)

    def read_sync(self, op: Callable[[Tx], T]) -> T:
        return self._read(self._thread_conn(), op)

    def _read(self, conn: sqlite3.Connection, op: Callable[[Tx], T]) -> T:
        [(ok, value)] = run_batch(conn, [op], _make_tx, "BEGIN", translate)
        if not ok:
            raise value
        result: T = value
        return result

    def change_token(self) -> Any:
        with self._lock:
            if self._watch is None:
                self._watch = self.connect()
            return self._watch.execute("PRAGMA data_version").fetchone()[0]

    def subscribe(self, callback: Callable[[], Any]) -> Callable[[], None]:
        """SQLite cannot push wake-ups; workers poll ``change_token`` instead."""
        return _no_op

    def migrate(self) -> list[str]:
        conn = self.connect()
        applied: list[str] = []
        try:
            conn.execute(CREATE_LEDGER)
            for name, sql in migration_files("sqlite"):
                self._retry_locked(lambda: conn.execute("BEGIN IMMEDIATE"))
                done = conn.execute("SELECT 1 FROM schema_migrations WHERE name = ?", (name,)).fetchone()
                if done:
                    conn.execute("COMMIT")
                    continue
                try:
                    for statement in _statements(sql):
                        conn.execute(statement)
                    conn.execute(
                        "INSERT INTO schema_migrations (name, applied_at) VALUES (?, ?)",
                        (name, time.time()),
                    )
                    conn.execute("COMMIT")
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                applied.append(name)
        except sqlite3.Error as exc:
            raise translate(exc) from exc
        finally:
            conn.close()
        return applied

    def close(self) -> None:
        for loop, lane in list(self._lanes.items()):
            if loop.is_running() and not _is_current(loop):
                continue  # still in use by another thread's loop: freed with it
            lane.conn.close()
            del self._lanes[loop]
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
        if self._watch is not None:
            self._watch.close()
            self._watch = None


def _no_op() -> None:
    return None


def _no_lane() -> _Lane | None:
    return None


def _is_current(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def _statements(sql: str) -> list[str]:
    """Split a migration into statements (no semicolons inside our literals)."""
    lines = [line for line in sql.splitlines() if not line.strip().startswith("--")]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]
