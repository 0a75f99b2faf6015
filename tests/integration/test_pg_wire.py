"""PostgreSQL's statement path below psycopg's cursor (``store/pgwire.py``),
counted rather than timed: a statement is prepared once per connection and
then only bound and executed, no psycopg cursor or pipeline object is made
on the hot path, and the record of prepared statements agrees with the
server's after every kind of failure (an aborted pipeline, a skipped
``Parse``, the cap on prepared statements). Errors keep psycopg's classes and
diagnostics, and a statement error an operation swallowed still fails its
transaction."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import psycopg.errors
import pytest
from psycopg.rows import dict_row

from stepstone.errors import LeaseLostError, StoreError
from stepstone.store import pgwire
from stepstone.store.pgerrors import translate
from stepstone.store.pgpipeline import run_alone, run_together
from stepstone.store.postgres import DIALECT, PgTx, PostgresStore, _notify_if_woken
from stepstone.store.rows import Fence

from ..batches import checkpoint, group_commit, stored_steps
from .test_large_payloads import leased

Op = Callable[[Any], Any]


@pytest.fixture
def store(pg_url: str) -> Iterator[PostgresStore]:
    """One writer: every write goes over the same connection."""
    store = PostgresStore.from_url(pg_url + "?writers=1")
    yield store
    store.close()


@pytest.fixture
def conn(pg_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(pg_url, autocommit=True, row_factory=dict_row) as conn:
        yield conn


def alone(conn: Any, op: Op) -> tuple[bool, Any]:
    return run_alone(conn, op, lambda c: PgTx(c, DIALECT), _notify_if_woken, translate)


def server_statements(conn: Any) -> set[bytes]:
    """The names of the statement path's prepared statements, as the server has them."""
    ok, names = alone(conn, lambda tx: [r["name"] for r in tx.conn.execute(LIST).fetchall()])
    assert ok, names
    return {name.encode() for name in names}


LIST = "SELECT name FROM pg_prepared_statements WHERE name LIKE 'ss%'"


def agrees(conn: Any) -> None:
    """The wire's record of prepared statements is the server's (listed
    twice: the first listing may prepare its own statements)."""
    server_statements(conn)
    assert set(pgwire.Wire.of(conn).prepared.values()) == server_statements(conn)


def _selecting(text: str, params: dict[str, Any]) -> Op:
    """An operation reading the one row of ``text``."""
    return lambda tx: tx.conn.execute(text, params).fetchone()


def test_a_statement_is_prepared_once_then_only_executed(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    fences = leased(store, 2)
    prepares: list[bytes] = []
    prepare = pgwire.Wire._prepare

    def counted(wire: pgwire.Wire, key: Any) -> bytes:
        prepares.append(key[0].query)
        return prepare(wire, key)

    cursors = pipelines = 0

    def no_cursor(*args: Any, **kwargs: Any) -> Any:
        nonlocal cursors
        cursors += 1
        return cursor(*args, **kwargs)

    def no_pipeline(*args: Any, **kwargs: Any) -> Any:
        nonlocal pipelines
        pipelines += 1
        return pipeline(*args, **kwargs)

    cursor, pipeline = psycopg.Connection.cursor, psycopg.Connection.pipeline
    monkeypatch.setattr(pgwire.Wire, "_prepare", counted)
    monkeypatch.setattr(psycopg.Connection, "cursor", no_cursor)
    monkeypatch.setattr(psycopg.Connection, "pipeline", no_pipeline)
    store.transact_sync(checkpoint(fences[0], "first"))
    first = len(prepares)
    assert first >= 1  # the checkpoint's statement (BEGIN and COMMIT were, by the lease)
    for n in range(10):  # lone commits, then group commits: nothing prepared again
        store.transact_sync(checkpoint(fences[0], f"s{n}"))
        group_commit(store, [checkpoint(f, f"g{n}") for f in fences])
    assert prepares[first:] == []
    assert (cursors, pipelines) == (0, 0)  # nothing of psycopg's per-statement machinery
    assert stored_steps(store, fences[1].run_id) == [f"g{n}" for n in range(10)]


def test_a_prepare_skipped_by_an_aborted_pipeline_is_not_counted(conn: Any) -> None:
    """A statement used for the first time after a failing one in the same
    pipeline: the server skipped its ``Parse``. The record must not count it
    as prepared (a later use would fail: "prepared statement does not
    exist"); it is prepared on its next use."""
    first_use = "SELECT %(n)s::int + 1 AS m"

    def failing(tx: Any) -> None:
        tx.conn.execute("SELECT 1 / %(zero)s::int AS x", {"zero": 0})
        tx.conn.execute(first_use, {"n": 1})

    ok, error = alone(conn, failing)
    assert not ok and isinstance(error.__cause__, psycopg.errors.DivisionByZero)
    agrees(conn)
    ok, row = alone(conn, lambda tx: tx.conn.execute(first_use, {"n": 41}).fetchone())
    assert ok and row == {"m": 42}, row
    agrees(conn)


def test_a_batch_refused_midway_keeps_the_record_true(store: PostgresStore, pg_url: str) -> None:
    """A stale checkpoint first in a group commit: the pipelined attempt
    aborts before the other checkpoints' statements are parsed; the batch
    runs again with savepoints (psycopg's path); the statement path's record
    of prepared statements still matches the server's afterwards."""
    fences = leased(store, 3)
    stale = Fence(run_id=fences[0].run_id, owner="w", epoch=fences[0].epoch - 1)
    refused, *committed = group_commit(
        store, [checkpoint(stale, "x"), checkpoint(fences[1], "b"), checkpoint(fences[2], "c")]
    )
    assert isinstance(refused, LeaseLostError)
    assert not [c for c in committed if isinstance(c, BaseException)]
    [wire] = _writer_wires(store)
    for _ in range(2):  # the first listing may prepare its own statements
        names = store.transact_sync(_listed)
    assert {name.encode() for name in names} == set(wire.prepared.values())
    store.transact_sync(checkpoint(fences[1], "again"))
    assert sorted(stored_steps(store, fences[1].run_id)) == ["again", "b"]


class _UserSql:
    """An operation that runs a user's SQL (``step.transaction``): psycopg's path."""

    user_sql = True

    def __init__(self, fail: bool) -> None:
        self.fail = fail

    def __call__(self, tx: Any) -> None:
        tx.conn.execute("SELECT 1/0" if self.fail else "SELECT 1")


def test_psycopgs_deallocation_on_its_path_does_not_fail_the_next_write(store: PostgresStore) -> None:
    """psycopg's own path (a user's SQL, a refused batch's savepoints) prepares
    a statement it ran five times; a ``ROLLBACK`` it then runs for the first
    time makes it deallocate every prepared statement of the connection, the
    statement path's too. The next write that meets a statement gone runs
    again (it failed before its ``COMMIT``) instead of failing its caller."""
    fences = leased(store, 1)
    for _ in range(6):
        store.transact_sync(_UserSql(fail=False))
    with pytest.raises(StoreError, match="division by zero"):
        store.transact_sync(_UserSql(fail=True))
    store.transact_sync(checkpoint(fences[0], "after"))
    assert stored_steps(store, fences[0].run_id) == ["after"]


def _listed(tx: Any) -> list[str]:
    return [r["name"] for r in tx.conn.execute(LIST).fetchall()]


def _writer_wires(store: PostgresStore) -> list[pgwire.Wire]:
    def wire_of(tx: Any) -> pgwire.Wire:
        wire = tx.conn
        assert isinstance(wire, pgwire.Wire)
        return wire

    return [store.transact_sync(wire_of)]


def test_prepared_statements_past_the_cap_are_closed(conn: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pgwire, "MAX_PREPARED", 4)
    for n in range(12):  # twelve texts: the oldest are closed on the server as well
        ok, row = alone(conn, _selecting(f"SELECT {n} AS n", {}))
        assert ok and row == {"n": n}
        assert len(pgwire.Wire.of(conn).prepared) <= 4
    agrees(conn)
    assert len(server_statements(conn)) <= 4


def test_a_statement_error_keeps_psycopgs_class_and_diagnostics(conn: Any) -> None:
    def duplicate(tx: Any) -> None:
        tx.conn.execute("CREATE TEMP TABLE t (k int PRIMARY KEY)")
        tx.conn.execute("INSERT INTO t VALUES (%(k)s), (%(k)s)", {"k": 1})

    ok, error = alone(conn, duplicate)
    assert not ok and isinstance(error, StoreError)
    cause = error.__cause__
    assert isinstance(cause, psycopg.errors.UniqueViolation)
    assert cause.sqlstate == "23505" and cause.diag.constraint_name == "t_pkey"
    agrees(conn)  # and the connection goes on


def test_a_statement_error_an_operation_swallowed_fails_its_transaction(conn: Any) -> None:
    """The server aborted the transaction at the error: its ``COMMIT`` could
    only roll back. The operation's caller hears of the error; nothing it
    wrote stays."""

    def swallowing(tx: Any) -> str:
        tx.conn.execute("CREATE TABLE kept (k int)")
        try:
            tx.conn.execute("SELECT 1 / %(zero)s::int AS x", {"zero": 0}).fetchone()
        except psycopg.errors.DivisionByZero:
            pass
        return "done"

    ok, error = alone(conn, swallowing)
    assert not ok and isinstance(error.__cause__, psycopg.errors.DivisionByZero)
    ok, row = alone(conn, lambda tx: tx.conn.execute("SELECT to_regclass('kept') AS t", {}).fetchone())
    assert ok and row == {"t": None}


def test_a_group_commit_on_a_bare_connection_prepares_per_parameter_types(conn: Any) -> None:
    """The same text with an int and with a None (another parameter type as
    psycopg dumps them) is two prepared statements; each is used again."""
    text = "SELECT %(v)s::bigint AS v"
    ops = [_selecting(text, {"v": v}) for v in (1, None, 2, None)]
    outcomes = run_together(conn, ops, lambda c: PgTx(c, DIALECT), _notify_if_woken, translate)
    assert outcomes == [(True, {"v": 1}), (True, {"v": None}), (True, {"v": 2}), (True, {"v": None})]
    keys = [key for key in pgwire.Wire.of(conn).prepared if key[0] is pgwire.statement(text)]
    assert len(keys) == 2
    agrees(conn)


class CutShort(BaseException):
    """What an operation may raise past ``except Exception`` (a signal)."""


def test_a_transaction_cut_short_closes_its_connection(pg_url: str, conn: Any) -> None:
    """Statements queued, then an operation's ``BaseException``: their results
    would answer the next transaction's statements, so the connection is
    closed (its owner reconnects) and nothing was committed."""

    def cut(tx: Any) -> None:
        tx.conn.execute("CREATE TABLE cut (k int)")
        raise CutShort

    with pytest.raises(CutShort):
        alone(conn, cut)
    assert conn.closed
    with psycopg.connect(pg_url, autocommit=True, row_factory=dict_row) as other:
        ok, row = alone(other, _selecting("SELECT to_regclass('cut') AS t", {}))
    assert ok and row == {"t": None}


def test_placeholders_become_numbered_parameters_once_per_text() -> None:
    text = "SELECT %(a)s, %(b)s, %(a)s, '50%%' WHERE x LIKE 'y%%'"
    compiled = pgwire.statement(text)
    assert compiled.query == b"SELECT $1, $2, $1, '50%' WHERE x LIKE 'y%'"
    assert compiled.names == ("a", "b")
    assert pgwire.statement(text) is compiled
    verbatim = pgwire.statement("SELECT '%%'", pyformat=False)  # run without parameters: as it is
    assert verbatim.query == b"SELECT '%%'" and verbatim.names == ()
    assert pgwire.statement(b"SELECT %(a)s").query == b"SELECT $1"  # bytes, as psycopg takes them


def test_a_repeated_placeholder_is_one_parameter_on_the_server(conn: Any) -> None:
    ok, row = alone(conn, _selecting("SELECT %(v)s::int + %(v)s::int AS twice, '5%%' AS pct", {"v": 4}))
    assert ok and row == {"twice": 8, "pct": "5%"}


def test_results_read_on_other_threads_get_their_own_rows(conn: Any) -> None:
    """A checkpoint's cancel flag is read after its commit, on the caller's
    thread, while the writer's thread reads (and sends) the next
    transaction's: each result decodes its own rows. (Thread switches forced
    every microsecond, so that decoding interleaves.)"""
    ok, results = alone(
        conn, lambda tx: [tx.conn.execute(f"SELECT {n} AS n, 'r{n}' AS s", {}) for n in range(2)]
    )
    assert ok
    wrong: list[Any] = []

    def read(n: int) -> None:
        for _ in range(3000):
            result = results[n]
            result._rows, result._pos = None, 0  # decode again each time
            row = result.fetchone()
            if row != {"n": n, "s": f"r{n}"}:
                wrong.append(row)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=read, args=(n,)) for n in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert wrong == []


def _selecting_all(text: str, params: dict[str, Any]) -> Op:
    return lambda tx: tx.conn.execute(text, params).fetchall()


def _scans(tx: Any, text: str, params: dict[str, Any]) -> tuple[int, int]:
    """The sequential and index scans of ``t`` that running ``text`` cost
    (``pg_stat_xact_user_tables``, read around it: its counts not yet flushed)."""
    count = (
        "SELECT seq_scan, COALESCE(idx_scan, 0) AS idx_scan FROM pg_stat_xact_user_tables WHERE relname = 't'"
    )
    before = tx.conn.execute(count, {}).fetchone()
    assert len(tx.conn.execute(text, params).fetchall()) == 2
    after = tx.conn.execute(count, {}).fetchone()
    return after["seq_scan"] - before["seq_scan"], after["idx_scan"] - before["idx_scan"]


def test_a_statement_planned_per_call_is_never_prepared_and_sees_its_table_grow(conn: Any) -> None:
    """A prepared statement's plan turns generic after five calls and stays so
    while its table grows: planned on a nearly empty table, a read by key keeps
    a sequential scan (a lease's ``step_index`` on a new database cost 5-15 ms
    at 15,000 steps). One whose text starts with ``PLANNED_PER_CALL`` is sent
    unnamed, planned with the table's size of the moment."""
    conn.execute("CREATE TABLE t (id TEXT PRIMARY KEY, v TEXT)")
    conn.execute("INSERT INTO t SELECT 'k' || g, 'v' FROM generate_series(1, 3) AS g")
    conn.execute("ANALYZE t")
    select = "SELECT v FROM t WHERE id IN (%(a)s, %(b)s)"
    per_call = pgwire.PLANNED_PER_CALL.decode() + ": a test)\n" + select
    assert pgwire.statement(per_call).per_call and not pgwire.statement(select).per_call
    params = {"a": "k1", "b": "k2"}
    server_statements(conn)  # (the first listing prepares the transaction's own statements)
    before = server_statements(conn)
    for _ in range(7):
        for text in (select, per_call):
            ok, _ = alone(conn, _selecting_all(text, params))
            assert ok
    prepared = server_statements(conn) - before
    assert len(prepared) == 1  # the plain one only
    assert all(stmt.query != per_call.encode() for stmt, _ in pgwire.Wire.of(conn).prepared)
    conn.execute("INSERT INTO t SELECT 'g' || g, 'v' FROM generate_series(1, 50000) AS g")
    ok, generic = alone(conn, lambda tx: _scans(tx, select, params))
    assert ok and generic[0] == 1  # the trap: the generic plan made on 3 rows scans 50,003
    ok, planned = alone(conn, lambda tx: _scans(tx, per_call, params))
    assert ok and planned[0] == 0 and planned[1] >= 1  # planned now: the key's index
    agrees(conn)


def test_a_leases_step_index_is_planned_per_call() -> None:
    text = DIALECT.sql("step_index", {"run_ids": 3})
    assert pgwire.statement(text, DIALECT.pyformat).per_call


def test_a_store_reads_whether_a_commit_changed_data_only_once_asked(store: PostgresStore) -> None:
    """Telling whether a transaction changed data reads every statement's
    status after its commit: a store whose ``commits`` nobody has read keeps
    no results for it; once read, it counts the commits that changed data."""
    seen: list[PgTx] = []

    def lower(key: str) -> Callable[[Any], None]:
        def op(tx: Any) -> None:
            seen.append(tx)
            tx.lower_partition(key, "f", None, 1.0)  # writes a row every time

        return op

    store.transact_sync(lower("p1"))
    assert not seen[-1].counting and seen[-1].results == []
    before = store.commits
    store.transact_sync(lower("p2"))
    assert seen[-1].counting and seen[-1].results
    assert store.commits - before == 1
    store.transact_sync(lambda tx: tx.get_run("nobody"))  # changes nothing
    assert store.commits - before == 1
