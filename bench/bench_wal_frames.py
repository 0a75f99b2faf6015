"""What a SQLite WAL commit at ``synchronous=FULL`` costs by the pages it
writes and their size (issue 18, target 4): no engine, the stdlib ``sqlite3``.

    .venv/bin/python bench/bench_wal_frames.py [--commits 2500]

For each page size and page count, a fresh database with that many one-row
tables; each commit changes the row of every table (new random bytes, so no
page is left clean), so it writes one WAL frame per table. The p50 is taken
over the commits after the first ``WARM_UP``: by then the WAL has wrapped
past its first checkpoint, so commits overwrite the file as a running engine's
do instead of growing it (an append costs about twice as much on this disk).
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

WARM_UP = 1500  # commits: past the first WAL checkpoint (1,000 frames) at every size here


def commit_p50(path: Path, page_size: int, pages: int, commits: int) -> float:
    """Seconds per commit (p50 after the warm-up) writing ``pages`` frames of ``page_size`` bytes."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute(f"PRAGMA page_size = {page_size}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
        for table in range(pages):
            conn.execute(f"CREATE TABLE t{table} (id INTEGER PRIMARY KEY, v BLOB)")
            conn.execute(f"INSERT INTO t{table} VALUES (1, zeroblob(100))")
        spent = []
        for _ in range(WARM_UP + commits):
            began = time.perf_counter()
            conn.execute("BEGIN IMMEDIATE")
            for table in range(pages):
                conn.execute(f"UPDATE t{table} SET v = ? WHERE id = 1", (os.urandom(100),))
            conn.execute("COMMIT")
            spent.append(time.perf_counter() - began)
        return statistics.median(spent[WARM_UP:])
    finally:
        conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--commits", type=int, default=1000, help="timed commits per case")
    args = parser.parse_args()
    print("p50 of one commit (µs) by pages written, per page size")
    print("page size |" + "".join(f" {n:>5} pages |" for n in (1, 2, 5, 10, 20)))
    for page_size in (4096, 1024):
        cells = []
        for pages in (1, 2, 5, 10, 20):
            with tempfile.TemporaryDirectory(prefix="wal-") as folder:
                cells.append(commit_p50(Path(folder) / "w.db", page_size, pages, args.commits))
        print(f"{page_size:>9} |" + "".join(f" {cell * 1e6:11.0f} |" for cell in cells))


if __name__ == "__main__":
    main()
