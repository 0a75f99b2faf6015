"""PostgreSQL statements below psycopg's cursor: libpq's pipeline, named
prepared statements and psycopg's C adaptation, without the Python layers in
between.

psycopg's ``Connection.execute`` in a pipeline costs about 70 Python calls a
statement (a cursor, the query's conversion, prepared-statement bookkeeping,
the pipeline's queue of generators) and writes each statement to the socket
on its own; entering and leaving its ``Pipeline`` costs about 0.1 ms of CPU a
transaction. A store transaction is a handful of statements from a fixed set
(``queries.sql``), so ``Wire`` does the same work directly on the connection's
``pgconn``:

- A statement's text is compiled once (``%(name)s`` placeholders become
  ``$n`` with the order of the names) and prepared once per connection and
  parameter types (``PQsendPrepare``, pipelined just before its first use;
  the types are psycopg's own for the values, so the server sees what a
  psycopg cursor would send). Later uses send only ``PQsendQueryPrepared``.
- A statement whose text starts with ``PLANNED_PER_CALL`` is never
  prepared: it is sent unnamed (``PQsendQueryParams``), so the server plans
  it at every call with the tables' sizes of the moment. A prepared
  statement's plan becomes generic after five calls and stays so on that
  connection until the table's statistics change: a read of a table that was
  nearly empty then (``steps`` on a new database) keeps a sequential scan
  while the table grows, milliseconds a call (docs/benchmarks.md, pg2proc).
- Parameters are dumped and rows loaded by psycopg's C ``Transformer``
  (rows as dicts, text results, as ``dict_row`` cursors give them).
- Statements are only queued (libpq's pipeline mode, entered and left per
  transaction at the ``pgconn`` level); ``sync`` sends a sync point,
  flushes everything (reading what the server sends meanwhile, so that a
  large statement cannot deadlock against a server blocked writing results)
  and reads every result in order. A ``Result`` waits for that on first use.

Errors: a statement's error result becomes the exception psycopg would raise
for it (``psycopg.errors.error_from_result``: its class, ``sqlstate`` and
diagnostics), raised by ``sync`` (the first one of the sync point's
statements) and remembered for the transaction (``Wire.error``). The record
of prepared statements agrees with the server's after any failure: a
statement counts as prepared only once its ``Parse`` succeeded (a pipeline
aborted before it never prepared it), names are never reused, and a
statement the server reports missing clears the record (something ran
``DEALLOCATE ALL``). A connection failure (libpq's own error, not a
statement's) closes the connection: its owner reconnects.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg import errors, generators, pq, waiting
from psycopg.adapt import PyFormat, Transformer

TUPLES_OK = pq.ExecStatus.TUPLES_OK
COMMAND_OK = pq.ExecStatus.COMMAND_OK
FATAL_ERROR = pq.ExecStatus.FATAL_ERROR
TEXT = pq.Format.TEXT
IDLE = pq.TransactionStatus.IDLE
PIPELINE_OFF = pq.PipelineStatus.OFF
MISSING_STATEMENT = "26000"  # invalid_sql_statement_name: "prepared statement ... does not exist"
MAX_PREPARED = 256  # per connection (a worker's writer uses ~50); past it the oldest is closed
WAIT_INTERVAL = 0.1  # seconds between checks for signals while waiting, as psycopg's own
_PLACEHOLDER = re.compile(rb"%\((\w+)\)s|%%")
PLANNED_PER_CALL = b"-- (planned at every call"  # how such a statement's text in queries.sql starts


class Statement:
    """A statement's text as the server gets it (``$n`` placeholders) and the
    names of its parameters in ``$n`` order. Compiled once per text; its
    identity is its cache key."""

    __slots__ = ("formats", "names", "per_call", "query")

    def __init__(self, text: str | bytes, pyformat: bool) -> None:
        names: list[str] = []

        def number(match: re.Match[bytes]) -> bytes:
            if match.group(1) is None:
                return b"%"
            name = match.group(1).decode()
            if name not in names:
                names.append(name)
            return b"$%d" % (names.index(name) + 1)

        raw = text.encode() if isinstance(text, str) else text
        self.query = _PLACEHOLDER.sub(number, raw) if pyformat else raw
        self.names = tuple(names)
        self.formats = [PyFormat.AUTO] * len(names)
        self.per_call = self.query.startswith(PLANNED_PER_CALL)  # sent unnamed, never prepared


_compiled: dict[str | bytes, Statement] = {}  # text (with psycopg's %(name)s placeholders) -> statement
_verbatim: dict[str | bytes, Statement] = {}  # text run without parameters: sent as it is


def statement(text: str | bytes, pyformat: bool = True) -> Statement:
    """The compiled statement for ``text`` (cached: the texts are a fixed set)."""
    cache = _compiled if pyformat else _verbatim
    compiled = cache.get(text)
    if compiled is None:
        compiled = cache[text] = Statement(text, pyformat)
    return compiled


class Result:
    """One statement's result, read (with every statement sent before it) on
    first use. The interface ``SqlTx`` uses of a cursor."""

    __slots__ = ("_error", "_pgresult", "_pos", "_rows", "_statement", "_wire")

    def __init__(self, wire: Wire, statement: bytes) -> None:
        self._wire = wire
        self._statement = statement
        self._pgresult: Any = None
        self._error: BaseException | None = None
        self._rows: list[dict[str, Any]] | None = None
        self._pos = 0

    def settle(self, results: list[Any]) -> BaseException | None:
        """Take this statement's results off the wire; its error, if it failed."""
        res = results[-1] if results else None
        status = res.status if res is not None else None
        if status in (TUPLES_OK, COMMAND_OK):
            self._pgresult = res
            return None
        if status == FATAL_ERROR:
            self._error = self._wire.failed(res)
        else:  # skipped: an earlier statement of the pipeline failed
            self._error = errors.PipelineAborted("pipeline aborted")
        return self._error

    def _ready(self) -> Any:
        if self._pgresult is None and self._error is None:
            self._wire.sync()
        if self._error is not None:
            raise self._error
        return self._pgresult

    @property
    def rowcount(self) -> int:
        res = self._ready()
        if res.status == TUPLES_OK:
            return int(res.ntuples)
        tuples = res.command_tuples
        return int(tuples) if tuples is not None else -1

    @property
    def statusmessage(self) -> str | None:
        status = self._ready().command_status
        return status.decode() if status else None

    def _all_rows(self) -> list[dict[str, Any]]:
        if self._rows is None:
            self._rows = self._wire.rows(self._ready(), self._statement)
        return self._rows

    def fetchone(self) -> dict[str, Any] | None:
        rows = self._all_rows()
        if self._pos >= len(rows):
            return None
        self._pos += 1
        return rows[self._pos - 1]

    def fetchall(self) -> list[dict[str, Any]]:
        rows = self._all_rows()
        rest, self._pos = rows[self._pos :], len(rows)
        return rest


class _Prepare:
    """A ``Parse`` in flight: the statement counts as prepared only if it succeeds."""

    __slots__ = ("key", "wire")

    def __init__(self, wire: Wire, key: tuple[Statement, tuple[int, ...]]) -> None:
        self.wire = wire
        self.key = key

    def settle(self, results: list[Any]) -> BaseException | None:
        res = results[-1] if results else None
        if res is not None and res.status == COMMAND_OK:
            return None
        self.wire.prepared.pop(self.key, None)
        return self.wire.failed(res) if res is not None and res.status == FATAL_ERROR else None


class _Close:
    """A ``Close`` of an evicted statement: nothing depends on its outcome."""

    __slots__ = ()

    def settle(self, results: list[Any]) -> BaseException | None:
        return None


_CLOSE = _Close()


class Wire:
    """A connection's statement path: its prepared statements and the commands
    sent since the last sync point. Statements are sent and synced by one
    thread at a time (the connection's owner); a result already in may be
    read on any thread."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.pgconn = conn.pgconn
        self.dumper = Transformer(conn)  # the owner's thread only (``execute``)
        self.loader = Transformer(conn)  # any thread: a result may be read after its commit,
        self.loading = threading.Lock()  # on its caller's thread, while the owner goes on
        self.encoding = conn.info.encoding
        self.prepared: dict[tuple[Statement, tuple[int, ...]], bytes] = {}
        self.columns: dict[bytes, list[str]] = {}  # a prepared statement's result columns
        self.prepares = 0  # statements ever prepared (names are never reused)
        self.sent: list[Result | _Prepare | _Close] = []  # since the last sync point, in order
        self.error: BaseException | None = None  # the first statement error since ``begin``

    @staticmethod
    def of(conn: Any) -> Wire:
        """``conn``'s wire (created with it, dropped with it)."""
        wire: Wire | None = getattr(conn, "_stepstone_wire", None)
        if wire is None:
            wire = Wire(conn)
            conn._stepstone_wire = wire
        return wire

    # -- a transaction's pipeline -------------------------------------------------
    def begin(self) -> None:
        """Enter pipeline mode. The connection must be idle, outside a
        transaction and pipeline mode: one left otherwise (a transaction cut
        short by a ``BaseException``) is closed, as its results would answer
        the wrong statements."""
        self.error = None
        pgconn = self.pgconn
        if self.conn.closed:
            raise psycopg.OperationalError("the connection is closed")
        if self.sent or pgconn.pipeline_status != PIPELINE_OFF or pgconn.transaction_status != IDLE:
            self.abandon()
            raise psycopg.OperationalError("postgresql: a connection was left mid-transaction")
        self._guarded(pgconn.enter_pipeline_mode)

    def end(self) -> None:
        """Read whatever is still outstanding, roll back a transaction left
        open (one that failed), leave pipeline mode. The connection is closed
        instead if that fails: its state is unknown."""
        if self.conn.closed:
            return
        try:
            self.sync_quietly()
            if self.pgconn.transaction_status != IDLE:
                self.execute("ROLLBACK")
                self.sync_quietly()
            self.pgconn.exit_pipeline_mode()
        except psycopg.Error:
            self.abandon()

    def sync_quietly(self) -> None:
        """``sync``, its statement errors already recorded in ``error``."""
        try:
            self.sync()
        except psycopg.Error:
            if self.conn.closed:
                raise

    # -- statements ---------------------------------------------------------------
    def execute(self, query: str | bytes, params: Mapping[str, Any] | None = None) -> Result:
        """Queue ``query`` (one statement, psycopg's ``%(name)s`` placeholders)
        with ``params``, as psycopg's ``Connection.execute`` would run it."""
        stmt = (_compiled if params is not None else _verbatim).get(query) or statement(
            query, params is not None
        )
        if stmt.names:
            assert params is not None
            tx = self.dumper
            values = tx.dump_sequence([params[name] for name in stmt.names], stmt.formats)
            types: tuple[int, ...] = tx.types or ()
            formats: Any = tx.formats
        else:
            values, types, formats = None, (), None
        try:
            if stmt.per_call:
                result = Result(self, stmt.query)  # (its text: the key of its result's columns)
                self.pgconn.send_query_params(stmt.query, values, types or None, formats, TEXT)
            else:
                key = (stmt, types)
                name = self.prepared.get(key) or self._prepare(key)
                result = Result(self, name)
                self.pgconn.send_query_prepared(name, values, formats, TEXT)
        except psycopg.Error:
            self.abandon()
            raise
        self.sent.append(result)
        return result

    def _prepare(self, key: tuple[Statement, tuple[int, ...]]) -> bytes:
        if len(self.prepared) >= MAX_PREPARED:
            oldest = self.prepared.pop(next(iter(self.prepared)))
            self.columns.pop(oldest, None)
            self._guarded(self.pgconn.send_close_prepared, oldest)
            self.sent.append(_CLOSE)
        self.prepares += 1
        name = b"ss%d" % self.prepares
        self._guarded(self.pgconn.send_prepare, name, key[0].query, key[1])
        self.prepared[key] = name
        self.sent.append(_Prepare(self, key))
        return name

    def sync(self) -> None:
        """One round trip: a sync point, everything sent, every result read.
        Raises the first statement error among them."""
        if not self.sent:
            return
        sent, self.sent = self.sent, []
        first: BaseException | None = None
        pgconn, fileno = self.pgconn, self.pgconn.socket
        try:
            pgconn.pipeline_sync()
            waiting.wait(generators.send(pgconn), fileno, interval=WAIT_INTERVAL)
            for item in sent:
                results = waiting.wait(generators.fetch_many(pgconn), fileno, interval=WAIT_INTERVAL)
                error = item.settle(results)
                first = first or error
            waiting.wait(generators.fetch_many(pgconn), fileno, interval=WAIT_INTERVAL)  # the sync point
        except psycopg.Error:
            self.abandon()
            raise
        if first is not None:
            raise first

    def failed(self, res: Any) -> BaseException:
        """The exception for a statement's error result (as psycopg raises it)."""
        error = errors.error_from_result(res, encoding=self.encoding)
        if error.sqlstate == MISSING_STATEMENT:  # the server's statements were dropped behind our back
            self.prepared.clear()
            self.columns.clear()
        self.error = self.error or error
        return error

    def rows(self, res: Any, statement: bytes) -> list[dict[str, Any]]:
        """A result of prepared ``statement``: its rows, as dicts by column name
        (a prepared statement's columns never change: the server refuses to)."""
        if not res.nfields:
            return []
        names = self.columns.get(statement)
        if names is None:
            names = self.columns[statement] = [res.fname(i).decode(self.encoding) for i in range(res.nfields)]
        with self.loading:
            self.loader.set_pgresult(res)
            rows = self.loader.load_rows(0, res.ntuples, tuple)
        return [dict(zip(names, row, strict=True)) for row in rows]

    # -- failures -------------------------------------------------------------------
    def _guarded(self, call: Any, *args: Any) -> Any:
        """A libpq call; if it fails (the connection did), the connection is closed."""
        try:
            return call(*args)
        except psycopg.Error:
            self.abandon()
            raise

    def abandon(self) -> None:
        """Close the connection: its state is unknown (its owner reconnects)."""
        self.sent = []
        self.prepared.clear()
        self.columns.clear()
        self.conn.close()  # (idempotent)
