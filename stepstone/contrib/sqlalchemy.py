"""A SQLAlchemy ``Session`` on a ``step.transaction``'s connection
(``pip install 'stepstone[sqlalchemy]'``)::

    from stepstone.contrib.sqlalchemy import transaction_session

    def create_record(conn, user_id):
        with transaction_session(conn) as session:
            session.add(Subscription(user_id=user_id))
        return user_id

    ctx.step.transaction("create-record", create_record, user_id)

The session works inside the step's transaction, in a savepoint of its own
(``join_transaction_mode="create_savepoint"``): leaving the block flushes
and releases it; an exception rolls it back and propagates (the step then
fails and is retried). Either way the step's checkpoint decides whether
anything commits, so ``session.commit()`` never commits the database
transaction, only the session's savepoint.

How it binds: one engine per database kind (SQLite's ``sqlite3``,
PostgreSQL's ``psycopg``), with no pool of its own (``NullPool``); its
``creator`` hands over the step's connection, wrapped so that what SQLAlchemy
does to a connection it is done with (``rollback`` on return, ``close``)
leaves the step's transaction alone, and a ``commit`` on it is refused. On
PostgreSQL its cursors return tuples (Stepstone's connection returns dicts).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, create_engine
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from stepstone.errors import NonRetriableError
from stepstone.store.usertx import UserConnection

_handover = threading.local()  # the connection the engine's creator hands over, per thread
_engines: dict[str, Engine] = {}
_lock = threading.Lock()


class _Lent:
    """The step's connection as SQLAlchemy sees it."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    def cursor(self, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(self._conn, sqlite3.Connection):
            from psycopg.rows import tuple_row

            kwargs.setdefault("row_factory", tuple_row)
        return self._conn.cursor(*args, **kwargs)

    def rollback(self) -> None:
        """SQLAlchemy resets a connection it is done with: the step's savepoint
        and checkpoint decide what is kept, not it."""

    def close(self) -> None:
        """The connection is the store's: it stays open."""

    def commit(self) -> None:
        raise NonRetriableError("the step's checkpoint commits a step.transaction's writes")


def _creator() -> _Lent:
    conn: _Lent = _handover.conn
    return conn


def _engine(url: str) -> Engine:
    with _lock:
        engine = _engines.get(url)
        if engine is None:
            # No hstore lookup at connect (psycopg's TypeInfo wants its own class).
            options = {} if url.startswith("sqlite") else {"use_native_hstore": False}
            engine = _engines[url] = create_engine(url, creator=_creator, poolclass=NullPool, **options)
        return engine


@contextmanager
def transaction_session(conn: Any) -> Iterator[Session]:
    """A ``Session`` on the connection a ``step.transaction`` function received."""
    if not isinstance(conn, UserConnection):
        raise NonRetriableError("transaction_session() binds only the connection a step.transaction gets")
    raw = conn.driver_connection
    url = "sqlite://" if isinstance(raw, sqlite3.Connection) else "postgresql+psycopg://"
    _handover.conn = _Lent(raw)
    try:
        bound = _engine(url).connect()
    finally:
        _handover.conn = None
    bound.begin()  # SQLAlchemy's view of the step's open transaction: it emits nothing
    session = Session(bind=bound, join_transaction_mode="create_savepoint")
    try:
        yield session
        session.commit()  # flushes and releases the session's savepoint
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
        bound.close()
