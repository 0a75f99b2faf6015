"""The queue and its leases over SQL (mixed into ``SqlTx``): a lease pass's
reads of due partitions and their items, the take of the items chosen (with
their runs' events and memos), a partition's settling, and leases extended
or released (``QueueTx``).

A take is the statement every run pays for at its start, so the dialect
decides how few there are: where the database has data-modifying CTEs
(PostgreSQL) the items, their runs and their clocks are one statement
(``take_runs``), and a send's direct start folds its queue-order check in
(``take_runs_in_order``). A direct start has its runs' events as the send
wrote them in the same transaction: nothing is read back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from stepstone.store.rows import EventRow, LeasedRun, LeaseTerms, NewEvent, QueueItem, RunRow, StepRow
from stepstone.store.sqlbase import Dialect, SqlPlumbing, once

_Reads = tuple[Any, Any]  # a take's reads of its runs' events and memos, sent (results to fetch)


class SqlQueue(SqlPlumbing):
    """Lease passes, takes and leases (mixed into ``SqlTx``)."""

    def __init__(self, conn: Any, dialect: Dialect) -> None:
        super().__init__(conn, dialect)
        # What this transaction wrote of events and of the runs they started, so
        # that a send's direct start (``take_many(new=True)``) has its runs'
        # events without reading them back: events by seq, as inserted (built
        # into rows only when a take asks), and each new run's event seqs. A
        # run id or seq written again (a retried op, a seq SQLite reuses after
        # an op's savepoint rolled back) replaces its entry.
        self._new_events: dict[int, NewEvent] = {}
        self._new_runs: dict[str, Sequence[int]] = {}
        # A run whose one event's seq is read after the COMMIT (``record_event_starting``).
        self._later_events: dict[str, tuple[Callable[[], int | None], NewEvent]] = {}

    # -- queue and leases ---------------------------------------------------------------
    def due_partitions(self, function_ids: Sequence[str], now: float, limit: int) -> list[str]:
        if not function_ids:
            return []
        rows = self._all("due_partitions", {"now": now, "limit": limit}, {"function_ids": function_ids})
        return [r["key"] for r in rows]

    def partition_items(self, key: str, now: float, limit: int) -> list[QueueItem]:
        return [
            QueueItem.from_row(r)
            for r in self._all("partition_items", {"key": key, "now": now, "limit": limit})
        ]

    def due_ahead(self, key: str, now: float, run_ids: Sequence[str]) -> bool:
        return bool(self._all("due_ahead", {"key": key, "now": now}, {"queued_ids": run_ids}))

    def taken_here(self, run_ids: Sequence[str]) -> None:
        """Nothing to do: SQLite wakes no one at commit (``App`` pokes its workers)."""

    def live_leases(self, slot: int, ckey: str, now: float) -> int:
        row = self._one("live_ckey1" if slot == 1 else "live_ckey2", {"ckey": ckey, "now": now})
        return int(row["n"])

    def take(self, lease: LeaseTerms, run_id: str) -> LeasedRun | None:
        taken = self.take_many(lease, [run_id])
        return taken[0] if taken else None

    def take_many(
        self, lease: LeaseTerms, run_ids: Sequence[str], *, accumulators: bool = True, new: bool = False
    ) -> list[LeasedRun]:
        if not run_ids:
            return []
        items, runs, reads = self._take(lease, run_ids, new)
        return self._leased(run_ids, items, runs, accumulators=accumulators, new=new, reads=reads)

    def take_in_order_later(
        self, lease: LeaseTerms, key: str, queued: Sequence[str], run_ids: Sequence[str], *, settle: bool
    ) -> Callable[[], list[LeasedRun] | None]:
        if not self.dialect.write_ctes:
            taken: list[LeasedRun] | None = None
            if not self.due_ahead(key, lease.now, queued):
                taken = self.take_many(lease, run_ids, accumulators=False, new=True)
                if settle:
                    self._settle_taken(key, lease, run_ids)
            return lambda: taken
        params = {**_lease_params(lease), "key": key}
        sent = self._exec("take_runs_in_order", params, {"run_ids": run_ids, "queued_ids": queued})
        if settle:  # (sent behind the take: it settles only if the take took)
            self._settle_taken(key, lease, run_ids)
        reads = None  # every statement sent before the COMMIT: nothing is read after it but rows
        if not self._wrote_events(run_ids):
            reads = (self._exec("events_of_runs", None, {"run_ids": sorted(run_ids)}), None)

        @once
        def read() -> list[LeasedRun] | None:
            rows = sent.fetchall()
            if not rows:  # (the runs were queued in this transaction: a due item waits before them)
                return None
            items = {r["run_id"]: r for r in rows}
            runs = {r["id"]: r for r in rows}
            return self._leased(run_ids, items, runs, accumulators=False, new=True, reads=reads)

        return read

    def _settle_taken(self, key: str, lease: LeaseTerms, run_ids: Sequence[str]) -> None:
        """A direct start took every due item of the partition (if ``run_ids``
        are ``lease``'s): it is next due when its earliest item is, raised to
        that only where writers are serial (``settle_taken``)."""
        serial = int(self.dialect.key_lock is None)
        params = {"key": key, "now": lease.now, "run_id": run_ids[0], "owner": lease.owner, "raise": serial}
        self._exec("settle_taken", params)

    def _leased(
        self,
        run_ids: Sequence[str],
        items: dict[str, Any],
        runs: dict[str, Any],
        *,
        accumulators: bool,
        new: bool,
        reads: _Reads | None = None,
    ) -> list[LeasedRun]:
        """The taken runs with their events and memos, in the order of ``run_ids``
        (``reads``: their reads, already sent; else sent here)."""
        if not items:
            return []
        ids = {"run_ids": sorted(items)}
        if accumulators:
            self._exec("drop_debounce_of", None, ids)
            self._exec("drop_batch_of", None, ids)
        events = (self._written_events(items) if new else None) or self._events_of(
            ids["run_ids"], reads and reads[0]
        )
        steps: dict[str, list[StepRow]] = {run_id: [] for run_id in items}
        sizes: dict[str, dict[str, int]] = {run_id: {} for run_id in items}
        index = [] if new else (reads[1] if reads else self._exec("step_index", None, ids)).fetchall()
        for row in index:  # memos without outputs, sizes (of the runs taken)
            if row["run_id"] not in items:
                continue
            steps[row["run_id"]].append(StepRow.from_row(row))
            if row["output_bytes"] is not None:
                sizes[row["run_id"]][row["step_id"]] = row["output_bytes"]
        return [
            LeasedRun(
                run=RunRow.from_row(runs[run_id]),
                epoch=items[run_id]["epoch"],
                events=events[run_id],
                steps=steps[run_id],
                output_bytes=sizes[run_id],
                cancel_requested=bool(items[run_id]["cancel_requested"]),
                start_deadline=items[run_id]["start_deadline"],
            )
            for run_id in run_ids
            if run_id in items
        ]

    def _events_of(self, run_ids: Sequence[str], sent: Any = None) -> dict[str, list[EventRow]]:
        """The events of ``run_ids`` (``sent``: their read, already sent for
        these runs or more)."""
        events: dict[str, list[EventRow]] = {run_id: [] for run_id in run_ids}
        read = sent if sent is not None else self._exec("events_of_runs", None, {"run_ids": run_ids})
        for row in read.fetchall():
            if row["run_id"] in events:
                events[row["run_id"]].append(EventRow.from_row(row))
        return events

    def _send_reads(self, run_ids: Sequence[str]) -> _Reads:
        """A take's reads of its runs' events and memos, sent now: on PostgreSQL
        in the take's own round trip (a run not taken after all is ignored)."""
        ids = {"run_ids": run_ids}
        return self._exec("events_of_runs", None, ids), self._exec("step_index", None, ids)

    def _wrote_events(self, run_ids: Iterable[str]) -> bool:
        """Whether every one of the runs and their events was written in this
        transaction (reading nothing)."""
        for run_id in run_ids:
            if run_id in self._later_events:
                continue
            seqs = self._new_runs.get(run_id)
            if seqs is None or any(seq not in self._new_events for seq in seqs):
                return False
        return True

    def _written_events(self, run_ids: Iterable[str]) -> dict[str, list[EventRow]] | None:
        """The events of runs created in this transaction, as written (``None``
        unless every one of the runs and their events was)."""
        if not self._wrote_events(run_ids):
            return None
        events: dict[str, list[EventRow]] = {}
        for run_id in run_ids:
            later = self._later_events.get(run_id)
            if later is None:
                events[run_id] = [self._new_events[seq].stored(seq) for seq in self._new_runs[run_id]]
                continue
            seq, event = later[0](), later[1]
            assert seq is not None  # (its run was written, so was its event)
            events[run_id] = [event.stored(seq)]
        return events

    def _take(
        self, lease: LeaseTerms, run_ids: Sequence[str], new: bool
    ) -> tuple[dict[str, Any], dict[str, Any], _Reads | None]:
        """Take the items and mark their runs running: their queue rows and their
        run rows by run id, and (unless ``new``) the reads of their events and
        memos, sent. One statement with data-modifying CTEs (``take_runs``, its
        reads sent behind it: one round trip), else one for the items, one per
        distinct epoch for the runs, one for the clocks."""
        params = _lease_params(lease)
        if self.dialect.write_ctes:
            taken = self._exec("take_runs", params, {"run_ids": run_ids})
            reads = None if new else self._send_reads(run_ids)
            rows = taken.fetchall()
            return {r["run_id"]: r for r in rows}, {r["id"]: r for r in rows}, reads
        items = {r["run_id"]: r for r in self._all("take_items", params, {"run_ids": run_ids})}
        by_epoch: dict[int, list[str]] = {}
        for run_id, item in items.items():
            by_epoch.setdefault(int(item["epoch"]), []).append(run_id)
        runs: dict[str, Any] = {}
        for epoch, taken in by_epoch.items():
            marked = self._all("mark_running", {**params, "epoch": epoch}, {"run_ids": sorted(taken)})
            runs.update((r["id"], r) for r in marked)
        if items:
            self._exec("start_clock", params, {"run_ids": sorted(items)})
        return items, runs, None

    def settle_partition(self, key: str, now: float, next_at: float | None, recheck: float) -> None:
        """Record a lease pass over a partition: it is next due when its earliest
        future item is, or at ``next_at`` if sooner; drop it when empty."""
        if next_at is None or next_at > now:
            row = self._one("partition_times", {"key": key, "now": now})
            if row["first_at"] is None:
                self._exec("delete_partition", {"key": key})
                return
            if next_at is None and float(row["first_at"]) <= now:
                next_at = recheck  # a due item was locked by another transaction: skipped
            if row["next_at"] is not None:
                future = float(row["next_at"])
                next_at = future if next_at is None else min(next_at, future)
        due = next_at is not None and next_at <= now
        self._exec(
            "settle_partition_due" if due else "settle_partition",
            {"key": key, "now": now, "next_at": next_at},
        )

    def next_due(self, function_ids: Sequence[str]) -> float | None:
        if not function_ids:
            return None
        row = self._exec("next_due", {}, {"function_ids": function_ids}).fetchone()
        return None if row is None or row["due"] is None else float(row["due"])

    def extend_leases(self, owner: str, run_ids: Sequence[str], until: float, now: float) -> list[str]:
        if not run_ids:
            return []
        rows = self._all("extend_leases", {"owner": owner, "until": until, "now": now}, {"run_ids": run_ids})
        return [r["run_id"] for r in rows]

    def release_leases(self, owner: str, now: float) -> int:
        self._exec("wake_owner_partitions", {"owner": owner, "now": now})
        return int(self._exec("release_leases", {"owner": owner, "now": now}).rowcount)


def _lease_params(lease: LeaseTerms) -> dict[str, Any]:
    return {"owner": lease.owner, "until": lease.until, "now": lease.now, "app_version": lease.app_version}


def started_run(row: Any, event: EventRow, start_deadline: float | None) -> LeasedRun:
    """A run a send's direct start wrote taken (``record_event_starting``
    with a lease), from its row as written: what its take would give."""
    run = RunRow.from_row(row)
    epoch = int(row["epoch"])
    return LeasedRun(run=run, epoch=epoch, events=[event], steps=[], start_deadline=start_deadline)
