"""Finding runs by their event: a text search and a CEL condition, evaluated in
Python over a bounded scan.

The SQL filters (function, status, time range, event id) select runs newest
first; each is then tested against its first event: ``text`` is a
case-insensitive substring of the run id, the event's id, name or JSON data;
``condition`` is CEL over ``event`` (as in bulk actions). At most ``SCAN_LIMIT``
runs are examined per page: a page may then hold fewer runs than asked for, with
a cursor to scan on from where it stopped. The SQL stays portable and no page
costs more than a bounded amount of work, whatever the table's size.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stepstone import serde
from stepstone.expressions import Expression
from stepstone.runs import Run, to_run
from stepstone.store.base import RunsTx, Tx
from stepstone.store.rows import EventRow, RunFilter, RunRow

SCAN_LIMIT = 2000
_BATCH = 200


@dataclass(frozen=True)
class EventQuery:
    text: str | None = None
    condition: Expression | None = None

    @property
    def active(self) -> bool:
        return bool(self.text) or self.condition is not None

    def test(self, row: RunRow, event: EventRow | None) -> bool:
        if self.text and not _contains(row, event, self.text.casefold()):
            return False
        return self.condition is None or self.condition.test(event_variables(event))


def event_variables(event: EventRow | None) -> dict[str, Any]:
    """What CEL sees as ``event``: the run's first event."""
    if event is None:
        return {"event": {}}
    return {"event": {"name": event.name, "data": serde.loads(event.data), "id": event.id, "ts": event.ts}}


def _contains(row: RunRow, event: EventRow | None, needle: str) -> bool:
    haystack = [row.id]
    if event is not None:
        haystack += [event.id, event.name, event.data]
    return any(needle in item.casefold() for item in haystack)


def _matches(tx: RunsTx, row: RunRow, event_query: EventQuery) -> bool:
    if not event_query.active:
        return True
    events = tx.get_events(row.id)
    return event_query.test(row, events[0] if events else None)


@dataclass(frozen=True)
class Found:
    runs: list[Run]
    cursor: str | None  # continue before this run id; None when nothing is left
    examined: int


def search_op(
    where: RunFilter, event_query: EventQuery, limit: int, scan_limit: int = SCAN_LIMIT
) -> Callable[[Tx], Found]:
    """Up to ``limit`` matching runs, newest first, examining at most ``scan_limit``."""

    def op(tx: RunsTx) -> Found:
        found: list[RunRow] = []
        examined, last, exhausted = 0, where.before_id, False
        while len(found) <= limit and examined < scan_limit and not exhausted:
            rows = tx.list_runs(dataclasses.replace(where, before_id=last, limit=_BATCH))
            exhausted = len(rows) < _BATCH
            for row in rows:
                examined, last = examined + 1, row.id
                if _matches(tx, row, event_query):
                    found.append(row)
                if len(found) > limit or examined >= scan_limit:
                    exhausted = exhausted and row is rows[-1]
                    break
        page = found[:limit]
        if len(found) > limit:
            cursor: str | None = page[-1].id
        else:
            cursor = None if exhausted else last
        return Found([to_run(r, tx.get_steps(r.id)) for r in page], cursor, examined)

    return op
