"""Fewer round trips for a lone operation: psycopg's pipeline mode.

When a writer has a single operation to commit (the common case for a
sequential run: one checkpoint per step), its statements go out pipelined:
each is only *sent*; the writer waits for the server when a result is read (a
row, a row count) and once at the end. A checkpoint reads nothing before its
``COMMIT`` (its fence check raises on the server), so it costs one round trip
instead of four. Several operations share a plain transaction with a savepoint each
(``batching.run_batch``), where a failing statement must be pinned on its own
operation.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

from stepstone.store.batching import Outcome


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
            self.pipeline.sync()


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


def run_alone(conn: Any, op: Callable[[Any], Any], make_tx: Callable[[Any], Any],
              before_commit: Callable[[Any], Any],
              translate: Callable[[BaseException], BaseException]) -> Outcome:
    """``op`` in its own pipelined transaction. Any failure (the operation's own
    error, a statement's, the ``COMMIT``'s) rolls everything back."""
    failure: BaseException | None = None
    value: Any = None
    try:
        with conn.pipeline() as pipeline:
            piped = Pipelined(conn, pipeline)
            piped.execute("BEGIN")
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
    return False, translate(failure)


def _roll_back(conn: Any) -> None:
    if conn.closed or conn.broken:
        return
    if conn.info.transaction_status != TransactionStatus.IDLE:
        with contextlib.suppress(psycopg.Error):  # the connection may be going: it will be replaced
            conn.execute("ROLLBACK")
