"""The retention role: what the database holds (rows and bytes per table, the
oldest ended run) and the bounded deletes of old ended runs (with their rows)
and of the tables pruned by their own rule (``PruneTarget``: orphan events,
finished jobs, retired functions and their schedules, batches and debounces
of deleted runs, expired dedupe keys, idle GCRA cells) and unused wait keys
(issue 17)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from stepstone.store.rows import RunRow, RunStatus
from stepstone.store.viewrows import Pruned, PruneTarget, TableSize


class RetentionTx(Protocol):
    """Database size and retention: reads for ``stepstone stats``, bounded deletes
    for the retention loop and ``stepstone prune``."""

    def table_sizes(self) -> list[TableSize]:
        """Every table with its exact row count and the bytes it and its indexes
        take on disk (``None`` where the database cannot measure them)."""
        ...

    def database_bytes(self) -> int:
        """The whole database's size on disk (SQLite: pages times page size)."""
        ...

    def oldest_ended_run(self, ended: Sequence[RunStatus]) -> RunRow | None:
        """The run that ended first among those with an ``ended`` status."""
        ...

    def prunable_runs(self, cutoff: float, ended: Sequence[RunStatus], limit: int) -> list[str]:
        """Up to ``limit`` ids of runs with an ``ended`` status that ended before
        ``cutoff``, oldest first, less those a live run invoked or waits on."""
        ...

    def delete_runs(self, run_ids: Sequence[str], cutoff: float, ended: Sequence[RunStatus]) -> Pruned:
        """Delete these runs (each only if it still ended before ``cutoff``) with
        their steps, spans, event links, waits, queue rows and signals."""
        ...

    def freed_by_runs(
        self, target: PruneTarget, cutoff: float, ended: Sequence[RunStatus], limit: int
    ) -> int:
        """How many rows of ``target`` older than ``cutoff`` only runs that
        ``prunable_runs(cutoff, ended, limit)`` chooses keep: what deleting
        those runs frees for ``prune_rows`` (events, functions; else 0)."""
        ...

    def prunable_rows(self, target: PruneTarget, before: float, limit: int) -> int:
        """How many rows (at most ``limit``) ``prune_rows`` would delete now."""
        ...

    def prune_rows(self, target: PruneTarget, before: float, limit: int) -> int:
        """Delete up to ``limit`` rows of ``target`` its rule marks as prunable at
        ``before`` (``PruneTarget``: events, jobs, crons and functions older than
        the retention's cutoff; expired dedupe keys at now; GCRA cells idle since
        then; batches and debounces whose run is gone). Returns how many."""
        ...

    def prune_wait_keys(self, limit: int) -> int:
        """Delete up to ``limit`` wait keys no wait uses any more."""
        ...
