"""Direct SQL reads for the stateful test (tests/integration/test_stateful.py).

The invariants are checked against the tables themselves, not through the
engine's own read paths, so an engine bug cannot hide itself. One connection
per model instance, autocommit: every read sees what is committed now.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from typing import Any

ENDED = ("completed", "failed", "cancelled", "skipped")


@dataclass(frozen=True)
class RunState:
    """A run with its queue item (``queued`` is False when it has none)."""

    id: str
    function_id: str
    status: str
    queued: bool
    owner: str | None
    available_at: float | None
    cancel_requested: bool
    wake_requested: bool

    @property
    def ended(self) -> bool:
        return self.status in ENDED


@dataclass(frozen=True)
class WaitState:
    run_id: str
    step_id: str
    kind: str
    match_value: str
    expires_at: float | None


class Reader:
    """Reads the database a model's app writes to (SQLite file or PostgreSQL)."""

    def __init__(self, url: str) -> None:
        self.pg = not url.startswith("sqlite:")
        if self.pg:
            import psycopg
            from psycopg.rows import tuple_row

            self._pg = psycopg.connect(url, autocommit=True, row_factory=tuple_row)
        else:
            self._lite = sqlite3.connect(
                url.removeprefix("sqlite:///"), isolation_level=None, check_same_thread=False
            )

    def rows(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        if self.pg:
            return [tuple(r) for r in self._pg.execute(sql.replace("?", "%s").encode(), params).fetchall()]
        return [tuple(r) for r in self._lite.execute(sql, params).fetchall()]

    def execute(self, sql: str) -> None:
        if self.pg:
            self._pg.execute(sql.encode())
        else:
            self._lite.execute(sql)

    def close(self) -> None:
        if self.pg:
            self._pg.close()
        else:
            self._lite.close()

    # -- what the model asks ------------------------------------------------------------
    def runs(self) -> list[RunState]:
        rows = self.rows(
            "SELECT r.id, r.function_id, r.status, q.run_id, q.owner, q.available_at,"
            " q.cancel_requested, q.wake_requested"
            " FROM runs r LEFT JOIN queue q ON q.run_id = r.id ORDER BY r.id"
        )
        return [
            RunState(r[0], r[1], r[2], r[3] is not None, r[4], r[5], bool(r[6]), bool(r[7])) for r in rows
        ]

    def orphan_queue_items(self) -> list[str]:
        return [r[0] for r in self.rows("SELECT run_id FROM queue WHERE run_id NOT IN (SELECT id FROM runs)")]

    def waits(self) -> list[WaitState]:
        return [
            WaitState(*r)
            for r in self.rows("SELECT run_id, step_id, kind, match_value, expires_at FROM waits ORDER BY id")
        ]

    def children(self) -> list[tuple[str, str]]:
        """(parent run, parent step) of every invoked run."""
        return [
            (r[0], r[1])
            for r in self.rows(
                "SELECT parent_run_id, parent_step_id FROM runs WHERE parent_run_id IS NOT NULL"
            )
        ]

    def completed_outputs(self) -> dict[tuple[str, str], str | None]:
        """The output of every completed step."""
        return {
            (r[0], r[1]): r[2]
            for r in self.rows("SELECT run_id, step_id, output FROM steps WHERE status = 'completed'")
        }

    def signals(self) -> list[tuple[str, str, str, str | None]]:
        """Every signal: (run, name, data, the step that consumed it)."""
        return [
            (r[0], r[1], r[2], r[3])
            for r in self.rows("SELECT run_id, name, data, consumed_by FROM signals ORDER BY seq")
        ]

    def step_statuses(self) -> dict[tuple[str, str], str]:
        return {(r[0], r[1]): r[2] for r in self.rows("SELECT run_id, step_id, status FROM steps")}

    def step_state(self, run_id: str) -> tuple[str | None, dict[str, str]]:
        """The run's status and its steps' statuses, as committed now."""
        status = self.rows("SELECT status FROM runs WHERE id = ?", run_id)
        steps = self.rows("SELECT step_id, status FROM steps WHERE run_id = ?", run_id)
        return (status[0][0] if status else None), {s: st for s, st in steps}

    def run_data(self, run_id: str) -> dict[str, Any]:
        """The data of the run's first event."""
        rows = self.rows(
            "SELECT e.data FROM run_events re JOIN events e ON e.seq = re.event_seq"
            " WHERE re.run_id = ? ORDER BY re.position",
            run_id,
        )
        return dict(json.loads(rows[0][0])) if rows else {}

    def step_ids(self, run_id: str) -> list[str]:
        return [
            r[0] for r in self.rows("SELECT step_id FROM steps WHERE run_id = ? ORDER BY position", run_id)
        ]

    def next_time(self, after: float) -> float | None:
        """The earliest queue time after ``after`` (a due run or a lease expiry)."""
        rows = self.rows("SELECT MIN(available_at) FROM queue WHERE available_at > ?", after)
        return None if not rows or rows[0][0] is None else float(rows[0][0])

    def hidden_items(self, now: float, slack: float) -> list[tuple[str, str, float, float | None]]:
        """Queue items no lease pass would look at by their due time, or now if
        that is past (plus ``slack``): their partition's hint is missing, unset
        or later. (The model's functions have no concurrency key or throttle,
        which park a partition past its due items on purpose.)"""
        return [
            (r[0], r[1], float(r[2]), None if r[3] is None else float(r[3]))
            for r in self.rows(
                "SELECT q.run_id, q.partition_key, q.available_at, p.next_at"
                " FROM queue q LEFT JOIN partitions p ON p.key = q.partition_key"
                " WHERE q.available_at IS NOT NULL"
                " AND (p.next_at IS NULL OR p.next_at > CASE WHEN q.available_at > ? THEN q.available_at"
                " ELSE ? END + ?)",
                now,
                now,
                slack,
            )
        ]

    def due_items(self, partition_key: str, now: float) -> list[str]:
        """The partition's items due at ``now`` (a direct start must not go before them)."""
        return [
            r[0]
            for r in self.rows(
                "SELECT run_id FROM queue WHERE partition_key = ? AND available_at <= ?", partition_key, now
            )
        ]

    def lease_of(self, run_id: str) -> tuple[str, str | None] | None:
        """The run's queue item's partition and owner (``None``: no item)."""
        rows = self.rows("SELECT partition_key, owner FROM queue WHERE run_id = ?", run_id)
        return (rows[0][0], rows[0][1]) if rows else None
