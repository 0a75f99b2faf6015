"""Group commit: run several operations in one transaction, each isolated by a
savepoint so that one failing operation is rolled back alone; or, first, all
of them without savepoints (``run_together``), the common case of a batch in
which nothing fails."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

T = TypeVar("T")

OpResult = tuple[bool, Any]  # (ok, value or exception)


def run_batch(
    conn: Any,
    ops: Sequence[Callable[[Any], Any]],
    make_tx: Callable[[Any], Any],
    begin: str,
    translate: Callable[[BaseException], BaseException],
    before_commit: Callable[[Any], Any] | None = None,
) -> list[OpResult]:
    """Run ``ops`` in one transaction on ``conn``; returns one outcome per op.

    ``before_commit(tx)``, if given, runs last inside the transaction (the
    PostgreSQL store issues its NOTIFY there). If the transaction itself fails
    (begin, ``before_commit`` or commit), every op gets the translated error:
    none of them took effect.
    """
    tx = make_tx(conn)
    try:
        conn.execute(begin)
    except Exception as exc:  # noqa: BLE001 - translated and handed to every caller
        err = translate(exc)
        return [(False, err)] * len(ops)
    outcomes: list[OpResult] = []
    try:
        if len(ops) == 1:
            try:
                outcomes.append((True, ops[0](tx)))
            except Exception as exc:  # noqa: BLE001 - the op's own failure
                conn.execute("ROLLBACK")
                return [(False, translate(exc))]
        else:
            for op in ops:
                conn.execute("SAVEPOINT op")
                try:
                    value = op(tx)
                    # An op may return although a statement of its failed (PostgreSQL
                    # then refuses the release): it failed, and it gets one outcome.
                    conn.execute("RELEASE SAVEPOINT op")
                    outcomes.append((True, value))
                except Exception as exc:  # noqa: BLE001 - the op's own failure
                    conn.execute("ROLLBACK TO SAVEPOINT op")
                    conn.execute("RELEASE SAVEPOINT op")
                    outcomes.append((False, translate(exc)))
        if before_commit is not None:
            before_commit(tx)
        conn.execute("COMMIT")
    except Exception as exc:  # noqa: BLE001 - commit failed: nothing took effect
        try:
            conn.execute("ROLLBACK")
        except Exception:  # noqa: BLE001 - the connection may be gone
            pass
        err = translate(exc)
        return [(False, err)] * len(ops)
    return outcomes


def run_together(
    conn: Any,
    ops: Sequence[Callable[[Any], Any]],
    make_tx: Callable[[Any], Any],
    begin: str,
    translate: Callable[[BaseException], BaseException],
) -> list[OpResult]:
    """``ops`` in one transaction without savepoints: a group commit in which
    nothing fails costs two statements fewer per operation (``SAVEPOINT``,
    ``RELEASE``; on SQLite ~12 µs of a queued run's ~0.5 ms per operation).
    If an operation fails, nothing took effect: the transaction is rolled back
    and the batch runs again with a savepoint per operation (``run_batch``), so
    that only the failing one fails. (Operations are written to be run again
    after a rollback, as PostgreSQL's pipelined batch, ``pgpipeline.run_together``,
    and a deadlock victim's retry already run them.) A failing ``begin`` or
    ``COMMIT`` fails every operation, as in ``run_batch``."""
    if len(ops) == 1:
        return run_batch(conn, ops, make_tx, begin, translate)
    try:
        conn.execute(begin)
    except Exception as exc:  # noqa: BLE001 - translated and handed to every caller
        return [(False, translate(exc))] * len(ops)
    tx = make_tx(conn)
    values: list[Any] = []
    try:
        for op in ops:
            values.append(op(tx))
    except Exception:  # noqa: BLE001 - the failing op is found by the guarded run
        _roll_back(conn)
        return run_batch(conn, ops, make_tx, begin, translate)
    except BaseException:  # cut short: nothing of the batch may stay open
        _roll_back(conn)
        raise
    try:
        conn.execute("COMMIT")
    except Exception as exc:  # noqa: BLE001 - commit failed: nothing took effect
        _roll_back(conn)
        return [(False, translate(exc))] * len(ops)
    return [(True, value) for value in values]


def _roll_back(conn: Any) -> None:
    """Roll back the open transaction, if the failure left one (SQLite ends it
    itself on some errors: a full disk, an I/O error)."""
    try:
        conn.execute("ROLLBACK")
    except Exception:  # noqa: BLE001 - no transaction, or the connection is gone
        pass


class Unsynced(Generic[T]):
    """A write whose commit may return before it reaches the disk: a lease
    pass. Lost with the machine (power, an OS crash: every worker on it dies
    too), it changed nothing that must survive: its runs are due again as
    they were and are taken again; no step ran to completion under it, since
    a step's checkpoint is a synced commit, and a synced commit puts every
    earlier write of the log on disk with it. On SQLite at ``synchronous=full``
    a batch of such writes alone commits without the fsync (one of the four
    commits of a queued three-step run); PostgreSQL ignores the mark."""

    unsynced = True

    def __init__(self, op: Callable[[Any], T]) -> None:
        self.op = op

    def __call__(self, tx: Any) -> T:
        return self.op(tx)

    @property
    def site(self) -> str:
        """The operation's own name (fault plans match it)."""
        return site(self.op)


def site(op: Callable[[Any], Any]) -> str:
    """The stable name of a write operation (``store/faults.py`` matches plans on it)."""
    named = getattr(op, "site", None)
    if isinstance(named, str):
        return named
    name = getattr(op, "__qualname__", type(op).__qualname__)
    return str(name).replace(".<locals>", "")


def unsynced(ops: Sequence[Callable[[Any], Any]]) -> bool:
    """Whether every operation of a batch may commit without the fsync."""
    return all(getattr(op, "unsynced", False) for op in ops)
