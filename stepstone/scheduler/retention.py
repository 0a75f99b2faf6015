"""Retention: deleting what a database no longer needs, in small transactions.

Ended runs older than the app's ``retention`` go with their steps, spans,
event links, waits, queue rows and signals, then the events no remaining run
links to, finished jobs, and functions no deploy registers (with their
schedules) once retired that long and without runs; batches and debounces
whose run is gone, expired dedupe keys, idle GCRA cells and wait keys no wait
uses go whatever the retention. Each batch is one short transaction of at most ``RUN_BATCH`` runs
or ``ROW_BATCH`` rows, so SQLite's write lock is never held for long and a
checkpoint waits for at most one batch.

What is never deleted: a run whose status is not one of the store's ended
statuses (``ENDED_STATUSES``: any status added later is live by default), and
an ended run that a live run invoked or waits on, until that run ends.

``prune_plan`` yields the batches' operations and receives each one's result
(a generator, so the worker's retention loop drives it asynchronously and
``stepstone prune`` synchronously with a progress bar), each resting ``REST``
between batches so that other writers get the lock.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator

from stepstone.store.base import Tx
from stepstone.store.rows import ENDED_STATUSES, Pruned, PruneTarget

RUN_BATCH = 100  # runs per transaction, each with its steps, spans, links and waits
ROW_BATCH = 1000  # events, keys or cells per transaction
CELL_GRACE = 60.0  # seconds a GCRA cell stays past its arrival time (clock skew between workers)
COUNT_CAP = 1_000_000  # a dry run counts at most this many runs
# Seconds a pruner rests between batches. SQLite's busy handler lets a waiting
# writer retry only every few (up to 100) ms: a pruner committing back to back
# would take the lock again before any of them, so it leaves a window at least
# that long after each batch.
REST = 0.1

Batch = tuple[Pruned, bool]  # what one transaction deleted, and whether more may remain
BatchOp = Callable[[Tx], Batch]
Plan = Generator[BatchOp, Batch, Pruned]


def prune_plan(
    retention: float | None, now: float, run_batch: int = RUN_BATCH, row_batch: int = ROW_BATCH
) -> Plan:
    """Every batch due at ``now``, phase by phase; returns the total deleted."""
    total = Pruned()
    for op in _phases(retention, now, run_batch, row_batch):
        more = True
        while more:
            pruned, more = yield op
            total += pruned
    return total


def targets(retention: float | None, now: float) -> list[tuple[PruneTarget, float]]:
    """The tables pruned by their own rule, in order, each with its bound: what
    is older than the cutoff (only with a retention), then rows whose run is
    gone, expired keys and idle cells (whatever the retention)."""
    aged = (PruneTarget.EVENTS, PruneTarget.JOBS, PruneTarget.CRONS, PruneTarget.FUNCTIONS)
    by_age = [] if retention is None else [(target, now - retention) for target in aged]
    return [
        *by_age,
        (PruneTarget.BATCHES, now),
        (PruneTarget.DEBOUNCES, now),
        (PruneTarget.DEDUPE, now),
        (PruneTarget.GCRA, now - CELL_GRACE),
    ]


def _phases(retention: float | None, now: float, run_batch: int, row_batch: int) -> Iterator[BatchOp]:
    if retention is not None:
        yield runs_batch_op(now - retention, run_batch)
    for target, before in targets(retention, now):
        yield _rows_op(target, before, row_batch)
    yield _counted("wait_keys", lambda tx: tx.prune_wait_keys(row_batch), row_batch)


def runs_batch_op(cutoff: float, limit: int) -> BatchOp:
    """Delete up to ``limit`` prunable runs that ended before ``cutoff``."""

    def op(tx: Tx) -> Batch:
        ids = tx.prunable_runs(cutoff, ENDED_STATUSES, limit)
        return tx.delete_runs(ids, cutoff, ENDED_STATUSES), len(ids) == limit

    return op


def _rows_op(target: PruneTarget, before: float, limit: int) -> BatchOp:
    return _counted(str(target), lambda tx: tx.prune_rows(target, before, limit), limit)


def _counted(table: str, delete: Callable[[Tx], int], limit: int) -> BatchOp:
    def op(tx: Tx) -> Batch:
        n = delete(tx)
        return Pruned(counts={table: n}), n == limit

    return op


def count_prunable_op(retention: float, now: float) -> Callable[[Tx], dict[str, int]]:
    """What a prune would delete now, by table (each at most ``COUNT_CAP``): runs
    ended before the cutoff, and the rows of each ``PruneTarget`` prunable now
    (events and functions that only the runs' deletion would free are not
    counted; nor are wait keys)."""

    def op(tx: Tx) -> dict[str, int]:
        counts = {"runs": len(tx.prunable_runs(now - retention, ENDED_STATUSES, COUNT_CAP))}
        for target, before in targets(retention, now):
            counts[str(target)] = tx.prunable_rows(target, before, COUNT_CAP)
        return counts

    return op


def run_plan(
    plan: Plan,
    transact: Callable[[BatchOp], Batch],
    on_batch: Callable[[Pruned], object],
    rest: float = REST,
) -> Pruned:
    """Drive ``plan`` to its end, one transaction per batch, resting ``rest``
    seconds after each (synchronous callers)."""
    try:
        op = next(plan)
        while True:
            batch = transact(op)
            on_batch(batch[0])
            op = plan.send(batch)
            time.sleep(rest)
    except StopIteration as done:
        result: Pruned = done.value
        return result


__all__ = [
    "CELL_GRACE",
    "REST",
    "ROW_BATCH",
    "RUN_BATCH",
    "count_prunable_op",
    "prune_plan",
    "run_plan",
    "runs_batch_op",
    "targets",
]
