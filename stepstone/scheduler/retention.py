"""Retention: deleting what a database no longer needs, in small transactions.

Ended runs older than the app's ``retention`` go with their steps, spans,
event links, waits, queue rows and signals, then the events no remaining run
links to, finished jobs, and functions no deploy registers (with their
schedules) once retired that long and without runs; batches and debounces
whose run is gone, expired dedupe keys, idle GCRA cells and wait keys no wait
uses go whatever the retention. Each batch is one short transaction of at most ``RUN_BATCH`` runs
or ``ROW_BATCH`` rows, fewer when batches take longer than ``BUDGET``, and the
pruner rests between batches so that it holds the write lock at most ``DUTY``
of the time (``Pace``): a checkpoint waits for at most one short batch, and
rarely meets one.

What is never deleted: a run whose status is not one of the store's ended
statuses (``ENDED_STATUSES``: any status added later is live by default), and
an ended run that a live run invoked or waits on, until that run ends.

``prune_plan`` yields the batches' operations and receives each one's result
(a generator, so the worker's retention loop drives it asynchronously and
``stepstone prune`` synchronously with a progress bar), each resting as
``Pace`` says between batches so that other writers get the lock.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass

from stepstone.store.base import Tx
from stepstone.store.rows import ENDED_STATUSES
from stepstone.store.viewrows import Pruned, PruneTarget

RUN_BATCH = 100  # runs per transaction, each with its steps, spans, links and waits
ROW_BATCH = 1000  # events, keys or cells per transaction
CELL_GRACE = 60.0  # seconds a GCRA cell stays past its arrival time (clock skew between workers)
COUNT_CAP = 1_000_000  # a dry run counts at most this many runs
# Seconds a pruner rests between batches. SQLite's busy handler lets a waiting
# writer retry only every few (up to 100) ms: a pruner committing back to back
# would take the lock again before any of them, so it leaves a window at least
# that long after each batch.
REST = 0.1
BUDGET = 0.05  # seconds a batch aims to hold the write lock: batches shrink when slower
DUTY = 0.2  # the most of its time a pruner spends in transactions (it rests the rest)
PG_BUDGET, PG_DUTY = 0.25, 0.5  # the same on PostgreSQL (row locks: see pace_for)
MIN_SCALE = 0.1  # batches never shrink below this share of their size (nor below one row)

Batch = tuple[Pruned, bool]  # what one transaction deleted, and whether more may remain
BatchOp = Callable[[Tx], Batch]
Plan = Generator[BatchOp, Batch, Pruned]


@dataclass
class Pace:
    """How hard a pruner presses on the write lock, so that checkpoints barely
    notice it: each batch aims to hold the lock at most ``budget`` seconds (a
    batch that took longer makes the next ones proportionally smaller; faster
    ones let them grow back, at most doubling, up to ``runs``/``rows``), and
    after each batch the pruner rests long enough that its transactions take at
    most ``duty`` of its time, and never less than ``rest``."""

    runs: int = RUN_BATCH
    rows: int = ROW_BATCH
    budget: float = BUDGET
    duty: float = DUTY
    rest: float = REST
    clock: Callable[[], float] = time.monotonic
    scale: float = 1.0
    held: float = 0.0  # seconds the last batch's statements took, timed inside its transaction

    def limit(self, size: int) -> int:
        """The current bound of a batch of at most ``size`` runs or rows."""
        return max(1, round(size * self.scale))

    def after(self) -> float:
        """Adapt the batches to the last one's ``held``; returns the rest before
        the next. (Timed inside the transaction, not around it: waiting for the
        lock, or for a busy CPU, is not holding it.)"""
        factor = min(2.0, self.budget / max(self.held, 1e-9))
        self.scale = min(1.0, max(MIN_SCALE, self.scale * factor))
        return max(self.rest, self.held * (1 - self.duty) / self.duty)

    def timed(self, body: BatchOp) -> BatchOp:
        """``body``, recording how long it held the transaction in ``held``."""

        def op(tx: Tx) -> Batch:
            began = self.clock()
            try:
                return body(tx)
            finally:
                self.held = self.clock() - began

        return op


def pace_for(dialect: str, runs: int = RUN_BATCH) -> Pace:
    """The pace for a store: SQLite has one write lock for the whole database,
    so the default; PostgreSQL locks only the rows a batch deletes, which no
    checkpoint touches, so batches may take longer and rests be shorter (what
    they share is the server's CPU and WAL)."""
    if dialect == "sqlite":
        return Pace(runs=runs)
    return Pace(runs=runs, budget=PG_BUDGET, duty=PG_DUTY)


def prune_plan(retention: float | None, now: float, pace: Pace | None = None) -> Plan:
    """Every batch due at ``now``, phase by phase, each bounded by ``pace``;
    returns the total deleted."""
    total = Pruned()
    for op in _phases(retention, now, pace or Pace()):
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


def _phases(retention: float | None, now: float, pace: Pace) -> Iterator[BatchOp]:
    if retention is not None:
        yield runs_batch_op(now - retention, pace)
    for target, before in targets(retention, now):
        yield _rows_op(target, before, pace)
    yield _counted("wait_keys", lambda tx, limit: tx.prune_wait_keys(limit), pace)


def runs_batch_op(cutoff: float, pace: Pace) -> BatchOp:
    """Delete the prunable runs that ended before ``cutoff``, as many as ``pace``
    allows now."""

    def op(tx: Tx) -> Batch:
        limit = pace.limit(pace.runs)
        ids = tx.prunable_runs(cutoff, ENDED_STATUSES, limit)
        return tx.delete_runs(ids, cutoff, ENDED_STATUSES), len(ids) == limit

    return pace.timed(op)


def _rows_op(target: PruneTarget, before: float, pace: Pace) -> BatchOp:
    return _counted(str(target), lambda tx, limit: tx.prune_rows(target, before, limit), pace)


def _counted(table: str, delete: Callable[[Tx, int], int], pace: Pace) -> BatchOp:
    def op(tx: Tx) -> Batch:
        limit = pace.limit(pace.rows)
        n = delete(tx, limit)
        return Pruned(counts={table: n}), n == limit

    return pace.timed(op)


def count_prunable_op(retention: float, now: float) -> Callable[[Tx], dict[str, int]]:
    """What a prune would delete now, by table (each at most about ``COUNT_CAP``):
    runs ended before the cutoff, and the rows of each ``PruneTarget``
    prunable now or once those runs are deleted (events only they link to,
    retired functions only they are runs of). Wait keys are not counted."""

    def op(tx: Tx) -> dict[str, int]:
        cutoff = now - retention
        counts = {"runs": len(tx.prunable_runs(cutoff, ENDED_STATUSES, COUNT_CAP))}
        for target, before in targets(retention, now):
            freed = tx.freed_by_runs(target, cutoff, ENDED_STATUSES, COUNT_CAP)
            counts[str(target)] = tx.prunable_rows(target, before, COUNT_CAP) + freed
        return counts

    return op


def run_plan(
    plan: Plan,
    transact: Callable[[BatchOp], Batch],
    on_batch: Callable[[Pruned], object],
    pace: Pace,
    sleep: Callable[[float], object] = time.sleep,
) -> Pruned:
    """Drive ``plan`` (made with this ``pace``) to its end, one transaction per
    batch, resting as ``pace`` says after each (synchronous callers)."""
    try:
        op = next(plan)
        while True:
            batch = transact(op)
            rest = pace.after()
            on_batch(batch[0])
            op = plan.send(batch)
            sleep(rest)
    except StopIteration as done:
        result: Pruned = done.value
        return result


__all__ = [
    "BUDGET",
    "CELL_GRACE",
    "DUTY",
    "MIN_SCALE",
    "Pace",
    "REST",
    "ROW_BATCH",
    "RUN_BATCH",
    "count_prunable_op",
    "pace_for",
    "prune_plan",
    "run_plan",
    "runs_batch_op",
    "targets",
]
