"""What a sequential three-step run writes (issue 18, target 4): on SQLite the
WAL frames (4 KiB pages) of each write transaction, by kind of transaction and
by table or index; on PostgreSQL the WAL records per run, by kind and relation
(a B-tree insert is one index entry). Load-independent counts.

    PYTHONPATH=<tree>:<tree>/bench .venv/bin/python <tree>/bench/bench_pages.py [--runs 200]
    .venv/bin/python bench/bench_pages.py --store sqlite --by-index   # each page's table or index
    .venv/bin/python bench/bench_pages.py --queued 2000   # runs sent first, then drained

The ``workloads`` run (send, ``runs.list(event_id=)``, ``runs.wait``; an
in-process worker), one run at a time, after a warm-up; or (``--queued``) the
runs sent in batches of 500 and then drained by an in-process worker
(concurrency 10), the sends and the drain counted together.

SQLite: every connection runs with ``wal_autocheckpoint = 0`` so the WAL only
grows (a checkpoint would restart it and hide frames); a write transaction's
frames are the growth of the ``-wal`` file over it, divided by a frame's size
(the page plus its 24-byte header). That is what SQLite writes and syncs at
that commit; disabling the checkpoints changes when pages reach the database
file, not what a commit writes. ``--by-index`` reads each new frame's page
number from the WAL and names the B-tree holding that page now (``dbstat``;
``header`` is page 1, written when the file grows or its free list changes).

PostgreSQL: a private durable cluster; ``pg_walinspect`` lists the WAL
records between the measured part's first and last LSN, counted per run by
resource manager and record type (Heap INSERT/UPDATE/HOT_UPDATE, Btree
INSERT_LEAF: one index entry), and by the relation they touch.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import sqlite3
import struct
import tempfile
import time
from collections.abc import Callable
from typing import Any

from workloads import add_three_steps, three_step_latencies

import stepstone as ss
from stepstone.store.batching import site
from stepstone.store.sqlite import SqliteStore

FRAME_HEADER = 24
WAL_HEADER = 32


def kind(ops: list[Any]) -> str:
    """A write transaction's operations' names, a name repeated counted once: ``name x10``."""
    names = collections.Counter(site(op) for op in ops)
    return "+".join(name if n == 1 else f"{name} x{n}" for name, n in names.items())


class WalFrames:
    """Each SQLite write transaction's WAL frames, by kind (its operations' names)."""

    def __init__(self, path: str, by_index: bool) -> None:
        self.wal = path + "-wal"
        self.path = path
        self.by_index = by_index
        self.page_size = 0
        self.commits: collections.Counter[str] = collections.Counter()
        self.frames: collections.Counter[str] = collections.Counter()
        self.pages: collections.Counter[str] = collections.Counter()
        self.pages_by_kind: dict[str, collections.Counter[str]] = {}
        self.counting = False

    def install(self) -> None:
        frames, connect, write = self, SqliteStore.connect, SqliteStore._write

        def connect_growing(store: SqliteStore) -> sqlite3.Connection:
            conn = connect(store)
            conn.execute("PRAGMA wal_autocheckpoint = 0")
            frames.page_size = conn.execute("PRAGMA page_size").fetchone()[0]
            return conn

        def counted_write(store: SqliteStore, conn: sqlite3.Connection, ops: list[Any]) -> Any:
            if not frames.counting:
                return write(store, conn, ops)
            before = os.path.getsize(frames.wal)
            try:
                return write(store, conn, ops)
            finally:
                frames.count(kind(ops), before)

        SqliteStore.connect = connect_growing  # type: ignore[method-assign,assignment]
        SqliteStore._write = counted_write  # type: ignore[method-assign,assignment]

    def count(self, kind: str, before: int) -> None:
        size = self.page_size + FRAME_HEADER
        after = os.path.getsize(self.wal)
        assert (after - WAL_HEADER) % size == 0 and after >= before, "the WAL was restarted"
        written = (after - before) // size
        if written == 0:
            return  # a transaction that changed nothing writes no frame
        self.commits[kind] += 1
        self.frames[kind] += written
        if self.by_index:
            names = self.owners(before, after)
            self.pages.update(names)
            self.pages_by_kind.setdefault(kind, collections.Counter()).update(names)

    def owners(self, start: int, end: int) -> list[str]:
        size = self.page_size + FRAME_HEADER
        with open(self.wal, "rb") as wal:
            wal.seek(start)
            data = wal.read(end - start)
        numbers = [struct.unpack_from(">I", data, offset)[0] for offset in range(0, len(data), size)]
        with sqlite3.connect(self.path) as conn:
            owner = dict(conn.execute("SELECT pageno, name FROM dbstat").fetchall())
        return ["header" if n == 1 else owner.get(n, "free list") for n in numbers]

    def report(self, runs: int) -> str:
        total = sum(self.frames.values())
        lines = [f"SQLite: {total / runs:.1f} WAL frames per run ({self.page_size} B pages)"]
        for kind, frames in self.frames.most_common():
            commits = self.commits[kind]
            line = f"  {commits / runs:5.2f} commits/run {frames / commits:5.1f} frames each  {kind}"
            lines.append(line)
            if kind in self.pages_by_kind:
                mix = self.pages_by_kind[kind]
                lines.append("        " + ", ".join(f"{n} {c / commits:.1f}" for n, c in sorted(mix.items())))
        if self.pages:
            lines.append("  by table or index (pages per run):")
            for name, n in self.pages.most_common():
                lines.append(f"    {n / runs:5.2f}  {name}")
        return "\n".join(lines)


async def queued_runs(app: ss.App, runs: int, completed: Callable[[], int]) -> None:
    """``runs`` three-step runs sent in batches, then drained by an in-process
    worker until ``completed()`` (a plain read) counts them; closes ``app``."""
    add_three_steps(app)
    for start in range(0, runs, 500):
        await app.send_async([ss.Event("three") for _ in range(min(500, runs - start))])
    before = completed()
    await app.start_async(concurrency=10)
    await asyncio.to_thread(until, lambda: completed() >= before + runs)
    await app.stop_async()
    app.close()


def until(done: Callable[[], bool], every: float = 0.02) -> None:
    while not done():
        time.sleep(every)


def workload(url: str, runs: int, queued: bool, completed: Callable[[], int]) -> None:
    app = ss.App("bench", database_url=url)
    if queued:
        asyncio.run(queued_runs(app, runs, completed))
    else:
        asyncio.run(three_step_latencies(app, runs, 0))


def completed_sql() -> str:
    return "SELECT COUNT(*) FROM runs WHERE status = 'completed'"


def measure_sqlite(runs: int, by_index: bool, queued: bool) -> WalFrames:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "pages.db")
        frames = WalFrames(path, by_index)
        frames.install()
        url = f"sqlite:///{path}"
        asyncio.run(three_step_latencies(ss.App("warm", database_url=url), 20))
        frames.counting = True

        def completed() -> int:
            with sqlite3.connect(path) as conn:
                return int(conn.execute(completed_sql()).fetchone()[0])

        workload(url, runs, queued, completed)
        frames.counting = False
    return frames


WAL_RECORDS = """
SELECT resource_manager, record_type, block_ref, record_length FROM pg_get_wal_records_info(%s, %s)
"""


def measure_postgres(runs: int, queued: bool) -> str:
    import psycopg
    from bench_postgres import server

    with server(None) as create:
        url = create("pages")
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
            asyncio.run(three_step_latencies(ss.App("warm", database_url=url), 20))
            [start] = conn.execute("SELECT pg_current_wal_lsn()").fetchone() or [None]

            def completed() -> int:
                return int((conn.execute(completed_sql()).fetchone() or [0])[0])

            workload(url, runs, queued, completed)
            [end] = conn.execute("SELECT pg_current_wal_lsn()").fetchone() or [None]
            records = conn.execute(WAL_RECORDS, (start, end)).fetchall()
            rows = conn.execute("SELECT pg_relation_filenode(oid), relname FROM pg_class").fetchall()
            names: dict[Any, str] = {node: name for node, name in rows}
            [db] = conn.execute(
                "SELECT oid FROM pg_database WHERE datname = current_database()"
            ).fetchone() or [0]
    return wal_report(records, names, int(db), runs)


def wal_report(records: list[Any], names: dict[Any, str], db: int, runs: int) -> str:
    kinds: collections.Counter[str] = collections.Counter()
    relations: collections.Counter[tuple[str, str]] = collections.Counter()
    size = 0
    for manager, record, blocks, length in records:
        kinds[f"{manager}/{record}"] += 1
        size += length
        if manager not in ("Heap", "Heap2", "Btree"):
            continue
        for ref in (blocks or "").split("blkref")[1:]:
            words = ref.split()
            if "rel" not in words:
                continue
            _, rel_db, node = words[words.index("rel") + 1].split("/")
            if int(rel_db) == db and "fork" in words and words[words.index("fork") + 1] == "main":
                relations[(names.get(int(node), node), f"{manager}/{record}")] += 1
                break
    lines = [f"PostgreSQL: {len(records) / runs:.1f} WAL records, {size / runs:.0f} bytes per run"]
    for kind, n in kinds.most_common(12):
        lines.append(f"  {n / runs:6.2f}/run  {kind}")
    lines.append("  by relation (records per run; Btree/INSERT_LEAF: an index entry):")
    for (name, kind), n in sorted(relations.items(), key=lambda item: (item[0][1], -item[1])):
        if n / runs >= 0.05:
            lines.append(f"    {n / runs:5.2f}  {kind:18} {name}")
    entries = sum(n for (_, kind), n in relations.items() if kind.startswith("Btree/INSERT"))
    lines.append(f"  index entries per run: {entries / runs:.2f}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--store", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--by-index", action="store_true", help="SQLite: name each page's B-tree")
    parser.add_argument("--queued", type=int, default=0, help="runs sent first, then drained (0: sequential)")
    args = parser.parse_args()
    runs = args.queued or args.runs
    if args.store in ("sqlite", "both"):
        print(measure_sqlite(runs, args.by_index, args.queued > 0).report(runs))
    if args.store in ("postgres", "both"):
        print(measure_postgres(runs, args.queued > 0))


if __name__ == "__main__":
    main()
