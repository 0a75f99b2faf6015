"""Fewer round trips for a lone operation: psycopg's pipeline mode.

When a writer has a single operation to commit (the common case for a
sequential run: one checkpoint per step), and for every read, its statements
go out pipelined:
each is only *sent*; the writer waits for the server when a result is read (a
row, a row count) and once at the end. A checkpoint reads nothing before its
``COMMIT`` (its fence check raises on the server), so it costs one round trip
instead of four. Several operations share a plain transaction with a savepoint each
(``batching.run_batch``), where a failing statement must be pinned on its own
operation.

Waiting for results mid-pipeline (``Pipelined.sync``) first sends whatever is
still queued: the connection is non-blocking, and psycopg's ``Pipeline.sync()``
(3.3) writes to the socket only while it has commands to push, then waits for
results. When a large statement (a 4 MB step output) did not fit in the socket's
send buffer, its tail stayed in libpq's output buffer: the server waited for the
rest of the statement (``ClientRead``) and the writer for its results, for
ever. Draining costs nothing when the buffer is already empty (one ``PQflush``
that has nothing to send), so an ordinary checkpoint still costs one round trip.
(Leaving the pipeline is safe: psycopg flushes fully there.)

A pipelined transaction that failed closes its connection (``_discard``):
psycopg's record of prepared statements can disagree with the server's after
an aborted pipeline.
"""

from __future__ import annotations

import contextlib
import selectors
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

from stepstone.store.batching import OpResult


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
) -> OpResult:
    """``op`` in its own pipelined transaction (opened by ``begin``). Any failure
    (the operation's own error, a statement's, the ``COMMIT``'s) rolls everything
    back."""
    failure: BaseException | None = None
    value: Any = None
    try:
        with conn.pipeline() as pipeline:
            piped = Pipelined(conn, pipeline)
            piped.execute(begin)
            tx = make_tx(piped)
            try:
                value = op(tx)
            except Exception as exc:  # noqa: BLE001 - the op's failure, reported to its caller
                failure = exc
            else:
                before_commit(tx)
                piped.execute("COMMIT")
        piped.unsynced = False  # leaving the pipeline waited for every result
    except psycopg.Error as exc:  # surfaced by the final flush: a write never read back, the COMMIT
        failure = failure or exc
    if failure is None:
        return True, value
    _roll_back(conn)
    _discard(conn)
    return False, translate(failure)


def _discard(conn: Any) -> None:
    """Close a connection whose pipeline ended in an error: the statements sent
    after the failing one were skipped by the server, and psycopg may count one
    of them as prepared (it crossed the prepare threshold in that pipeline)
    although the server never prepared it; every later use would then fail
    with 'prepared statement does not exist'. The writer opens a fresh
    connection before its next batch. Failed lone operations are rare (a
    stale worker's fenced-out checkpoint, an operator's refused action), so
    the reconnection costs nothing in steady state."""
    with contextlib.suppress(psycopg.Error):
        conn.close()


def _roll_back(conn: Any) -> None:
    if conn.closed or conn.broken:
        return
    if conn.info.transaction_status != TransactionStatus.IDLE:
        with contextlib.suppress(psycopg.Error):  # the connection may be going: it will be replaced
            conn.execute("ROLLBACK")
