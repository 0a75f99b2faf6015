"""Fewer round trips per transaction: psycopg's pipeline mode.

Every write transaction (a lone operation or a group commit's batch) and
every read goes out pipelined: each statement is only *sent*; the writer
waits for the server when a result is read (a row, a row count) and once at
the end. A checkpoint reads nothing before its ``COMMIT`` (its fence check
raises on the server), so it costs one round trip instead of four, and a
batch of ten checkpoints one instead of about forty. A batch is tried whole,
without savepoints (``run_together``); only if something in it fails does it
run again with a savepoint per operation (``batching.run_batch``), where a
failing statement is pinned on its own operation.

Waiting for results mid-pipeline (``Pipelined.sync``) first sends whatever is
still queued: the connection is non-blocking, and psycopg's ``Pipeline.sync()``
(3.3) writes to the socket only while it has commands to push, then waits for
results. When a large statement (a 4 MB step output) did not fit in the socket's
send buffer, its tail stayed in libpq's output buffer: the server waited for the
rest of the statement (``ClientRead``) and the writer for its results, for
ever. Draining costs nothing when the buffer is already empty (one ``PQflush``
that has nothing to send), so an ordinary checkpoint still costs one round trip.
(Leaving the pipeline is safe: psycopg flushes fully there.)

After a pipelined transaction that failed, every prepared statement is
deallocated (``_roll_back``): psycopg's record of prepared statements can
disagree with the server's after an aborted pipeline.
"""

from __future__ import annotations

import contextlib
import selectors
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

from stepstone.store.batching import OpResult, run_batch


class Pipelined:
    """The connection as ``SqlTx`` sees it: ``execute`` sends, results wait."""

    def __init__(self, conn: Any, pipeline: Any) -> None:
        self.conn = conn
        self.pipeline = pipeline
        self.unsynced = False

    def execute(self, query: Any, params: Any = None) -> Result:
        cursor = self.conn.execute(query, params)
        self.unsynced = True
        return Result(self, cursor)

    def sync(self) -> None:
        """Wait for every statement sent so far; raises the first one's error."""
        if self.unsynced:
            self.unsynced = False
            drain(self.conn.pgconn)
            self.pipeline.sync()


def drain(pgconn: Any) -> None:
    """Send everything libpq holds in its output buffer, waiting for the socket
    to accept it; meanwhile read what the server sends (into libpq's input
    buffer, for psycopg to process), so that a server blocked writing results
    is never what keeps it from reading. Raises ``psycopg.OperationalError`` if
    the connection fails."""
    if not pgconn.flush():  # the common case: nothing left to send
        return
    with selectors.DefaultSelector() as selector:
        selector.register(pgconn.socket, selectors.EVENT_READ | selectors.EVENT_WRITE)
        while pgconn.flush():
            for _key, ready in selector.select():
                if ready & selectors.EVENT_READ:
                    pgconn.consume_input()


class Result:
    """A cursor whose results are waited for on first use."""

    __slots__ = ("_owner", "cursor")

    def __init__(self, owner: Pipelined, cursor: Any) -> None:
        self._owner = owner
        self.cursor = cursor

    def _ready(self) -> Any:
        self._owner.sync()
        return self.cursor

    @property
    def rowcount(self) -> int:
        return int(self._ready().rowcount)

    @property
    def statusmessage(self) -> str | None:
        message: str | None = self._ready().statusmessage
        return message

    def fetchone(self) -> Any:
        return self._ready().fetchone()

    def fetchall(self) -> list[Any]:
        return list(self._ready().fetchall())


def run_alone(
    conn: Any,
    op: Callable[[Any], Any],
    make_tx: Callable[[Any], Any],
    before_commit: Callable[[Any], Any],
    translate: Callable[[BaseException], BaseException],
    begin: str = "BEGIN",
    ready: Callable[[Any], Any] | None = None,
) -> OpResult:
    """``op`` in its own pipelined transaction (opened by ``begin``). Any failure
    (the operation's own error, a statement's, the ``COMMIT``'s) rolls everything
    back. ``ready(value)``, if given, is called once every result is in,
    before the ``COMMIT`` is sent (a read's caller need not wait for it)."""
    values, failure = _attempt(conn, [op], make_tx, before_commit, begin, ready)
    if failure is None:
        return True, values[0]
    return False, translate(failure)


def run_together(
    conn: Any,
    ops: Sequence[Callable[[Any], Any]],
    make_tx: Callable[[Any], Any],
    before_commit: Callable[[Any], Any],
    translate: Callable[[BaseException], BaseException],
) -> list[OpResult]:
    """``ops`` in one pipelined transaction without savepoints, the common case
    of a group commit: nothing fails, and the batch costs the round trips its
    reads need plus one, instead of one per statement and two more per
    operation (``SAVEPOINT``, ``RELEASE``). If anything fails (an operation's
    error, a fence refusing a stale worker, a deadlock, the ``COMMIT``),
    nothing took effect: the batch runs again the old way, a savepoint per
    operation (``batching.run_batch``), so that only the failing operation
    fails. (Operations may run twice, as a deadlock victim's retry does: they
    are written to be run again after a rollback.)"""
    values, failure = _attempt(conn, ops, make_tx, before_commit, "BEGIN")
    if failure is None:
        return [(True, value) for value in values]
    return run_batch(conn, ops, make_tx, "BEGIN", translate, before_commit)


def _attempt(
    conn: Any,
    ops: Sequence[Callable[[Any], Any]],
    make_tx: Callable[[Any], Any],
    before_commit: Callable[[Any], Any],
    begin: str,
    ready: Callable[[Any], Any] | None = None,
) -> tuple[list[Any], BaseException | None]:
    """Run ``ops`` in one pipelined transaction; their values, or the first
    failure (everything then rolled back)."""
    failure: BaseException | None = None
    values: list[Any] = []
    try:
        with conn.pipeline() as pipeline:
            piped = Pipelined(conn, pipeline)
            piped.execute(begin)
            tx = make_tx(piped)
            try:
                for op in ops:
                    values.append(op(tx))
            except Exception as exc:  # noqa: BLE001 - the op's failure, reported to its caller
                failure = exc
            else:
                if ready is not None:
                    piped.sync()
                    ready(values[0])
                before_commit(tx)
                piped.execute("COMMIT")
        piped.unsynced = False  # leaving the pipeline waited for every result
    except psycopg.Error as exc:  # surfaced by the final flush: a write never read back, the COMMIT
        failure = failure or exc
    if failure is not None:
        _roll_back(conn)
    return values, failure


def _roll_back(conn: Any) -> None:
    """End a pipelined transaction that failed, through psycopg's own
    ``rollback()``: it also forgets every prepared statement, on the server
    and in its record. They can disagree after an aborted pipeline: the
    statements sent after the failing one were skipped by the server, and
    psycopg may count one of them as prepared (it crossed the prepare
    threshold in that pipeline) although the server never prepared it; every
    later use would then fail with 'prepared statement does not exist'. The
    connection can then go on (a group commit runs its batch again on it).
    A transaction already ended (its ``COMMIT`` failed) leaves nothing to roll
    back, and psycopg forgets nothing: that connection, as one that fails, is
    closed and its writer reconnects (rare: a failure is almost always a
    statement's)."""
    if conn.closed or conn.broken:
        return
    try:
        if conn.info.transaction_status == TransactionStatus.IDLE:
            conn.close()
        else:
            conn.rollback()
    except psycopg.Error:
        with contextlib.suppress(psycopg.Error):
            conn.close()
