"""An upgrade keeps what the database holds: every migration, applied to a
database that the migrations before it made and that holds rows in every
table, leaves each row with the values it had (in the columns that outlive
it), on SQLite and on PostgreSQL.

Users upgrade Stepstone with runs in flight, and a migration that rebuilds a
table (SQLite cannot change a key or a constraint in place: ``0026_pages``
copies three tables) loses whatever its ``INSERT ... SELECT`` forgets. The
canonical-schema tests check the shape a fresh database ends with; these
check the data an old one carries through. The rows are made from each
column's declared type (no knowledge of what a table means), so a table or a
column added by a later migration is covered by the same test.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from stepstone.store.migrate import CREATE_LEDGER, migration_files
from stepstone.store.postgres import LEDGER
from stepstone.store.sqlite import _statements

ROWS = 2  # per table (integers 0 and 1: unique, and what every flag's CHECK admits)
Rows = dict[str, set[tuple[Any, ...]]]  # per table: its rows, columns in the order of their sorted names
Columns = dict[str, list[str]]  # per table: its columns' names

# A migration that changes rows on purpose: (migration, table) -> why.
MEANT: dict[tuple[str, str], str] = {}


def _names(dialect: str) -> list[str]:
    return [name for name, _ in migration_files(dialect)]


# -- SQLite ------------------------------------------------------------------------
def _sqlite_apply(conn: sqlite3.Connection, migrations: list[tuple[str, str]]) -> None:
    """``migrations`` as ``SqliteStore.migrate`` applies them: each in a transaction, recorded."""
    conn.execute(CREATE_LEDGER)
    for name, sql in migrations:
        conn.execute("BEGIN IMMEDIATE")
        for statement in _statements(sql):
            conn.execute(statement)
        conn.execute("INSERT INTO schema_migrations (name, applied_at) VALUES (?, 0)", (name,))
        conn.execute("COMMIT")


def _sqlite_tables(conn: sqlite3.Connection) -> dict[str, list[tuple[str, str]]]:
    """Each table's columns (name, declared type), ledger and SQLite's own left out."""
    tables = [
        name
        for (name,) in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' "
            "AND name != 'schema_migrations'"
        )
    ]
    return {t: [(c[1], c[2].upper()) for c in conn.execute(f"PRAGMA table_info({t})")] for t in tables}


def _sqlite_value(kind: str, column: str, i: int) -> Any:
    if "INT" in kind:
        return i
    if any(word in kind for word in ("REAL", "FLOA", "DOUB")):
        return i + 0.5
    if "BLOB" in kind:
        return f"{column}-{i}".encode()
    return f"{column}-{i}"


def _sqlite_fill(conn: sqlite3.Connection) -> None:
    for table, columns in _sqlite_tables(conn).items():
        names = [name for name, _ in columns]
        for i in range(ROWS):
            values = [_sqlite_value(kind, name, i) for name, kind in columns]
            conn.execute(
                f"INSERT INTO {table} ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})",
                values,
            )


def _sqlite_rows(conn: sqlite3.Connection) -> Rows:
    rows: Rows = {}
    for table, columns in _sqlite_tables(conn).items():
        names = sorted(name for name, _ in columns)
        rows[table] = {tuple(r) for r in conn.execute(f"SELECT {', '.join(names)} FROM {table}")}
    return rows


# -- PostgreSQL ----------------------------------------------------------------------
def _pg_apply(conn: psycopg.Connection[Any], migrations: list[tuple[str, str]]) -> None:
    """``migrations`` as ``PostgresStore.migrate`` applies them: each in a transaction, recorded."""
    conn.execute(LEDGER)
    for name, sql in migrations:
        with conn.transaction():
            conn.execute(sql.encode())
            conn.execute("INSERT INTO schema_migrations (name, applied_at) VALUES (%s, 0)", (name,))


def _pg_tables(conn: psycopg.Connection[Any]) -> dict[str, list[tuple[str, str]]]:
    tables: dict[str, list[tuple[str, str]]] = {}
    for table, column, kind in conn.execute(
        "SELECT table_name, column_name, data_type FROM information_schema.columns "
        "WHERE table_schema = current_schema() AND table_name != 'schema_migrations' "
        "AND table_name IN (SELECT table_name FROM information_schema.tables "
        "                   WHERE table_schema = current_schema() AND table_type = 'BASE TABLE') "
        "ORDER BY table_name, ordinal_position"
    ):
        tables.setdefault(table, []).append((column, kind))
    return tables


def _pg_value(kind: str, column: str, i: int) -> Any:
    if kind in ("integer", "bigint", "smallint"):
        return i
    if kind in ("double precision", "real", "numeric"):
        return i + 0.5
    if kind == "boolean":
        return i % 2 == 1
    if kind == "bytea":
        return f"{column}-{i}".encode()
    if kind in ("json", "jsonb"):
        return Jsonb({"column": column, "i": i})
    return f"{column}-{i}"


def _pg_fill(conn: psycopg.Connection[Any]) -> None:
    for table, columns in _pg_tables(conn).items():
        names = [name for name, _ in columns]
        for i in range(ROWS):
            values = [_pg_value(kind, name, i) for name, kind in columns]
            conn.execute(
                f"INSERT INTO {table} ({', '.join(names)}) OVERRIDING SYSTEM VALUE "
                f"VALUES ({', '.join(['%s'] * len(names))})",
                values,
            )


def _pg_rows(conn: psycopg.Connection[Any]) -> Rows:
    rows: Rows = {}
    for table, columns in _pg_tables(conn).items():
        names = sorted(name for name, _ in columns)
        quoted = ", ".join(
            f"{n}::text" for n in names
        )  # (json and floats compared as the server prints them)
        rows[table] = {tuple(r) for r in conn.execute(f"SELECT {quoted} FROM {table}")}
    return rows


# -- the property ------------------------------------------------------------------
def _changed(before: Rows, before_columns: Columns, after: Rows, after_columns: Columns) -> dict[str, str]:
    """What a migration lost or changed, by table: each table of ``before``
    that outlives it, its rows projected on the columns that outlive it."""
    changed = {}
    for table, rows in before.items():
        if table not in after:
            continue  # (dropped: the migration says so in as many words)
        old, new = sorted(before_columns[table]), sorted(after_columns[table])
        common = [c for c in old if c in new]
        was = {tuple(row[old.index(c)] for c in common) for row in rows}
        now = {tuple(row[new.index(c)] for c in common) for row in after[table]}
        if was != now:
            changed[table] = f"lost {sorted(was - now, key=repr)}, gained {sorted(now - was, key=repr)}"
    return changed


def _columns(tables: dict[str, list[tuple[str, str]]]) -> Columns:
    return {table: [name for name, _ in columns] for table, columns in tables.items()}


def _check(name: str, before: Rows, before_columns: Columns, after: Rows, after_columns: Columns) -> None:
    assert before and all(
        len(rows) == ROWS for rows in before.values()
    )  # (every table filled: the test bites)
    changed = _changed(before, before_columns, after, after_columns)
    unmeant = {table: why for table, why in changed.items() if (name, table) not in MEANT}
    assert not unmeant, f"{name} changed rows an older database held: {unmeant}"


@pytest.mark.parametrize("index", range(1, len(_names("sqlite"))), ids=_names("sqlite")[1:])
def test_each_sqlite_migration_keeps_the_rows_an_older_database_holds(tmp_path: Path, index: int) -> None:
    migrations = migration_files("sqlite")
    conn = sqlite3.connect(tmp_path / "old.db", isolation_level=None)
    try:
        _sqlite_apply(conn, migrations[:index])
        conn.execute("BEGIN")
        _sqlite_fill(conn)
        conn.execute("COMMIT")
        columns, before = _columns(_sqlite_tables(conn)), _sqlite_rows(conn)
        _sqlite_apply(conn, migrations[index : index + 1])
        _check(migrations[index][0], before, columns, _sqlite_rows(conn), _columns(_sqlite_tables(conn)))
    finally:
        conn.close()


@pytest.mark.parametrize("index", range(1, len(_names("postgres"))), ids=_names("postgres")[1:])
def test_each_postgres_migration_keeps_the_rows_an_older_database_holds(empty_url: str, index: int) -> None:
    migrations = migration_files("postgres")
    with psycopg.connect(empty_url, autocommit=True) as conn:
        _pg_apply(conn, migrations[:index])
        with conn.transaction():
            _pg_fill(conn)
        columns, before = _columns(_pg_tables(conn)), _pg_rows(conn)
        _pg_apply(conn, migrations[index : index + 1])
        _check(migrations[index][0], before, columns, _pg_rows(conn), _columns(_pg_tables(conn)))
