"""Fewer round trips per transaction: each one pipelined.

Every write transaction (a lone operation or a group commit's batch) and
every read goes out pipelined, on the connection's ``pgwire.Wire``: each
statement is only *queued*; the caller waits for the server when a result is
read (a row, a row count) and once at the end. A checkpoint reads nothing
before its ``COMMIT`` (its fence check raises on the server), so it costs one
round trip instead of four, and a batch of ten checkpoints one instead of
about forty. A batch is tried whole, without savepoints (``run_together``);
only if something in it fails does it run again with a savepoint per
operation (``batching.run_batch``, on psycopg's ordinary path), where a
failing statement is pinned on its own operation.

A statement error fails the transaction even if an operation caught it (the
transaction is aborted on the server then: its ``COMMIT`` would only roll
back). A failed transaction is rolled back on the same connection, which
goes on (``Wire.end``); only a connection that failed is closed, and its
writer reconnects.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import psycopg

from stepstone.store.batching import OpResult, run_batch
from stepstone.store.pgwire import Wire


def run_alone(
    conn: Any,
    op: Callable[[Any], Any],
    make_tx: Callable[[Any], Any],
    before_commit: Callable[[Any], Any],
    translate: Callable[[BaseException], BaseException],
    begin: str = "BEGIN",
    ready: Callable[[Any], Any] | None = None,
    again: Callable[[BaseException], bool] = lambda failure: False,
) -> OpResult:
    """``op`` in its own pipelined transaction (opened by ``begin``). Any failure
    (the operation's own error, a statement's, the ``COMMIT``'s) rolls everything
    back. ``ready(value)``, if given, is called once every result is in,
    before the ``COMMIT`` is sent (a read's caller need not wait for it).
    A failure ``again`` accepts runs the transaction once more."""
    values, failure = _attempt(conn, [op], make_tx, before_commit, begin, ready)
    if failure is not None and again(failure):
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
    again: Callable[[BaseException], bool] = lambda failure: False,
) -> list[OpResult]:
    """``ops`` in one pipelined transaction without savepoints, the common case
    of a group commit: nothing fails, and the batch costs the round trips its
    reads need plus one, instead of one per statement and two more per
    operation (``SAVEPOINT``, ``RELEASE``). If anything fails (an operation's
    error, a fence refusing a stale worker, a deadlock, the ``COMMIT``),
    nothing took effect: the batch runs again the old way, a savepoint per
    operation (``batching.run_batch``), so that only the failing operation
    fails. (Operations may run twice, as a deadlock victim's retry does: they
    are written to be run again after a rollback.) A failure ``again`` accepts
    runs the batch whole once more first."""
    values, failure = _attempt(conn, ops, make_tx, before_commit, "BEGIN")
    if failure is not None and again(failure):
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
    wire = Wire.of(conn)
    try:
        wire.begin()
        wire.execute(begin)
        tx = make_tx(wire)
        try:
            for op in ops:
                values.append(op(tx))
        except Exception as exc:  # noqa: BLE001 - the op's failure, reported to its caller
            failure = exc
        else:
            if ready is not None:
                wire.sync()
                ready(values[0])
            before_commit(tx)
            wire.execute("COMMIT")
            wire.sync()
    except psycopg.Error as exc:  # a statement's error, the COMMIT's, the connection's
        failure = failure or exc
    except BaseException:  # cut short (an operation's BaseException): its state is unknown
        wire.abandon()
        raise
    failure = failure or wire.error  # a statement error an operation caught
    wire.end()
    return values, failure
