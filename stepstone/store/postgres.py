"""The PostgreSQL store: many worker processes on many machines, one database.

Writes go through ``Writers`` (``pgwriter.py``): a few threads, each owning a
connection, group-commit whatever is queued (one pipelined transaction, run
again with a savepoint per operation if one fails), so an event loop never
waits on the network. Reads run on a small ``psycopg_pool`` pool in a
consistent read-only snapshot. Leasing uses ``FOR UPDATE SKIP LOCKED``; a
transaction that makes work available issues ``NOTIFY`` before it commits and
``pglisten.Listener`` wakes the idle workers.

URL: ``postgresql://user:password@host:port/database?option=value``. Stepstone
options, removed before the URL reaches libpq: ``writers`` (writer
connections, default 2) and ``readers`` (read pool size, default 4). Every
other option is libpq's (``sslmode``, ``connect_timeout`` (default 5),
``application_name`` (default ``stepstone``), ...).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from stepstone.errors import ConfigError, StoreError, StoreUnavailableError
from stepstone.store import faults
from stepstone.store.base import Tx
from stepstone.store.batching import OpResult, run_batch
from stepstone.store.migrate import migration_files
from stepstone.store.pgerrors import is_conflict, is_end_not_alone, translate
from stepstone.store.pglisten import Listener
from stepstone.store.pgpipeline import run_alone, run_together
from stepstone.store.pgwire import Wire
from stepstone.store.pgwriter import Backoff, LoopLane, Writers, async_resolver, sync_resolver
from stepstone.store.sqlbase import Dialect
from stepstone.store.sqljournal import EndGuesses
from stepstone.store.sqltx import SqlTx

T = TypeVar("T")

DIALECT = Dialect(
    "postgres",
    lock="FOR UPDATE SKIP LOCKED",
    lock_wait="FOR UPDATE",
    fence_raises=True,
    write_ctes=True,
    pipelined=True,
    statement_timeout=True,
    pyformat=True,
    key_lock="SELECT pg_advisory_xact_lock(hashtextextended(%(key)s, 0))",
    key_try_lock="SELECT pg_try_advisory_xact_lock(hashtextextended(%(key)s, 0)) AS ok",
    server_clock="SELECT extract(epoch FROM clock_timestamp())::float8 AS now",
)
CHANNEL = "stepstone_work"
READ_BEGIN = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
READ_WAIT = 2.0  # seconds a read waits for a pooled connection
LOOP_READ_WAIT = 0.005  # the same on an event loop's thread (then the read goes to a reader thread)
MIGRATION_LOCK = 0x5354_4550_5354  # pg_advisory_xact_lock key shared by every migrator
LEDGER = (
    "CREATE TABLE IF NOT EXISTS schema_migrations "
    "(name TEXT PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)"
)
DEFAULTS = {
    "connect_timeout": "5",
    "application_name": "stepstone",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
}
OWN_OPTIONS = ("writers", "readers")

# Statements that make queue work available or due sooner: a new item, a parked,
# woken, moved, released or finished run (a freed concurrency slot), a lowered
# partition hint. A transaction that ran one of them (changing a row) notifies
# the listening workers. Leasing and heartbeats never do.
WAKE_QUERIES = frozenset(
    {
        "insert_queue_item",
        "record_event_started",  # (with its queue item, taken or not: ``taken_here`` decides)
        "fence_park_wake",
        "wake_run",
        "move_item",
        "release_leases",
        "fence_delete",
        "end_held_run",
        "park_held_run",
        "delete_queue_item",
        "lower_partition",
        "wake_ckey",
        "wake_function_partitions",
        "wake_owner_partitions",
        "settle_partition_due",
    }
)
# Of those, the ends of a held run: the slot they free is their own worker's,
# which leases again itself when its last pass filled its slots
# (``Worker._invoke``), and a concurrency key they free wakes through
# ``wake_ckey``. So they notify other processes but wake no local worker: that
# wake-up was an empty lease pass after every run (four round trips). And a
# lease pass that leaves a partition due (its own worker is full): another
# process's pass skipped that partition while this one held its row, found
# nothing else, and waits for a wake-up (or ``RECHECK``) with free slots; its
# own worker leases again at its runs' ends (``Worker._lease_after``).
REMOTE_WAKE_QUERIES = frozenset({"fence_delete", "end_held_run", "settle_partition_due"})
_WRITE_VERBS = ("INSERT", "UPDATE", "DELETE")
# Statements that write through a data-modifying CTE under a SELECT (its status
# names no write): one that returned a row counts as a change.
# (record_event_started returns a row also when it wrote nothing for a wait key:
# a send that is then sent again the usual way counts twice.)
CTE_WRITES = frozenset({"fenced_step", "park_held_run", "end_alone", "record_event_started"})


class PgTx(SqlTx):
    """``SqlTx`` that notes whether its transaction may have made work available
    (the store then issues ``NOTIFY``) and keeps its results, to tell once the
    batch is over whether it changed data. Reading a result here would cost a
    round trip per statement (see ``pgpipeline``)."""

    def __init__(
        self, conn: Any, dialect: Dialect, guesses: EndGuesses | None = None, *, counting: bool = False
    ) -> None:
        super().__init__(conn, dialect)
        self.counting = counting  # keep results for ``changed`` (only while the store counts)
        self.end_guesses = guesses  # learnt from every end read
        self.guessed = [] if isinstance(conn, Wire) else None  # pipelined: an end may go unread
        self.wake = False  # NOTIFY at commit: an operation made work available it did not take
        self.wake_local = False  # and wake this process's workers (``WAKE_QUERIES`` but ends)
        self.taken: list[str] = []  # runs queued and taken here: NOTIFY at commit if one was not
        self.untaken: Any = None  # that conditional NOTIFY's result (``notify_untaken``)
        self._op_woke = self._op_local = False  # the running operation's (``run``)
        self._op_took: Sequence[str] | None = None
        self.results: list[Any] = []  # results (``pgwire.Result`` or driver cursors)
        self.cte_writes: list[Any] = []  # those of CTE_WRITES

    def _exec(
        self,
        name: str,
        params: Mapping[str, Any] | None = None,
        lists: Mapping[str, Sequence[Any]] | None = None,
    ) -> Any:
        result = super()._exec(name, params, lists)
        if self.counting:
            self.results.append(result)
            if name in CTE_WRITES:
                self.cte_writes.append(result)
        if name in WAKE_QUERIES:
            self._op_woke = True  # if no row changed after all, an idle worker leases in vain once
            self._op_local = self._op_local or name not in REMOTE_WAKE_QUERIES
        return result

    def taken_here(self, run_ids: Sequence[str]) -> None:
        self._op_took = run_ids

    def run(self, op: Callable[[Any], T]) -> T:
        """``op`` in this transaction. What it made available and took itself
        (a send's direct start: ``taken_here``) needs no ``NOTIFY``: another
        process's worker woken for it would only lease in vain. Its takes'
        results are not read before the ``COMMIT``, so the ``NOTIFY`` is sent
        conditional on one of its runs left untaken (``notify_untaken``). A
        group commit's other operations still notify for their own work."""
        self._op_woke = self._op_local = False
        self._op_took = None
        value = op(self)
        if self._op_took is None:
            self.wake = self.wake or self._op_woke
            self.wake_local = self.wake_local or self._op_local
        elif self._op_woke:
            self.taken += self._op_took
        return value

    def notify(self) -> None:
        """Before the ``COMMIT``: ``NOTIFY`` for the work made available and not
        taken here; for runs queued and taken here (direct starts), only if
        one of them is left untaken (the same notification twice in one
        transaction is delivered once)."""
        if self.wake:
            self.conn.execute(f"NOTIFY {CHANNEL}")
        if self.taken:
            self.untaken = self._exec("notify_untaken", {"channel": CHANNEL}, {"run_ids": self.taken})

    def wakes_here(self) -> bool:
        """After the batch: whether this process's workers are to be woken: for
        work made available and not taken here, or taken here but for a run
        left untaken after all."""
        if self.wake_local or self.untaken is None:
            return self.wake_local
        try:
            return bool(self.untaken.rowcount > 0)
        except psycopg.Error:  # the transaction failed: wake rather than miss
            return True

    def changed(self) -> bool:
        """Whether a statement wrote a row (call after the batch: no waiting)."""
        for cursor in self.results:
            if cursor.rowcount > 0 and (cursor.statusmessage or "").startswith(_WRITE_VERBS):
                return True
        return any(cursor.rowcount > 0 for cursor in self.cte_writes)


def _scoped(op: Callable[[Any], T]) -> Callable[[PgTx], T]:
    """``op`` run through ``PgTx.run`` (what it woke and took is its own; a
    ``partial`` adds no Python call to each operation, a lambda would)."""
    return functools.partial(PgTx.run, op=op)


def _notify_if_woken(tx: PgTx) -> None:
    tx.notify()


def parse_url(url: str) -> tuple[str, dict[str, int]]:
    """Split a ``postgresql://`` URL into a libpq conninfo and Stepstone's options."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    options: dict[str, int] = {}
    for key, value in query:
        if key in OWN_OPTIONS:
            if not value.isdigit() or not 1 <= int(value) <= 64:
                raise ConfigError("database_url", f"{key} must be an integer from 1 to 64")
            options[key] = int(value)
    rest = urlencode([(k, v) for k, v in query if k not in OWN_OPTIONS])
    try:
        params = conninfo_to_dict(urlunsplit(parts._replace(query=rest)))
    except psycopg.ProgrammingError as exc:
        raise ConfigError("database_url", f"invalid PostgreSQL URL: {exc}") from exc
    for key, value in DEFAULTS.items():
        params.setdefault(key, value)
    return make_conninfo("", **params), options


class PostgresStore:
    dialect = "postgres"
    wakes_own_subscribers = True  # at commit (``_write``); the listener drops the echoes

    def __init__(self, conninfo: str, *, writers: int = 2, readers: int = 4) -> None:
        self.conninfo = conninfo
        self.readers = readers
        self._commits = 0  # write transactions that changed data, once counting (``commits``)
        self._counting = False
        self.reads_here = 0  # event loops' reads run on the loop's thread (for tests and benchmarks)
        self._lock = threading.Lock()
        self._closed = False
        self._pool: ConnectionPool[Any] | None = None
        self._read_threads: ThreadPoolExecutor | None = None
        self._backoff = Backoff()
        self._listener = Listener(self._connect, CHANNEL)
        self._writers = Writers(
            self._connect_writer, self._write_batch, self._backoff, is_conflict, count=writers
        )
        self._lanes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopLane]
        self._lanes = weakref.WeakKeyDictionary()  # an event loop's writes (``submit``)
        self._end_guesses = EndGuesses()  # which functions' ends go unread (``sqljournal``)

    @property
    def commits(self) -> int:
        """Write transactions that changed data since the first time this was
        read (for tests and benchmarks: read it before and after). Telling
        whether a transaction changed data reads every statement's status
        (~10 µs a transaction), so a store nobody asks does not."""
        self._counting = True
        return self._commits

    @classmethod
    def from_url(cls, url: str) -> PostgresStore:
        conninfo, options = parse_url(url)
        return cls(conninfo, **options)

    # -- connections ---------------------------------------------------------------
    def _connect(self) -> Any:
        try:
            return psycopg.connect(self.conninfo, autocommit=True, row_factory=dict_row)
        except psycopg.Error as exc:
            raise translate(exc) from exc

    def _connect_writer(self) -> Any:
        """A writer's connection: its commits wake local subscribers themselves
        (``_write``), so the listener drops its NOTIFYs' echoes."""
        return self._listener.own(self._connect())

    def _pool_ready(self) -> ConnectionPool[Any]:
        with self._lock:
            if self._closed:
                raise StoreError("postgresql: the store is closed")
            if self._pool is None:
                self._pool = ConnectionPool(
                    self.conninfo,
                    kwargs={"autocommit": True, "row_factory": dict_row},
                    min_size=1,
                    max_size=self.readers,
                    open=True,
                    timeout=READ_WAIT,
                    name="stepstone-read",
                )
            return self._pool

    # -- writes ----------------------------------------------------------------------
    def _write_batch(self, conn: Any, ops: list[Callable[[Any], Any]]) -> list[OpResult]:
        """One pipelined transaction for ``ops`` (``pgpipeline``); a batch that
        fails runs again with a savepoint per operation. A batch with an
        operation that runs a user's SQL (``user_sql``: ``step.transaction``)
        is never pipelined: the user's code reads results and may fail
        mid-way, and its savepoint must roll back at once."""
        if faults.active is not None:  # tests only (store/faults.py)
            return faults.active.run(ops, lambda batch: self._write(conn, batch))
        return self._write(conn, ops)

    def _write(self, conn: Any, ops: list[Callable[[Any], Any]]) -> list[OpResult]:
        txs: list[PgTx] = []

        def make_tx(c: Any) -> PgTx:
            txs.append(PgTx(c, DIALECT, self._end_guesses, counting=self._counting))
            return txs[-1]

        def wrong_guess(failure: BaseException) -> bool:
            """An end sent unread resolved more (``end_alone``): its function's
            ends are read from now on, and the transaction runs again so."""
            if not is_end_not_alone(failure):
                return False
            for function_id in txs[-1].guessed or ():
                self._end_guesses.saw(function_id, False)
            return True

        user_sql = any(getattr(op, "user_sql", False) for op in ops)
        ops = [_scoped(op) for op in ops]
        if user_sql:
            outcomes = run_batch(conn, ops, make_tx, "BEGIN", translate, _notify_if_woken)
        elif len(ops) == 1:
            outcomes = [run_alone(conn, ops[0], make_tx, _notify_if_woken, translate, again=wrong_guess)]
        else:
            outcomes = run_together(conn, ops, make_tx, _notify_if_woken, translate, again=wrong_guess)
        if txs and txs[-1].counting and any(ok for ok, _ in outcomes) and txs[-1].changed():
            with self._lock:  # (the last attempt's)
                self._commits += 1
        for tx in txs:  # committed or not: wake rather than miss
            if tx.wakes_here():
                self._listener.wake_local()
                break
        return outcomes

    def submit(self, op: Callable[[Tx], T]) -> asyncio.Future[T]:
        """An event loop's write, through the loop's lane (``pgwriter.LoopLane``):
        group-committed by the writers, or run on the loop's thread when it is
        awaited while nothing else is ready there and a writer is idle."""
        return self._lane().submit(op)

    def _lane(self) -> LoopLane:
        loop = asyncio.get_running_loop()
        lane = self._lanes.get(loop)
        if lane is None:
            lane = self._lanes[loop] = LoopLane(self._writers, loop)
        return lane

    async def transact(self, op: Callable[[Tx], T]) -> T:
        return await self.submit(op)

    def transact_sync(self, op: Callable[[Tx], T]) -> T:
        """A blocking caller waits for its commit either way: with a writer idle
        it runs the operation itself, on that writer's connection (no thread
        hand-off); otherwise the writers group-commit it."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        resolve = sync_resolver(future)
        if not self._writers.run_here([op], [resolve]):
            self._writers.put(op, resolve)
        return future.result()

    # -- reads -------------------------------------------------------------------------
    def read_sync(self, op: Callable[[Tx], T]) -> T:
        """A read in a read-only snapshot on a pooled connection. While the
        writers find the server unreachable it fails at once rather than
        waiting for a connection."""
        return self._read(op, None)

    def _read(self, op: Callable[[Tx], T], ready: Callable[[Any], Any] | None, wait: float = READ_WAIT) -> T:
        """``read_sync``; ``ready(value)`` is called before the ``COMMIT``'s
        round trip (``pgpipeline.run_alone``); once it was, the read is over
        for its caller whatever the ``COMMIT`` meets."""
        told: list[Any] = []

        def tell(value: Any) -> None:
            told.append(value)
            if ready is not None:
                ready(value)

        for _attempt in range(self.readers + 1):
            if self._backoff.waiting():
                raise self._backoff.failure()
            try:
                with self._pool_ready().connection(wait) as conn:
                    # pipelined: BEGIN goes with the first statement, so a read of
                    # n statements costs n + 1 round trips, not n + 2
                    ok, value = run_alone(conn, op, _read_tx, _no_hook, translate, READ_BEGIN, tell)
                    broken = conn.broken or conn.closed  # the connection died
            except psycopg.Error as exc:  # no connection could be had in time
                if told:
                    return told[0]  # type: ignore[no-any-return]
                raise translate(exc) from exc
            if ok or told:
                result: T = value if ok else told[0]
                return result
            # A pooled connection that died while idle (a server restart) is
            # dropped by the pool; reads are safe to repeat on another one.
            if not (broken and isinstance(value, StoreUnavailableError)):
                raise value
        raise value

    async def read(self, op: Callable[[Tx], T]) -> T:
        """``read_sync`` on the loop's own thread when nothing else is ready
        there, no commit is in flight and a pooled connection is free (no hand-off to a thread and
        back; early reads and commits in a row are capped as the lane's are);
        otherwise on a reader thread, and the loop has the value as soon as
        every result is in, one round trip before the ``COMMIT`` is done (a
        read-only snapshot's results stand whatever its ``COMMIT`` meets)."""
        turns = self._lane().turns
        if turns.may_commit() and self._writers.idle_all() and self._pool_free():
            turns.took()
            try:
                value = self._read(op, None, LOOP_READ_WAIT)
            except StoreUnavailableError:
                pass  # no connection after all (another thread took it), or a broken one: on a thread
            else:
                self.reads_here += 1
                return value
        with self._lock:
            if self._closed:
                raise StoreError("postgresql: the store is closed")
            if self._read_threads is None:
                self._read_threads = ThreadPoolExecutor(self.readers, "stepstone-pg-read")
            threads = self._read_threads
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        threads.submit(self._read_for_loop, op, async_resolver(loop, future))
        return await future

    def _pool_free(self) -> bool:
        """Whether the read pool exists and has a connection ready now."""
        pool = self._pool
        return pool is not None and pool.get_stats().get("pool_available", 0) > 0

    def _read_for_loop(self, op: Callable[[Tx], Any], resolve: Callable[[bool, Any], None]) -> None:
        try:
            self._read(op, lambda value: resolve(True, value))
        except Exception as exc:  # noqa: BLE001 - handed to the awaiting caller
            resolve(False, exc)  # (``_read`` raises only if it never was ready)

    # -- wake-ups --------------------------------------------------------------------------
    def change_token(self) -> Any:
        self._listener.start()
        return self._listener.token

    def subscribe(self, callback: Callable[[], Any]) -> Callable[[], None]:
        return self._listener.subscribe(callback)

    # -- schema ----------------------------------------------------------------------------
    def migrate(self) -> list[str]:
        """Apply pending migrations, each in its own transaction under an advisory
        lock, so that concurrent migrators (many workers starting) are safe."""
        applied: list[str] = []
        try:
            with psycopg.connect(self.conninfo, autocommit=True) as conn:
                for name, sql in migration_files("postgres"):
                    with conn.transaction():
                        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
                        conn.execute(LEDGER)
                        done = conn.execute("SELECT 1 FROM schema_migrations WHERE name = %s", (name,))
                        if done.fetchone() is not None:
                            continue
                        conn.execute(sql.encode())
                        conn.execute(
                            "INSERT INTO schema_migrations (name, applied_at) VALUES (%s, %s)",
                            (name, time.time()),
                        )
                    applied.append(name)
        except psycopg.Error as exc:
            raise translate(exc) from exc
        return applied

    def close(self) -> None:
        self._writers.close()
        self._listener.close()
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
            threads, self._read_threads = self._read_threads, None
        if threads is not None:
            threads.shutdown(wait=True)
        if pool is not None:
            pool.close()


def _no_hook(tx: Any) -> None:
    """A read sends nothing before its ``COMMIT``."""


def _read_tx(conn: Any) -> Tx:
    return SqlTx(conn, DIALECT)
