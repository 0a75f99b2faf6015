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

import re
import sqlite3
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from stepstone.store import make_store
from stepstone.store.sqlbase import Dialect

DEPTH = 50_000  # deep enough that a scan or a sort is not the cheap plan
LEASE_READS: dict[str, dict[str, Any]] = {
    "partition_items": {"key": "f", "now": 1e10, "limit": 26},
    "partition_times": {"key": "f", "now": 1e10},
    # a pass's take of a partition's chosen items (three of them), set-based
    "take_items": {"owner": "w", "until": 1e10, "run_ids_0": "r1", "run_ids_1": "r3", "run_ids_2": "r5"},
    "mark_running": {
        "now": 1e10,
        "epoch": 1,
        "app_version": None,
        "run_ids_0": "r1",
        "run_ids_1": "r3",
        "run_ids_2": "r5",
    },
    "start_clock": {"now": 1e10, "run_ids_0": "r1", "run_ids_1": "r3", "run_ids_2": "r5"},
    # the three above in one statement (PostgreSQL: data-modifying CTEs)
    "take_runs": {
        "owner": "w",
        "until": 1e10,
        "now": 1e10,
        "app_version": None,
        "run_ids_0": "r1",
        "run_ids_1": "r3",
        "run_ids_2": "r5",
    },
    "due_ahead": {"key": "f", "now": 1e10, "queued_ids_0": "r1"},
    # a send's direct start: take_runs unless a due item waits before its runs
    "take_runs_in_order": {
        "owner": "w",
        "key": "f",
        "until": 1e10,
        "now": 1e10,
        "app_version": None,
        "run_ids_0": "r1",
        "queued_ids_0": "r1",
    },
    # a send's direct start written taken: its queue-order check and its partition's settle folded in
    "record_event_started": {
        "key": "event:e1",
        "ref": "e1",
        "expires_at": 1e10,
        "now": 1e10,
        "id": "e1",
        "name": "n",
        "data": "{}",
        "ts": 1,
        "trace": None,
        "run_id": "new",
        "function_id": "f",
        "status": "queued",
        "event_ids": '["e1"]',
        "created_at": 1e10,
        "queue_spec": None,
        "partition_key": "f",
        "ckey": None,
        "available_at": 1e10,
        "sort_at": 1e10,
        "start_deadline": None,
        "finish_timeout": None,
        "ckey1": None,
        "limit1": None,
        "ckey2": None,
        "limit2": None,
        "throttle_key": None,
        "owner": "w",
        "until": 1e10 + 60,
        "taken_at": 1e10,
        "app_version": None,
    },
}
LIST_PAGE = {
    "function_id": None,
    "any_status": 0,
    "statuses_0": "queued",
    "since": None,
    "until": None,
    "before_id": None,
    "app_version": None,
    "limit": 100,
}
STEP_READS: dict[str, dict[str, Any]] = {  # a read's steps, sent with the read of its runs
    "steps_of_event_runs": {**LIST_PAGE, "event_id": "e7"},
    "steps_if_ended": {"run_id": "r7", "statuses_0": "completed", "statuses_1": "failed"},
}
QUEUE_READS: dict[str, dict[str, Any]] = {  # the queue's readers of the indexes migration 0026 changed
    "timed_out": {"now": 1e10, "limit": 100},  # partial deadline indexes
    "next_deadline": {},
    "run_backlog": {"now": 0.5},  # queue_by_due dropped: each partition's due items
    "wake_ckey": {"ckey": "k7", "now": 1e10},  # partitions_by_ckey partial
}
READS = {**LEASE_READS, **STEP_READS, **QUEUE_READS}
Plans = Callable[[str], list[str]]
# one item in a hundred has a deadline, one in a hundred has a finish deadline
DEADLINES = (
    "UPDATE queue SET start_deadline = CASE WHEN run_id LIKE '%00' THEN 5 END,"
    " finish_deadline = CASE WHEN run_id LIKE '%50' THEN 5 END"
)
PARTITION = "INSERT INTO partitions (key, function_id, next_at) VALUES ('f', 'f', 1)"
# other functions' partitions, one in ten of a concurrency key
PARTITIONS = "INSERT INTO partitions (key, function_id, ckey, next_at) VALUES ({key}, 'g', {ckey}, 1)"
PARTITION_COUNT = 5000


def sqlite_plans(path: str) -> Plans:
    from stepstone.store.sqlite import DIALECT

    conn = sqlite3.connect(path)
    conn.executemany(  # DEPTH due runs never leased, DEPTH sleeping ones ahead of them
        "INSERT INTO queue (run_id, function_id, partition_key, available_at, sort_at, fresh) "
        "VALUES (?, 'f', 'f', ?, ?, ?)",
        ((f"r{i}", 1.0 if i % 2 else 1e12, float(i), i % 2) for i in range(2 * DEPTH)),
    )
    conn.executemany(  # a step of every run, the runs' rows and an event of one
        "INSERT INTO steps (run_id, step_id, position, kind, status) VALUES (?, 's', 0, 'run', 'completed')",
        ((f"r{i}",) for i in range(2 * DEPTH)),
    )
    conn.executemany(
        "INSERT INTO runs (id, function_id, status, event_ids, created_at) VALUES (?, 'f', 'queued', '[]', 1)",
        ((f"r{i}",) for i in range(2 * DEPTH)),
    )
    conn.execute(
        "INSERT INTO events (seq, id, name, data, ts, received_at) VALUES (7, 'e7', 'n', '{}', 1, 1)"
    )
    conn.execute("INSERT INTO run_events (run_id, position, event_seq) VALUES ('r7', 0, 7)")
    conn.execute(DEADLINES)
    conn.execute(PARTITION)
    conn.executemany(
        PARTITIONS.format(key="?", ckey="?"),
        ((f"p{i}", None if i % 10 else f"k{i}") for i in range(PARTITION_COUNT)),
    )
    conn.commit()

    def plan(name: str) -> list[str]:
        rows = conn.execute("EXPLAIN QUERY PLAN " + DIALECT.sql(name, _lists(name)), READS[name]).fetchall()
        return [str(row[3]) for row in rows]

    return plan


def postgres_plans(url: str) -> Plans:
    import psycopg

    from stepstone.store.postgres import DIALECT as PG  # type: ignore[import-not-found,unused-ignore]

    dialect: Dialect = PG
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO queue (run_id, function_id, partition_key, available_at, sort_at, fresh) "
            "SELECT 'r' || g, 'f', 'f', CASE WHEN mod(g, 2) = 1 THEN 1 ELSE 1e12 END, g, mod(g, 2) "
            "FROM generate_series(1, 2 * %(depth)s::int) g",
            {"depth": DEPTH},
        )
        conn.execute(  # the queued runs' rows (take_runs joins them)
            "INSERT INTO runs (id, function_id, status, event_ids, created_at) "
            "SELECT 'r' || g, 'f', 'queued', '[]', 1 FROM generate_series(1, 2 * %(depth)s::int) g",
            {"depth": DEPTH},
        )
        conn.execute(  # a step of every run and an event of one
            "INSERT INTO steps (run_id, step_id, position, kind, status) "
            "SELECT 'r' || g, 's', 0, 'run', 'completed' FROM generate_series(1, 2 * %(depth)s::int) g",
            {"depth": DEPTH},
        )
        conn.execute(
            "INSERT INTO events (seq, id, name, data, ts, received_at) VALUES (7, 'e7', 'n', '{}', 1, 1)"
        )
        conn.execute("INSERT INTO run_events (run_id, position, event_seq) VALUES ('r7', 0, 7)")
        conn.execute(DEADLINES)
        conn.execute(PARTITION)
        conn.execute(
            PARTITIONS.format(key="'p' || g", ckey="CASE WHEN mod(g, 10) = 0 THEN 'k' || g END").replace(
                "VALUES (", "SELECT "
            )[:-1]
            + f" FROM generate_series(1, {PARTITION_COUNT}) g"
        )
        for table in ("queue", "runs", "steps", "events", "run_events", "partitions"):
            conn.execute(f"ANALYZE {table}".encode())  # as autovacuum does after a bulk insert

    def plan(name: str) -> list[str]:
        with psycopg.connect(url) as conn:
            rows = conn.execute(
                ("EXPLAIN " + dialect.sql(name, _lists(name))).encode(), READS[name]
            ).fetchall()
        return [str(row[0]).strip() for row in rows]

    return plan


def _lists(name: str) -> dict[str, int]:
    """The sizes of the lists in a read's parameters (``run_ids_0``, ``run_ids_1``...)."""
    return dict(Counter(m[1] for key in READS[name] if (m := re.fullmatch(r"(\w+)_\d+", key))))


@pytest.fixture
def plans(db_url: str) -> Plans:
    store = make_store(db_url)
    store.migrate()
    store.close()
    if db_url.startswith("sqlite:"):
        return sqlite_plans(db_url.removeprefix("sqlite:///"))  # no statistics: nothing runs ANALYZE
    return postgres_plans(db_url)


# where a subquery's plan starts or ends (SQLite: CO-ROUTINE ... SCAN; PostgreSQL: Subquery Scan)
SUBQUERY = re.compile(r"(CO-ROUTINE|Subquery Scan on|SCAN) (never_leased|resumed)\b")
SORTS = ("TEMP B-TREE", "Sort")  # SQLite, PostgreSQL
SCANS = ("SCAN queue", "Seq Scan")


def lines_with(plan: list[str], words: tuple[str, ...]) -> list[str]:
    return [line for line in plan if any(word in line for word in words)]


def branch(plan: list[str], name: str) -> list[str]:
    """The plan lines of the subquery ``name``, up to the next subquery's."""
    first = next(i for i, line in enumerate(plan) if (m := SUBQUERY.search(line)) and m[2] == name)
    rest = plan[first + 1 :]
    end = next((i for i, line in enumerate(rest) if SUBQUERY.search(line)), len(rest))
    return plan[first : first + 1 + end]


def test_a_partitions_never_leased_runs_are_read_in_index_order(plans: Plans) -> None:
    plan = plans("partition_items")
    assert lines_with(plan, SCANS) == [], plan
    fresh = branch(plan, "never_leased")
    assert lines_with(fresh, ("queue_by_partition_fresh",)), plan
    assert lines_with(fresh, SORTS) == [], plan  # read in order: no sort of the due runs


def test_a_partitions_resumed_runs_are_read_by_due_time(plans: Plans) -> None:
    plan = plans("partition_items")
    resumed = branch(plan, "resumed")
    # (partition_key, fresh, available_at): a range of the due ones (sleeping runs are not read)
    assert [line for line in resumed if re.search(r"queue_by_partition\b(?!_)", line)], plan
    assert any(re.search(r"fresh ?= ?", line) for line in resumed), plan
    assert any(re.search(r"available_at ?<", line) for line in resumed), plan


def test_a_partitions_times_are_index_seeks(plans: Plans) -> None:
    plan = plans("partition_times")
    assert lines_with(plan, SCANS + SORTS) == [], plan
    # the earliest future item is a seek past :now, not a pass over the partition
    seeks = [line for line in plan if "INDEX" in line.upper() or "Index Cond" in line]
    assert any(re.search(r"available_at ?> ?", line) for line in seeks), plan


@pytest.mark.parametrize("name", ["take_items", "mark_running", "start_clock"])
def test_a_pass_takes_its_chosen_items_by_key_whatever_the_depth(plans: Plans, name: str) -> None:
    """A partition's chosen items are taken in one statement each for the queue
    and the runs: found by primary key, never by a pass over the queue."""
    plan = plans(name)
    assert lines_with(plan, ("SCAN queue", "Seq Scan on queue", "SCAN runs", "Seq Scan on runs")) == [], plan
    assert lines_with(plan, SORTS) == [], plan


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_a_pass_takes_items_and_runs_in_one_statement_by_key_on_postgres(plans: Plans) -> None:
    """``take_runs`` joins the taken items to their runs by the runs' key (its
    collation named), never by a pass over either table."""
    plan = plans("take_runs")
    assert lines_with(plan, ("Seq Scan on queue", "Seq Scan on runs")) == [], plan
    assert lines_with(plan, ("runs_pkey",)), plan


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_a_direct_starts_take_checks_its_partition_by_index_on_postgres(plans: Plans) -> None:
    """``take_runs_in_order``: ``take_runs`` with the queue-order check
    (``due_ahead``) folded in: the items and runs by key, the check planned as
    it is alone (a read that stops at the partition's first due item)."""
    plan, check = plans("take_runs_in_order"), plans("due_ahead")
    assert lines_with(plan, ("Seq Scan on runs",)) == [], plan
    assert lines_with(plan, ("queue_pkey",)) and lines_with(plan, ("runs_pkey",)), plan
    assert len(lines_with(plan, ("Scan on queue ",))) == len(lines_with(check, ("Scan on queue ",))), plan
    assert (
        lines_with(plan, ("Filter:", "Index Cond: (partition_key"))[:1]
        == lines_with(check, ("Filter:", "Index Cond: (partition_key"))[:1]
    ), (plan, check)


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_a_send_written_taken_checks_and_settles_its_partition_by_index_on_postgres(plans: Plans) -> None:
    """``record_event_started``: its queue-order check planned as ``due_ahead``
    alone (a read that stops at the partition's first due item), its
    partition's next time as ``settle_taken``'s (one seek), and no pass over
    the runs, however deep the queue."""
    plan, check, settle = plans("record_event_started"), plans("due_ahead"), plans("partition_times")
    assert lines_with(plan, ("Seq Scan on runs", "Sort")) == [], plan
    assert len(lines_with(plan, ("Seq Scan on queue",))) <= len(lines_with(check, ("Seq Scan on queue",))), (
        plan
    )
    assert lines_with(plan, ("queue_by_partition", "queue_by_due")), plan
    assert settle and lines_with(settle, ("Seq Scan",)) == [], settle


@pytest.mark.parametrize("name", sorted(STEP_READS))
def test_a_reads_steps_sent_with_its_runs_are_found_by_key(plans: Plans, name: str) -> None:
    """The steps of a page of an event's runs (``runs.list(event_id=...)``)
    and of an ended run (``runs.wait``), read with their runs: an index seek
    per run, never a pass over every step."""
    plan = plans(name)
    assert lines_with(plan, ("SCAN steps", "SCAN s ", "Seq Scan on steps")) == [], plan
    assert lines_with(plan, ("steps_pkey", "sqlite_autoindex_steps_1")), plan


@pytest.mark.parametrize(
    ("name", "index"),
    [
        ("timed_out", "queue_by_start_deadline"),
        ("timed_out", "queue_by_finish_deadline"),
        ("next_deadline", "queue_by_start_deadline"),
        ("next_deadline", "queue_by_finish_deadline"),
        ("run_backlog", "queue_by_partition"),
        ("wake_ckey", "partitions_by_ckey"),
    ],
)
def test_the_queues_timeout_and_backlog_reads_use_an_index_whatever_the_depth(
    plans: Plans, name: str, index: str
) -> None:
    """Migration 0026 made the deadline indexes and partitions_by_ckey partial
    (an item without a deadline, a partition without a concurrency key, is in
    none) and dropped queue_by_due: the timeout scan, the next deadline, the
    metrics' backlog and a concurrency key's wake-up still read an index,
    never the whole queue (the backlog reads every partition, then its due
    items by index)."""
    plan = plans(name)
    assert lines_with(plan, ("SCAN queue", "SCAN q ", "Seq Scan on queue", "SCAN partitions ")) == [], plan
    assert lines_with(plan, ("Seq Scan on partitions",)) == [] or name == "run_backlog", plan
    assert lines_with(plan, (f"{index} ",)), plan
