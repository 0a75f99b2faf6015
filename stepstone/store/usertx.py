"""The store side of ``step.transaction``: a user's function inside the
transaction that commits the step's memo.

Exactly-once writes to the user's own tables come from sharing one
transaction: the user's rows and the step's checkpoint commit together or not
at all. Two things keep that transaction safe to share:

- A savepoint around the function. A transaction may be a group commit of
  several runs' checkpoints (``batching.py``); a function that raises (or runs
  too long) rolls back its own writes only, and every other operation in the
  batch commits as usual.
- A bound on its time, because the transaction holds the database's write
  lock (SQLite) or row locks and a writer connection (PostgreSQL) while it
  runs: SQLite interrupts a statement past the deadline (a progress handler),
  PostgreSQL sets a transaction-local ``statement_timeout`` for the
  savepoint's lifetime; and a function that returns after the deadline has
  its writes rolled back all the same.

The function receives ``UserConnection``: the driver's connection, less the
calls that would end the engine's transaction (``commit``, ``rollback``,
``close``, ``with conn:``).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from stepstone.errors import NonRetriableError, TransactionTooLongError
from stepstone.store.sqlbase import SqlPlumbing

T = TypeVar("T")
_PROGRESS_OPS = 1000  # SQLite virtual machine instructions between deadline checks


class UserConnection:
    """The connection a ``step.transaction`` function gets: every attribute of
    the driver's connection (``execute``, ``cursor``, ...) except those that
    would end the transaction the step's checkpoint still has to commit."""

    __slots__ = ("driver_connection",)

    def __init__(self, conn: Any) -> None:
        self.driver_connection = conn  # for adapters (contrib.sqlalchemy), not for users

    def __getattr__(self, name: str) -> Any:
        return getattr(self.driver_connection, name)

    def _refuse(self, what: str) -> None:
        raise NonRetriableError(
            f"a step.transaction function must not call {what}(): the step's checkpoint "
            "commits its writes, or rolls them back if it raises"
        )

    def commit(self) -> None:
        self._refuse("commit")

    def rollback(self) -> None:
        self._refuse("rollback")

    def close(self) -> None:
        self._refuse("close")

    def __enter__(self) -> None:  # sqlite3's `with conn:` commits
        self._refuse("__enter__")

    def __exit__(self, *exc: object) -> None:
        return None


def run_in_savepoint(tx: SqlPlumbing, fn: Callable[[UserConnection], T], seconds: float) -> T:
    """``fn(connection)`` in a savepoint of ``tx``'s open transaction, bounded
    to ``seconds``. If it raises or runs too long its writes are rolled back
    and the error is raised; what it wrote stays in the transaction otherwise."""
    bounded = tx.dialect.statement_timeout
    if bounded:
        _script(tx, "user_savepoint_bounded", ms=max(1, int(seconds * 1000)))
    else:
        tx._exec("user_savepoint")
    deadline = time.monotonic() + seconds
    try:
        with _interrupted_after(tx.conn, deadline):
            value = fn(UserConnection(tx.conn))
        if time.monotonic() > deadline:
            raise TransactionTooLongError(f"the transaction's function ran for more than {seconds:g}s")
        # Inside the try: on PostgreSQL a function that swallowed a failed
        # statement left the transaction aborted, and this is where it shows.
        if bounded:
            _script(tx, "user_release_bounded")
        else:
            tx._exec("user_release")
    except BaseException:
        tx._exec("user_rollback")  # also takes back the statement timeout
        tx._exec("user_release")
        raise
    return value


def _script(tx: SqlPlumbing, name: str, ms: int = 0) -> None:
    """Statements without parameters, sent together (one round trip)."""
    tx.conn.execute(tx.dialect.sql(name).replace("{ms}", str(ms)).encode())


@contextmanager
def _interrupted_after(conn: Any, deadline: float) -> Iterator[None]:
    """SQLite: a statement still running at ``deadline`` is interrupted."""
    if not isinstance(conn, sqlite3.Connection):
        yield
        return
    conn.set_progress_handler(lambda: time.monotonic() > deadline, _PROGRESS_OPS)
    try:
        yield
    finally:
        conn.set_progress_handler(None, 0)
