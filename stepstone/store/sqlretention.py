"""The database's size and the deletes of retention, over SQL (mixed into
``SqlTx``). Every delete is bounded by a ``limit`` so that one transaction
never holds SQLite's write lock for long: ``scheduler/retention.py`` loops
over them, one short transaction each."""

from __future__ import annotations

import re
from collections.abc import Sequence

from stepstone.store.rows import RunRow, RunStatus
from stepstone.store.sqlbase import SqlPlumbing
from stepstone.store.viewrows import JOB_ACTIVE_STATUSES, Pruned, PruneTarget, TableSize

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# A run's rows in other tables, deleted with it (table, statement).
_RUN_ROWS = (
    ("steps", "delete_run_steps"),
    ("spans", "delete_run_spans"),
    ("run_events", "delete_run_links"),
    ("waits", "delete_run_waits_of"),
    ("queue", "delete_run_queue"),
    ("signals", "delete_run_signals"),
)
# The targets whose rows a run keeps (linked events, a retired function's runs).
_FREED_BY_RUNS = (PruneTarget.EVENTS, PruneTarget.FUNCTIONS)
# The statuses some prune_<target> statements name ({active}: jobs that are not finished).
_LISTS = {"active": list(JOB_ACTIVE_STATUSES)}


class SqlRetention(SqlPlumbing):
    # -- size ------------------------------------------------------------------------------
    def table_sizes(self) -> list[TableSize]:
        catalog = {"kind": "table", "internal": "sqlite_%"}
        names = [row["name"] for row in self._all(f"table_names_{self.dialect.name}", catalog)]
        sizes = self._table_bytes()
        return [TableSize(name=n, rows=self._count_rows(n), bytes=sizes.get(n)) for n in names]

    def _count_rows(self, table: str) -> int:
        if not _IDENTIFIER.match(table):  # a name from the catalog, but never trusted into SQL
            raise ValueError(f"unexpected table name {table!r}")
        sql = self.dialect.sql("count_rows").replace("{table}", f'"{table}"')
        return int(self.conn.execute(sql).fetchone()["n"])

    def _table_bytes(self) -> dict[str, int]:
        if self.dialect.name == "sqlite" and not self._one("has_dbstat_sqlite", {"module": "dbstat"})["n"]:
            return {}
        rows = self._all(f"table_bytes_{self.dialect.name}", {"kind": "r"})  # PostgreSQL: "r", a table
        return {row["name"]: int(row["bytes"]) for row in rows}

    def database_bytes(self) -> int:
        return int(self._one(f"database_bytes_{self.dialect.name}")["bytes"])

    def oldest_ended_run(self, ended: Sequence[RunStatus]) -> RunRow | None:
        row = self._exec("oldest_ended_run", {}, {"statuses": list(ended)}).fetchone()
        return None if row is None else RunRow.from_row(row)

    # -- retention ---------------------------------------------------------------------------
    def prunable_runs(self, cutoff: float, ended: Sequence[RunStatus], limit: int) -> list[str]:
        rows = self._all("prunable_runs", {"cutoff": cutoff, "limit": limit}, {"statuses": list(ended)})
        return [row["id"] for row in rows]

    def delete_runs(self, run_ids: Sequence[str], cutoff: float, ended: Sequence[RunStatus]) -> Pruned:
        if not run_ids:
            return Pruned(counts={"runs": 0})
        lists: dict[str, list[str]] = {"run_ids": list(run_ids), "statuses": list(ended)}
        gone = [row["id"] for row in self._exec("delete_runs", {"cutoff": cutoff}, lists).fetchall()]
        counts = {"runs": len(gone)}
        if gone:
            for table, query in _RUN_ROWS:
                counts[table] = int(self._exec(query, {}, {"run_ids": gone}).rowcount)
        return Pruned(counts=counts)

    def freed_by_runs(
        self, target: PruneTarget, cutoff: float, ended: Sequence[RunStatus], limit: int
    ) -> int:
        if target not in _FREED_BY_RUNS:
            return 0
        params = {"cutoff": cutoff, "limit": limit}
        return int(self._exec(f"freed_{target}", params, {"statuses": list(ended)}).fetchone()["n"])

    def prunable_rows(self, target: PruneTarget, before: float, limit: int) -> int:
        return len(self._all(f"prunable_{target}", {"before": before, "limit": limit}, _LISTS))

    def prune_rows(self, target: PruneTarget, before: float, limit: int) -> int:
        return int(self._exec(f"prune_{target}", {"before": before, "limit": limit}, _LISTS).rowcount)

    def prune_wait_keys(self, limit: int) -> int:
        deleted = 0
        for row in self._all("orphan_wait_keys", {"limit": limit}):
            params = {"event_name": row["event_name"], "match_key": row["match_key"]}
            deleted += int(self._exec("prune_wait_key", params).rowcount)
        return deleted
