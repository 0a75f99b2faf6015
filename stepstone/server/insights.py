"""Operator views computed from the store: run counts per status, each
function's live load and backlog per concurrency key, timelines (throughput,
failure rate, queue delay) and the preview of a bulk action.

Each view is a store operation (``op(tx)``) shared by the JSON API
(``routes/stats.py``) and the dashboard pages.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from stepstone.expressions import Expression
from stepstone.inventory import FunctionInfo, list_functions
from stepstone.server.search import event_variables
from stepstone.store.base import RunsTx, Tx, ViewsTx
from stepstone.store.rows import ACTIVE_STATUSES, ENDED_STATUSES, RunFilter, RunStatus
from stepstone.store.viewrows import KeyBacklogRow

HOUR = 3600.0
PREVIEW_SCAN = 5000
SAMPLE = 10
KEY_ROWS = 500
_WIDTHS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)


# -- counts ----------------------------------------------------------------------------------
def status_counts_op(
    function_id: str | None, since: float | None, until: float | None
) -> Callable[[Tx], dict[str, int]]:
    """Runs created in [since, until) per status (every status present, zeros included)."""

    def op(tx: ViewsTx) -> dict[str, int]:
        counts: dict[str, int] = dict.fromkeys(ACTIVE_STATUSES + ENDED_STATUSES, 0)
        for row in tx.count_runs(function_id, since, until):
            counts[row.status] = counts.get(row.status, 0) + row.count
        return counts

    return op


# -- functions ---------------------------------------------------------------------------------
@dataclass
class FunctionLoad:
    """A function with what it is doing now."""

    info: FunctionInfo
    active: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ACTIVE_STATUSES, 0))
    failed_last_hour: int = 0
    keys: list[KeyBacklogRow] = field(default_factory=list)

    @property
    def backlog(self) -> int:
        return sum(k.due for k in self.keys)


def functions_op(now: float) -> Callable[[Tx], list[FunctionLoad]]:
    def op(tx: Tx) -> list[FunctionLoad]:
        loads = {info.id: FunctionLoad(info) for info in list_functions(tx)}
        for row in tx.count_active_runs():
            if row.function_id in loads:
                loads[row.function_id].active[row.status] = row.count
        for row in tx.count_runs(None, now - HOUR, None):
            if row.status == RunStatus.FAILED and row.function_id in loads:
                loads[row.function_id].failed_last_hour = row.count
        for key in tx.key_backlog(now, KEY_ROWS):
            if key.function_id in loads:
                loads[key.function_id].keys.append(key)
        return list(loads.values())

    return op


# -- timelines ---------------------------------------------------------------------------------
@dataclass
class Bucket:
    start: float
    created: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    started: int = 0
    delay_sum: float = 0.0
    delay_max: float | None = None

    @property
    def ended(self) -> int:
        return self.completed + self.failed + self.cancelled

    @property
    def failure_rate(self) -> float | None:
        return self.failed / self.ended if self.ended else None

    @property
    def delay_avg(self) -> float | None:
        return self.delay_sum / self.started if self.started else None


@dataclass(frozen=True)
class Timeline:
    origin: int
    width: int
    buckets: list[Bucket]


def timeline_op(
    function_id: str | None, since: float, until: float, count: int = 60
) -> Callable[[Tx], Timeline]:
    """Runs created in [since, until) in about ``count`` buckets of a round number
    of seconds, aligned on multiples of their width."""
    raw = (until - since) / max(1, count)
    width = next((w for w in _WIDTHS if w >= raw), math.ceil(raw / 86400) * 86400)
    origin = math.floor(since / width) * width
    count = max(1, math.ceil((until - origin) / width))

    def op(tx: ViewsTx) -> Timeline:
        buckets = [Bucket(float(origin + i * width)) for i in range(count)]
        for row in tx.run_timeline(function_id, origin, until, width):
            bucket = buckets[min(max(row.bucket, 0), count - 1)]
            bucket.created += row.count
            if row.status in (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED):
                setattr(bucket, row.status, getattr(bucket, row.status) + row.count)
            bucket.started += row.started
            bucket.delay_sum += row.delay_sum
            if row.delay_max is not None:
                bucket.delay_max = max(bucket.delay_max or 0.0, row.delay_max)
        return Timeline(origin, width, buckets)

    return op


# -- bulk preview ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Preview:
    count: int
    examined: int
    complete: bool  # False when the scan stopped at PREVIEW_SCAN runs
    sample: list[str]


def preview_op(
    function_id: str,
    statuses: Sequence[str],
    since: float | None,
    until: float | None,
    condition: Expression | None,
    scan: int = PREVIEW_SCAN,
) -> Callable[[Tx], Preview]:
    """How many runs a bulk action with these filters would act on now."""
    where = RunFilter(function_id=function_id, statuses=tuple(statuses), since=since, until=until, limit=200)

    def op(tx: Tx) -> Preview:
        if condition is None:
            counts = status_counts_op(function_id, since, until)(tx)
            sample = [r.id for r in tx.list_runs(replace(where, limit=SAMPLE))]
            total = sum(counts[s] for s in statuses)
            return Preview(total, total, True, sample)
        return _scan(tx, where, condition, scan)

    return op


def _scan(tx: RunsTx, where: RunFilter, condition: Expression, scan: int) -> Preview:
    matched: list[str] = []
    examined, before = 0, None
    while examined < scan:
        rows = tx.list_runs(replace(where, before_id=before))
        for row in rows[: scan - examined]:
            events = tx.get_events(row.id)
            if condition.test(event_variables(events[0] if events else None)):
                matched.append(row.id)
        examined += min(len(rows), scan - examined)
        if len(rows) < where.limit:
            return Preview(len(matched), examined, True, matched[:SAMPLE])
        before = rows[-1].id
    return Preview(len(matched), examined, False, matched[:SAMPLE])
