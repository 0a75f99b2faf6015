"""The plans of a lease pass's partition reads (issue 18: flat in queue depth).

A lease pass reads a partition's first due items in queue order and, settling
it, the partition's earliest times. Both must stay index seeks that read a few
entries however deep the queue is: a sequential scan or a sort of the
partition's items made a lease pass cost ~1 s with a million queued runs. These
tests EXPLAIN the statements as the store sends them, over a deep partition,
on both databases, so a change to the query or the indexes cannot silently
bring that back. SQLite plans without statistics (nothing runs ANALYZE on it);
PostgreSQL with them, as autovacuum keeps them (without any, it guesses a few
rows per partition and may sort them: see docs/benchmarks.md).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

import pytest

from stepstone.store import make_store
from stepstone.store.sqlbase import Dialect

DEPTH = 50_000  # deep enough that a scan or a sort is not the cheap plan
LEASE_READS: dict[str, dict[str, Any]] = {
    "partition_items": {"key": "f", "now": 1e10, "limit": 26},
    "partition_times": {"key": "f", "now": 1e10},
}
Plans = Callable[[str], list[str]]


def sqlite_plans(path: str) -> Plans:
    from stepstone.store.sqlite import DIALECT

    conn = sqlite3.connect(path)
    conn.executemany(
        "INSERT INTO queue (run_id, function_id, partition_key, available_at, sort_at) VALUES (?, 'f', 'f', 1, ?)",
        ((f"r{i}", float(i)) for i in range(DEPTH)),
    )
    conn.commit()

    def plan(name: str) -> list[str]:
        rows = conn.execute("EXPLAIN QUERY PLAN " + DIALECT.sql(name), LEASE_READS[name]).fetchall()
        return [str(row[3]) for row in rows]

    return plan


def postgres_plans(url: str) -> Plans:
    import psycopg

    from stepstone.store.postgres import DIALECT as PG  # type: ignore[import-not-found,unused-ignore]

    dialect: Dialect = PG
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO queue (run_id, function_id, partition_key, available_at, sort_at) "
            "SELECT 'r' || g, 'f', 'f', 1, g FROM generate_series(1, %(depth)s::int) g",
            {"depth": DEPTH},
        )
        conn.execute("ANALYZE queue")  # as autovacuum does after a bulk insert

    def plan(name: str) -> list[str]:
        with psycopg.connect(url) as conn:
            rows = conn.execute(("EXPLAIN " + dialect.sql(name)).encode(), LEASE_READS[name]).fetchall()
        return [str(row[0]).strip() for row in rows]

    return plan


@pytest.fixture
def plans(db_url: str) -> Plans:
    store = make_store(db_url)
    store.migrate()
    store.close()
    if db_url.startswith("sqlite:"):
        return sqlite_plans(db_url.removeprefix("sqlite:///"))  # no statistics: nothing runs ANALYZE
    return postgres_plans(db_url)


def scans_or_sorts(plan: list[str]) -> list[str]:
    """The plan lines that read a whole table or sort: the cost that grows with depth."""
    bad = ("SCAN queue", "TEMP B-TREE", "Seq Scan", "Sort")
    return [line for line in plan if any(word in line for word in bad)]


def test_a_partitions_due_items_are_read_in_index_order(plans: Plans) -> None:
    plan = plans("partition_items")
    assert scans_or_sorts(plan) == [], plan
    assert any("queue_by_partition_order" in line for line in plan), plan


def test_a_partitions_times_are_index_seeks(plans: Plans) -> None:
    plan = plans("partition_times")
    assert scans_or_sorts(plan) == [], plan
    assert any("INDEX" in line.upper() for line in plan), plan
