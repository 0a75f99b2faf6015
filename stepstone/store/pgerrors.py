"""PostgreSQL driver errors translated at the store boundary (``__cause__`` kept)."""

from __future__ import annotations

import psycopg
import psycopg.errors

from stepstone.errors import LeaseLostError, StoreError, StoreUnavailableError

LEASE_LOST = "SS001"  # raised by stepstone_fence (migration 0006)
END_NOT_ALONE = "SS002"  # raised by stepstone_end_alone (migration 0025): a wrong guess


def translate(exc: BaseException) -> BaseException:
    """Connection failures, server shutdowns, deadlocks, serialisation failures and
    pool time-outs (psycopg's ``OperationalError`` family) are transient:
    ``StoreUnavailableError``. Other driver errors are ``StoreError``; anything
    else (an operation's own exception) passes through unchanged."""
    if isinstance(exc, psycopg.Error) and exc.sqlstate == LEASE_LOST:
        lost = LeaseLostError(exc.diag.message_primary or "lease lost")
        lost.__cause__ = exc
        return lost
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        err: StoreError = StoreUnavailableError(f"postgresql: {exc}".strip())
    elif isinstance(exc, psycopg.Error):
        err = StoreError(f"postgresql: {exc}".strip())
    else:
        return exc
    err.__cause__ = exc
    return err


_RUN_AGAIN = (
    psycopg.errors.DeadlockDetected,
    psycopg.errors.SerializationFailure,
    psycopg.errors.InvalidSqlStatementName,
)


def is_conflict(exc: BaseException) -> bool:
    """A translated deadlock or serialisation failure: the transaction (or the
    operation's savepoint) was rolled back and may simply run again. So may
    one that met a prepared statement gone from the server (``pgwire``, which
    then forgets the rest): psycopg deallocates every statement of the
    connection after a ``ROLLBACK`` on its own path once it prepared one."""
    return isinstance(exc, StoreError) and isinstance(exc.__cause__, _RUN_AGAIN)


def is_end_not_alone(exc: BaseException) -> bool:
    """A statement error of ``end_alone`` whose guess was wrong: its
    transaction rolled back, and the end runs again the way that reads what
    it resolves."""
    return isinstance(exc, psycopg.Error) and exc.sqlstate == END_NOT_ALONE
