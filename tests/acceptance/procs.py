"""Helpers for tests that drive real `stepstone worker` processes."""

from __future__ import annotations

import sqlite3

import stepstone as ss
from stepstone.store import make_store

from ..polling import wait_for

__all__ = ["client", "completed", "create_ledger", "leased_count", "ledger", "migrated", "wait_for"]


def create_ledger(path: str) -> None:
    """An empty side-effect ledger (WAL: worker processes append to it concurrently)."""
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("CREATE TABLE ledger (run_id TEXT, step TEXT, phase TEXT, pid INT, at REAL, token TEXT)")


def ledger(env: dict[str, str]) -> list[tuple[str, str, str, int]]:
    """``(run_id, step, phase, pid)`` rows in the order the side effects happened."""
    with sqlite3.connect(env["LEDGER_PATH"], timeout=30) as conn:
        return conn.execute("SELECT run_id, step, phase, pid FROM ledger ORDER BY rowid").fetchall()


def client(env: dict[str, str]) -> ss.App:
    """An app without the workflow's code, on the workers' database."""
    return ss.App("client", database_url=env["STEPSTONE_DATABASE_URL"])


def leased_count(url: str) -> int:
    """Queue items some worker holds a lease on, read straight from the database."""
    if url.startswith("sqlite:"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            return int(conn.execute("SELECT COUNT(*) FROM queue WHERE owner IS NOT NULL").fetchone()[0])
    import psycopg

    with psycopg.connect(url) as pg:
        row = pg.execute("SELECT COUNT(*) FROM queue WHERE owner IS NOT NULL").fetchone()
        return int(row[0]) if row else 0


def completed(app: ss.App, limit: int = 1000) -> int:
    return len(app.runs.list(status="completed", limit=limit))


def migrated(url: str) -> None:
    store = make_store(url)
    store.migrate()
    store.close()
