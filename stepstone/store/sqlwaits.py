"""The waiting side of ``Tx`` over SQL: wait rows (events, child runs,
signals), the index of their match keys, resolving and claiming them, and a
run's mailbox of signals (``WaitsTx``, ``MailboxTx``). Waking the run a
resolved wait belongs to moves its queue item, so ``wake_run`` stays with the
queue in ``sqltx``."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import Any

from stepstone.store.rows import EventRow, SignalRow, WaitRow
from stepstone.store.sqlbase import SqlPlumbing


class SqlWaits(SqlPlumbing):
    """Waits and signals (mixed into ``SqlTx``)."""

    # -- waits ---------------------------------------------------------------------------------
    def insert_wait(self, wait: WaitRow) -> None:
        self._insert_wait("insert_wait", wait)

    def start_wait(self, wait: WaitRow) -> Callable[[], bool]:
        cursor = self._insert_wait("insert_step_wait", wait)
        return lambda: int(cursor.rowcount) == 1  # read only if asked: no round trip otherwise

    def set_wait_match(self, run_id: str, step_id: str, match_value: str) -> None:
        self._exec("set_wait_match", {"run_id": run_id, "step_id": step_id, "match_value": match_value})

    def _insert_wait(self, query: str, wait: WaitRow) -> Any:
        """The wait's row (part 0), then a row per further index value (parts 1..:
        only waits whose run holds a list or a string's prefixes have them)."""
        params = {
            "run_id": wait.run_id,
            "step_id": wait.step_id,
            "kind": wait.kind,
            "event_name": wait.event_name,
            "match_key": wait.match_key,
            "match_value": wait.match_value,
            "expression": wait.expression,
            "event_json": wait.event_json,
            "created_at": wait.created_at,
            "expires_at": wait.expires_at,
            "part": 0,
            "match_number": wait.match_number,
        }
        if wait.event_name:  # first: the wait keeps the key's version it took
            key = {"event_name": wait.event_name, "match_key": wait.match_key, "born": uuid.uuid4().hex}
            self._exec("insert_wait_key", key)
        cursor = self._exec(query, params)
        for part, value in enumerate(wait.also_match, start=1):
            self._exec(query, {**params, "part": part, "match_value": value})
        return cursor

    def wait_keys(self, event_name: str) -> list[str]:
        return [r["match_key"] for r in self._all("wait_keys", {"event_name": event_name})]

    def wait_keys_later(self, event_name: str) -> Callable[[], list[str]]:
        if not self.dialect.pipelined:
            return lambda: self.wait_keys(event_name)
        sent = self._exec("wait_keys", {"event_name": event_name})  # read with the next result read
        return lambda: [r["match_key"] for r in sent.fetchall()]

    def match_waits(self, event_name: str, match_key: str, match_value: str, now: float) -> list[WaitRow]:
        rows = self._all(
            "match_waits",
            {"event_name": event_name, "match_key": match_key, "match_value": match_value, "now": now},
        )
        return [WaitRow.from_row(r) for r in rows]

    def wait_key_version(self, event_name: str, match_key: str) -> tuple[int, str] | None:
        row = self._one("wait_key_version", {"event_name": event_name, "match_key": match_key})
        return None if row is None else (int(row["version"]), str(row["born"]))

    def unindexed_waits_after(self, event_name: str, version: int, now: float) -> list[WaitRow]:
        params = {"event_name": event_name, "version": version, "now": now}
        return [WaitRow.from_row(r) for r in self._all("unindexed_waits_after", params)]

    def match_any_waits(
        self, event_name: str, match_key: str, match_values: Sequence[str], now: float
    ) -> list[WaitRow]:
        params = {"event_name": event_name, "match_key": match_key, "now": now}
        rows = self._all("match_any_waits", params, {"values": match_values})
        return [WaitRow.from_row(r) for r in rows]

    def match_range_waits(
        self, event_name: str, match_key: str, low: float, high: float, now: float
    ) -> list[WaitRow]:
        params = {"event_name": event_name, "match_key": match_key, "low": low, "high": high, "now": now}
        return [WaitRow.from_row(r) for r in self._all("match_range_waits", params)]

    def events_since(self, names: Sequence[str], since: float, now: float, limit: int) -> list[EventRow]:
        rows = self._all("events_since", {"since": since, "now": now, "limit": limit}, {"names": names})
        return [EventRow.from_row(r) for r in rows]

    def claim_wait(self, wait_id: int) -> bool:
        return int(self._exec("delete_wait", {"id": wait_id}).rowcount) == 1

    def claim_step_waits(self, run_id: str, step_id: str) -> bool:
        return int(self._exec("delete_step_waits", {"run_id": run_id, "step_id": step_id}).rowcount) > 0

    def delete_run_waits(self, run_id: str) -> None:
        self._exec("delete_run_waits", {"run_id": run_id})

    def child_waits(self, child_run_id: str) -> list[WaitRow]:
        return [WaitRow.from_row(r) for r in self._all("child_waits", {"child_run_id": child_run_id})]

    def complete_waiting_step(
        self, run_id: str, step_id: str, status: str, output: str | None, error: str | None, now: float
    ) -> bool:
        params = {
            "run_id": run_id,
            "step_id": step_id,
            "status": status,
            "output": output,
            "error": error,
            "now": now,
        }
        return int(self._exec("complete_waiting_step", params).rowcount) == 1

    # -- signals (the mailbox) ---------------------------------------------------------------
    def insert_signal(self, signal: SignalRow) -> None:
        params = {
            "id": signal.id,
            "run_id": signal.run_id,
            "name": signal.name,
            "data": signal.data,
            "sent_at": signal.sent_at,
            "consumed_by": signal.consumed_by,
            "consumed_at": signal.consumed_at,
        }
        self._exec("insert_signal", params)

    def take_signal(self, run_id: str, name: str, step_id: str, now: float) -> SignalRow | None:
        params = {"run_id": run_id, "name": name, "step_id": step_id, "now": now}
        row = self._exec("take_signal", params).fetchone()
        return None if row is None else SignalRow.from_row(row)

    def signal_waits(self, run_id: str, name: str, now: float) -> list[WaitRow]:
        rows = self._all("signal_waits", {"run_id": run_id, "name": name, "now": now})
        return [WaitRow.from_row(r) for r in rows]

    def run_signals(self, run_id: str) -> list[SignalRow]:
        return [SignalRow.from_row(r) for r in self._all("run_signals", {"run_id": run_id})]
