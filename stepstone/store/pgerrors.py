"""PostgreSQL driver errors translated at the store boundary (``__cause__`` kept)."""

from __future__ import annotations

import psycopg

from stepstone.errors import StoreError, StoreUnavailableError


def translate(exc: BaseException) -> BaseException:
    """Connection failures, server shutdowns, deadlocks, serialisation failures and
    pool time-outs (psycopg's ``OperationalError`` family) are transient:
    ``StoreUnavailableError``. Other driver errors are ``StoreError``; anything
    else (an operation's own exception) passes through unchanged."""
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        err: StoreError = StoreUnavailableError(f"postgresql: {exc}".strip())
    elif isinstance(exc, psycopg.Error):
        err = StoreError(f"postgresql: {exc}".strip())
    else:
        return exc
    err.__cause__ = exc
    return err
