"""A user's own table in the Stepstone database, for transactional-step tests
(on PostgreSQL in a schema of its own, as the README advises)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

PG_TABLE = "shop.subscriptions"
SQLITE_TABLE = "subscriptions"


def table_of(db_url: str) -> str:
    return SQLITE_TABLE if db_url.startswith("sqlite:") else PG_TABLE


def create_table(db_url: str) -> str:
    """Create the user's table; returns its name."""
    if db_url.startswith("sqlite:"):
        with sqlite3.connect(db_url.removeprefix("sqlite:///")) as conn:
            conn.execute(f"CREATE TABLE {SQLITE_TABLE} (user_id TEXT NOT NULL, attempt INT)")
        return SQLITE_TABLE
    import psycopg

    with psycopg.connect(db_url, autocommit=True) as pg:
        pg.execute("CREATE SCHEMA shop")
        pg.execute(f"CREATE TABLE {PG_TABLE} (user_id TEXT NOT NULL, attempt INT)")
    return PG_TABLE


def inserter(db_url: str) -> Callable[..., str]:
    """A transaction step's function: insert one row on ``conn``, return the user id."""
    table = table_of(db_url)
    mark = "?" if db_url.startswith("sqlite:") else "%s"

    def insert(conn: Any, user_id: str, attempt: int = 0) -> str:
        conn.execute(f"INSERT INTO {table} (user_id, attempt) VALUES ({mark}, {mark})", (user_id, attempt))
        return user_id

    return insert


def insert_and_commit(db_url: str, user_id: str) -> str:
    """What a ``step.run`` does instead: its own connection, its own commit."""
    if db_url.startswith("sqlite:"):
        conn = sqlite3.connect(db_url.removeprefix("sqlite:///"), timeout=30)
        try:
            with conn:
                inserter(db_url)(conn, user_id)
        finally:
            conn.close()
        return user_id
    import psycopg

    with psycopg.connect(db_url) as pg:  # commits on leaving the block
        inserter(db_url)(pg, user_id)
    return user_id


def rows(db_url: str) -> list[tuple[Any, ...]]:
    from .conftest import query  # not at import: worker processes import this module too

    return query(db_url, f"SELECT user_id, attempt FROM {table_of(db_url)} ORDER BY attempt")
