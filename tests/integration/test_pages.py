"""Pages per sequential run on SQLite (issue 18, target 4): a commit at
``synchronous=full`` costs a few microseconds of CPU and of fsync per page it
writes, one page per B-tree its rows touch. Migration 0026 cut what a
three-step run writes (partial deadline indexes, no queue_by_due, one
queue index by partition for a leased item, not two; queue, dedupe and
run_events WITHOUT ROWID): these tests count each commit's WAL
frames, so a new index or a new row on the run's path cannot silently bring
them back. Counted, not timed (``bench/bench_pages.py`` reports the same).

The WAL is kept from being checkpointed (``wal_autocheckpoint = 0``) so that it
only grows: a commit's frames are the growth of the ``-wal`` file over it.
"""

from __future__ import annotations

import os
import sqlite3
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import stepstone as ss
from stepstone.store.base import Store, Tx
from stepstone.store.batching import site
from stepstone.store.rows import QueueSpec
from stepstone.store.sqlite import SqliteStore
from tests.conftest import send_and_wait

from .test_store_contract import NOW, add_run, lease

FRAME = 4096 + 24  # a page and its frame header
WAL_HEADER = 32
# The median frames of each kind of commit of a sequential three-step run
# (main before migration 0026: send 27, end 13, checkpoint 2).
MOST_FRAMES = {
    "App._send.op": 20,
    "journal(checkpoint+_finish.final)": 8,
    "journal(checkpoint)": 2,
}


def counting_frames(monkeypatch: pytest.MonkeyPatch, wal: str) -> dict[str, list[float]]:
    """Each write transaction's WAL frames, by its operations' names, from now on."""
    frames: dict[str, list[float]] = {}
    connect: Callable[[SqliteStore], sqlite3.Connection] = SqliteStore.connect
    write = SqliteStore._write

    def growing(store: SqliteStore) -> sqlite3.Connection:
        conn = connect(store)
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        return conn

    def counted(store: SqliteStore, conn: sqlite3.Connection, ops: list[Any]) -> Any:
        before = max(os.path.getsize(wal) if os.path.exists(wal) else 0, WAL_HEADER)
        try:
            return write(store, conn, ops)
        finally:
            grown = os.path.getsize(wal) - before  # (not a multiple of FRAME: restarted)
            frames.setdefault("+".join(site(op) for op in ops), []).append(grown / FRAME)

    monkeypatch.setattr(SqliteStore, "connect", growing)
    monkeypatch.setattr(SqliteStore, "_write", counted)
    return frames


def test_a_sequential_three_step_runs_commits_write_few_pages_on_sqlite(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "pages.db"
    frames = counting_frames(monkeypatch, f"{path}-wal")
    app = ss.App("pages", database_url=f"sqlite:///{path}")

    async def one() -> int:
        return 1

    @app.function(id="three", trigger=ss.on_event("three"))
    async def three(ctx: ss.Context) -> int:
        total = 0
        for name in ("a", "b", "c"):
            total += await ctx.step.run(name, one)
        return total

    app.start(concurrency=10)
    try:
        for _ in range(3):
            send_and_wait(app, ss.Event("three"))  # warm: the tables' first pages
        frames.clear()
        for _ in range(12):
            assert send_and_wait(app, ss.Event("three")).output == 3
    finally:
        app.stop()
        app.close()
    assert len(frames["App._send.op"]) == 12, frames
    assert all(n == int(n) for counts in frames.values() for n in counts), frames  # whole frames
    medians = {kind: statistics.median(frames[kind]) for kind in MOST_FRAMES}
    assert all(medians[kind] <= most for kind, most in MOST_FRAMES.items()), medians
    assert all(medians[kind] > 0 for kind in MOST_FRAMES), medians  # the count counts


def test_the_backlog_counts_each_functions_due_items_across_its_partitions(store: Store) -> None:
    """``run_backlog`` (the metrics' backlog) reads each partition's items
    since migration 0026 dropped queue_by_due: a function's due items in all
    its partitions, leased and future ones left out, on both databases."""

    def fill(tx: Tx) -> None:
        add_run(tx, "f1", at=NOW - 10)
        add_run(tx, "f2", at=NOW - 5)
        add_run(tx, "f3", at=NOW + 100)  # not due yet
        for key, at in (("a", NOW - 30), ("b", NOW - 20), ("b", NOW + 50)):
            spec = QueueSpec(partition_key=f"g|{key}", ckey1=key, limit1=5)
            add_run(tx, f"g-{key}-{at}", function_id="g", at=at, spec=spec)

    store.transact_sync(fill)
    [leased] = store.transact_sync(lambda tx: lease(tx, "w", 1, NOW, NOW + 60))  # f1: leased, not due
    assert leased.run.id == "f1"
    backlog = store.read_sync(lambda tx: tx.run_backlog(NOW))
    assert sorted((b.function_id, b.due, b.oldest_due_at) for b in backlog) == [
        ("f", 1, NOW - 5),
        ("g", 2, NOW - 30),
    ]
