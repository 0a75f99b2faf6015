"""An in-memory store for the fast unit tier: the roles the interpreter and the
scheduler use (``RunsTx``, ``QueueTx``, ``JournalTx``, ``WaitsTx``, ``FlowTx``,
``ActionsTx``), as plain Python over dicts.

It lives under tests/ because it serves tests only: users test their functions
with ``stepstone.testing.TestEnv``, which runs the real SQLite store. It must
not drift from the real stores: tests/integration/test_store_contract.py runs
its contract over it as a third backend (``memory``) for every test that only
touches these roles. Each method mirrors its statement in store/queries.sql;
a transaction that raises is rolled back by restoring a copy of the state.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from stepstone.errors import LeaseLostError
from stepstone.store.base import (
    AccumulatorKind,
    ActionsTx,
    FlowTx,
    JournalTx,
    QueueTx,
    RunsTx,
    Store,
    WaitsTx,
)
from stepstone.store.rows import (
    ACTIVE_STATUSES,
    ENDED_STATUSES,
    CancelFlag,
    EventRow,
    Fence,
    LeasedRun,
    LeaseTerms,
    NewEvent,
    NewRun,
    QueueItem,
    QueueSpec,
    Recorded,
    RunClosed,
    RunEnd,
    RunFilter,
    RunRead,
    RunRow,
    RunStatus,
    SpanRow,
    StepRow,
    StepStatus,
    WaitKind,
    WaitRow,
)
from tests.fakes.state import Item, MemoryState, Partition, Run

T = TypeVar("T")


class MemoryTx:
    """The fake's domain operations over one ``MemoryState``."""

    def __init__(self, state: MemoryState) -> None:
        self.s = state

    # -- RunsTx ------------------------------------------------------------------------------
    def insert_event(self, event: NewEvent) -> int:
        seq = self.s.next_seq
        self.s.next_seq += 1
        self.s.events[seq] = event.stored(seq)
        return seq

    def record_event(self, event: NewEvent, dedupe_until: float) -> int | None:
        if self.claim_key(f"event:{event.id}", event.id, dedupe_until, event.received_at) is not None:
            return None
        return self.insert_event(event)

    def record_event_starting(
        self, event: NewEvent, dedupe_until: float, run: NewRun, lease: LeaseTerms | None = None
    ) -> Callable[[], Recorded]:
        awaited = bool(self.wait_keys(event.name))
        seq = None if awaited else self.record_event(event, dedupe_until)
        started = None
        if seq is not None:
            key = run.queue_spec.partition_key
            taking = lease is not None and not self.due_ahead(key, lease.now, [run.id])
            self.create_run(dataclasses.replace(run, event_seqs=[seq]))
            if lease is not None and taking:  # (the same state as written taken)
                started = self.take(lease, run.id)
                self._settle_taken(key, lease.now)
        return lambda: (seq, awaited, started)

    def create_run(self, run: NewRun) -> None:
        if run.id in self.s.runs:
            raise ValueError(f"run {run.id} exists")  # the primary key
        ended = run.status not in ACTIVE_STATUSES
        row = RunRow(
            id=run.id,
            function_id=run.function_id,
            status=run.status,
            event_ids=list(run.event_ids),
            output=None,
            error=run.error,
            created_at=run.created_at,
            started_at=None,
            ended_at=run.created_at if ended else None,
            attempt=0,
            app_version=None,
            parent_run_id=run.parent_run_id,
            parent_step_id=run.parent_step_id,
            meta=run.meta,
            singleton_key=run.singleton_key,
        )
        self.s.runs[run.id] = Run(row=row, queue_spec=run.spec, event_seqs=list(run.event_seqs))
        if not ended:
            spec = run.spec or QueueSpec(partition_key=run.partition or run.function_id)
            sort_at = run.available_at if run.sort_at is None else run.sort_at
            self._enqueue(run.id, run.function_id, spec, run.available_at, sort_at, run.start_deadline)

    def _enqueue(
        self,
        run_id: str,
        function_id: str,
        spec: QueueSpec,
        available_at: float,
        sort_at: float,
        start_deadline: float | None,
    ) -> None:
        self.s.queue[run_id] = Item(
            run_id=run_id,
            function_id=function_id,
            partition_key=spec.partition_key,
            available_at=available_at,
            sort_at=sort_at,
            ckey1=spec.ckey1,
            limit1=spec.limit1,
            ckey2=spec.ckey2,
            limit2=spec.limit2,
            throttle_key=spec.throttle_key,
            start_deadline=start_deadline,
            epoch=self.s.runs[run_id].epoch if run_id in self.s.runs else 0,
        )
        self.lower_partition(spec.partition_key, function_id, spec.ckey1, available_at)

    def get_run(self, run_id: str) -> RunRow | None:
        run = self.s.runs.get(run_id)
        return None if run is None else run.row

    def lock_run(self, run_id: str) -> RunRow | None:
        return self.get_run(run_id)  # one transaction at a time

    def get_steps(self, run_id: str) -> list[StepRow]:
        steps = [s for (r, _), s in self.s.steps.items() if r == run_id]
        return sorted(steps, key=lambda s: s.position)

    def runs_page(self, where: RunFilter) -> tuple[list[RunRow], dict[str, list[StepRow]]]:
        runs = self.list_runs(where)
        return runs, self.steps_of_runs([run.id for run in runs])

    def ended_run(self, run_id: str) -> tuple[RunRow | None, list[StepRow] | None]:
        run = self.get_run(run_id)
        ended = run is not None and run.status in ENDED_STATUSES
        return run, self.get_steps(run_id) if ended else None

    def ended_run_later(self, run_id: str) -> Callable[[], RunRead]:
        value = self.ended_run(run_id)
        return lambda: value

    def steps_of_runs(self, run_ids: Sequence[str]) -> dict[str, list[StepRow]]:
        return {run_id: self.get_steps(run_id) for run_id in run_ids}

    def get_step(self, run_id: str, step_id: str) -> StepRow | None:
        return self.s.steps.get((run_id, step_id))

    def step_outputs(self, run_id: str, first: int, last: int) -> dict[str, str | None]:
        return {
            s.step_id: s.output
            for s in self.get_steps(run_id)
            if first <= s.position <= last and s.status == StepStatus.COMPLETED
        }

    def get_events(self, run_id: str) -> list[EventRow]:
        return [self.s.events[seq] for seq in self.s.runs[run_id].event_seqs] if run_id in self.s.runs else []

    def list_runs(self, where: RunFilter) -> list[RunRow]:
        rows = [
            r.row
            for r in self.s.runs.values()
            if (where.function_id is None or r.row.function_id == where.function_id)
            and (not where.statuses or r.row.status in where.statuses)
            and (where.since is None or r.row.created_at >= where.since)
            and (where.until is None or r.row.created_at < where.until)
            and (where.before_id is None or r.row.id < where.before_id)
            and (where.event_id is None or where.event_id in r.row.event_ids)
            and (where.app_version is None or r.row.app_version == where.app_version)
        ]
        return sorted(rows, key=lambda r: r.id, reverse=True)[: where.limit]

    def get_spans(self, run_id: str) -> list[SpanRow]:
        return [s for s in self.s.spans if s.run_id == run_id]

    def events_since(self, names: Sequence[str], since: float, now: float, limit: int) -> list[EventRow]:
        found = [e for e in self.s.events.values() if e.name in names and since <= e.received_at <= now]
        return sorted(found, key=lambda e: (e.received_at, e.seq))[:limit]

    def user_sql(self, fn: Callable[[Any], T], seconds: float) -> T:
        raise NotImplementedError("the in-memory fake has no SQL connection for a step.transaction")

    def list_events(
        self, name: str | None, event_id: str | None, before_seq: int | None, limit: int
    ) -> list[EventRow]:
        """The one view the fake keeps (``ViewsTx``): the event log, newest first."""
        found = [
            e
            for seq, e in sorted(self.s.events.items(), reverse=True)
            if (name is None or e.name == name)
            and (event_id is None or e.id == event_id)
            and (before_seq is None or seq < before_seq)
        ]
        return found[:limit]

    # -- LocksTx, GcraTx (writers are serial here, as in SQLite) -------------------------------
    def lock(self, key: str) -> None:
        return None

    def try_lock(self, key: str) -> bool:
        return True

    def server_time(self) -> float | None:
        return None

    def gcra_tat(self, key: str) -> float | None:
        return self.s.gcra.get(key)

    def set_gcra_tat(self, key: str, tat: float) -> None:
        self.s.gcra[key] = tat

    # -- QueueTx ---------------------------------------------------------------------------------
    def due_partitions(self, function_ids: Sequence[str], now: float, limit: int) -> list[str]:
        due = [
            (p.last_served, key)
            for key, p in self.s.partitions.items()
            if p.next_at is not None and p.next_at <= now and p.function_id in function_ids
        ]
        return [key for _, key in sorted(due)[:limit]]

    def partition_items(self, key: str, now: float, limit: int) -> list[QueueItem]:
        due = sorted(
            (i for i in self.s.queue.values() if i.partition_key == key and i.due(now)),
            key=lambda i: (i.sort_at, i.run_id),
        )
        return [
            QueueItem(
                run_id=i.run_id,
                function_id=i.function_id,
                ckey1=i.ckey1,
                limit1=i.limit1,
                ckey2=i.ckey2,
                limit2=i.limit2,
                throttle_key=i.throttle_key,
                fresh=i.fresh,
            )
            for i in due[:limit]
        ]

    def due_ahead(self, key: str, now: float, run_ids: Sequence[str]) -> bool:
        return any(
            i.partition_key == key and i.due(now) and i.run_id not in run_ids for i in self.s.queue.values()
        )

    def _settle_taken(self, key: str, now: float) -> None:
        part = self.s.partitions.get(key)
        times = [i.available_at for i in self.s.queue.values() if i.partition_key == key]
        if part is not None:
            part.next_at, part.last_served = min((t for t in times if t is not None), default=None), now

    def taken_here(self, run_ids: Sequence[str]) -> None:
        pass  # no wake-ups

    def live_leases(self, slot: int, ckey: str, now: float) -> int:
        return sum(
            1 for i in self.s.queue.values() if (i.ckey1 if slot == 1 else i.ckey2) == ckey and i.live(now)
        )

    def take(self, lease: LeaseTerms, run_id: str) -> LeasedRun | None:
        item = self.s.queue.get(run_id)
        if item is None:
            return None
        now, app_version = lease.now, lease.app_version
        item.owner, item.epoch, item.available_at = lease.owner, item.epoch + 1, lease.until
        item.wake_requested, item.fresh = False, False
        run = self.s.runs[run_id]
        row = run.row
        status = RunStatus.RUNNING if row.status in _PARKED else row.status
        run.row = dataclasses.replace(
            row,
            status=status,
            started_at=row.started_at if row.started_at is not None else now,
            app_version=app_version if app_version is not None else row.app_version,
        )
        run.epoch = item.epoch
        self.s.accumulators = {k: v for k, v in self.s.accumulators.items() if v[0] != run_id}
        return LeasedRun(
            run=run.row,
            epoch=item.epoch,
            events=self.get_events(run_id),
            steps=[dataclasses.replace(s, output=None) for s in self.get_steps(run_id)],
            cancel_requested=item.cancel_requested,
            output_bytes={
                s.step_id: len(s.output.encode()) for s in self.get_steps(run_id) if s.output is not None
            },
            start_deadline=item.start_deadline,
        )

    def take_many(
        self, lease: LeaseTerms, run_ids: Sequence[str], *, accumulators: bool = True, new: bool = False
    ) -> list[LeasedRun]:
        taken = [self.take(lease, run_id) for run_id in run_ids]
        return [leased for leased in taken if leased is not None]

    def take_in_order_later(
        self, lease: LeaseTerms, key: str, queued: Sequence[str], run_ids: Sequence[str], *, settle: bool
    ) -> Callable[[], list[LeasedRun] | None]:
        taken = None
        if not self.due_ahead(key, lease.now, queued):
            taken = self.take_many(lease, run_ids, accumulators=False, new=True)
            if settle:
                self._settle_taken(key, lease.now)
        return lambda: taken

    def settle_partition(self, key: str, now: float, next_at: float | None, recheck: float) -> None:
        part = self.s.partitions.get(key)
        if next_at is None or next_at > now:
            times = [
                i.available_at
                for i in self.s.queue.values()
                if i.partition_key == key and i.available_at is not None
            ]
            if not times:
                self.s.partitions.pop(key, None)
                return
            future = [t for t in times if t > now]
            if next_at is None and min(times) <= now:
                next_at = recheck
            if future:
                next_at = min(future) if next_at is None else min(next_at, min(future))
        if part is not None:
            part.next_at, part.last_served = next_at, now

    def lower_partition(self, key: str, function_id: str, ckey: str | None, at: float) -> None:
        part = self.s.partitions.get(key)
        if part is None:
            self.s.partitions[key] = Partition(function_id=function_id, ckey=ckey, next_at=at)
        elif part.next_at is None or part.next_at > at:
            part.next_at = at

    def next_due(self, function_ids: Sequence[str]) -> float | None:
        times = [
            p.next_at
            for p in self.s.partitions.values()
            if p.function_id in function_ids and p.next_at is not None
        ]
        return min(times) if times else None

    def extend_leases(self, owner: str, run_ids: Sequence[str], until: float, now: float) -> list[str]:
        extended = []
        for run_id in run_ids:
            item = self.s.queue.get(run_id)
            if item is not None and item.owner == owner and item.live(now):
                item.available_at = until
                extended.append(run_id)
        return extended

    def release_leases(self, owner: str, now: float) -> int:
        mine = [i for i in self.s.queue.values() if i.owner == owner]
        for item in mine:
            part = self.s.partitions.get(item.partition_key)
            if part is not None and (part.next_at is None or part.next_at > now):
                part.next_at = now
            item.owner, item.available_at = None, now
        return len(mine)

    def unqueue_run(self, run_id: str, now: float) -> None:
        item = self.s.queue.pop(run_id, None)
        if item is not None:
            self._released(item, now, None)

    def _released(self, item: Item, now: float, available_at: float | None) -> None:
        if available_at is not None:
            self.lower_partition(item.partition_key, item.function_id, item.ckey1, available_at)
        for part in self.s.partitions.values():
            woken = (item.ckey1 is not None and part.ckey == item.ckey1) or (
                item.ckey2 is not None and part.function_id == item.function_id
            )
            if woken and (part.next_at is None or part.next_at > now):
                part.next_at = now

    # -- JournalTx ----------------------------------------------------------------------------------
    def _fenced(self, fence: Fence) -> Item:
        item = self.s.queue.get(fence.run_id)
        if item is None or item.owner != fence.owner or item.epoch != fence.epoch:
            raise LeaseLostError(f"run {fence.run_id}: lease lost by {fence.owner}")
        return item

    def checkpoint(self, fence: Fence, steps: Sequence[StepRow], spans: Sequence[SpanRow]) -> CancelFlag:
        cancel = self._fenced(fence).cancel_requested
        self.save_steps(steps, spans)
        return lambda: cancel

    def save_steps(self, steps: Sequence[StepRow], spans: Sequence[SpanRow]) -> None:
        for step in steps:
            key = (step.run_id, step.step_id)
            old = self.s.steps.get(key)
            if old is None:
                self.s.steps[key] = step
            elif step.status != StepStatus.WAITING:  # the upsert keeps the first position
                self.s.steps[key] = dataclasses.replace(step, position=old.position)
        self.s.spans.extend(spans)

    def reschedule(
        self, fence: Fence, status: RunStatus, available_at: float | None, attempt: int | None, now: float
    ) -> bool:
        item = self._fenced(fence)
        due_now = item.wake_requested or item.cancel_requested
        item.owner, item.wake_requested = None, False
        item.available_at = now if due_now else available_at
        self._released(item, now, item.available_at)
        if item.cancel_requested:
            return True
        run = self.s.runs[fence.run_id]
        run.row = dataclasses.replace(
            run.row, status=status, attempt=run.row.attempt if attempt is None else attempt
        )
        run.written_by = fence.token
        return False

    def finish_run(self, end: RunEnd) -> bool:
        fence, run_id = end.fence, end.run_id
        item = self._fenced(fence) if fence is not None else self.s.queue.get(run_id)
        if item is not None:
            del self.s.queue[run_id]
            self._released(item, end.now, None)
        run = self.s.runs.get(run_id)
        if run is None or run.row.status in ENDED_STATUSES:
            return False
        run.row = dataclasses.replace(
            run.row, status=end.status, output=end.output, error=end.error, ended_at=end.now
        )
        run.written_by = None if fence is None else fence.token
        return True

    def close_run(self, end: RunEnd, waited_event: str) -> RunClosed | None:
        if not self.finish_run(end):
            return None
        self.delete_run_waits(end.run_id)
        return RunClosed(
            invoked=bool(self.child_waits(end.run_id)), waited=bool(self.wait_keys(waited_event))
        )

    def written_by(self, run_id: str) -> str | None:
        run = self.s.runs.get(run_id)
        return None if run is None else run.written_by

    # -- ActionsTx ----------------------------------------------------------------------------------
    def requeue_run(self, run_id: str, now: float, reset_steps: Sequence[str] | None) -> None:
        run = self.s.runs.get(run_id)
        if run is None:
            return
        for step_id in reset_steps or ():
            self.s.steps.pop((run_id, step_id), None)
        status = RunStatus.QUEUED if run.row.started_at is None else RunStatus.RUNNING
        run.row = dataclasses.replace(
            run.row, status=status, output=None, error=None, ended_at=None, attempt=0
        )
        if run_id not in self.s.queue:
            spec = run.queue_spec or QueueSpec(partition_key=run.row.function_id)
            self._enqueue(run_id, run.row.function_id, spec, now, now, None)

    def queue_spec(self, run_id: str) -> QueueSpec | None:
        run = self.s.runs.get(run_id)
        return None if run is None else run.queue_spec

    def lock_lease(self, run_id: str, now: float) -> bool:
        item = self.s.queue.get(run_id)
        return item is not None and item.live(now)

    def flag_cancel(self, run_id: str, now: float, reason: str | None = None) -> bool:
        item = self.s.queue.get(run_id)
        if item is None or not item.live(now):
            return False
        if not item.cancel_requested:
            item.cancel_reason = reason
        item.cancel_requested = True
        return True

    def cancel_reason(self, run_id: str) -> str | None:
        item = self.s.queue.get(run_id)
        return item.cancel_reason if item is not None and item.cancel_requested else None

    # -- WaitsTx ------------------------------------------------------------------------------------
    def insert_wait(self, wait: WaitRow) -> None:
        self._insert_wait(wait)

    def start_wait(self, wait: WaitRow) -> Callable[[], bool]:
        step = self.s.steps.get((wait.run_id, wait.step_id))
        inserted = step is not None and step.status == StepStatus.WAITING and self._insert_wait(wait)
        return lambda: inserted

    def _insert_wait(self, wait: WaitRow) -> bool:
        key = (wait.event_name, wait.match_key)
        if wait.event_name:
            self.s.wait_keys.add(key)
            self.s.key_versions[key] = self.s.key_versions.get(key, 0) + 1
        if any(w.run_id == wait.run_id and w.step_id == wait.step_id for w in self.s.waits.values()):
            return False
        wait_id = self.s.next_wait
        self.s.next_wait += 1
        self.s.waits[wait_id] = dataclasses.replace(wait, id=wait_id)
        self.s.wait_versions[wait_id] = self.s.key_versions.get(key, 0)
        return True

    def set_wait_match(self, run_id: str, step_id: str, match_value: str) -> None:
        for wait_id, w in self.s.waits.items():
            if w.run_id == run_id and w.step_id == step_id:
                self.s.waits[wait_id] = dataclasses.replace(w, match_value=match_value)

    def wait_keys(self, event_name: str) -> list[str]:
        return [key for name, key in self.s.wait_keys if name == event_name]

    def wait_keys_later(self, event_name: str) -> Callable[[], list[str]]:
        return lambda: self.wait_keys(event_name)

    def match_waits(self, event_name: str, match_key: str, match_value: str, now: float) -> list[WaitRow]:
        return [
            w
            for _, w in sorted(self.s.waits.items())
            if (w.event_name, w.match_key, w.match_value) == (event_name, match_key, match_value)
            and (w.expires_at is None or w.expires_at > now)
        ]

    def wait_key_version(self, event_name: str, match_key: str) -> tuple[int, str] | None:
        key = (event_name, match_key)
        return (self.s.key_versions.get(key, 0), "fake") if key in self.s.wait_keys else None

    def unindexed_waits_after(self, event_name: str, version: int, now: float) -> list[WaitRow]:
        return [
            w
            for i, w in sorted(self.s.waits.items())
            if (w.event_name, w.match_key) == (event_name, "")
            and self.s.wait_versions.get(i, 0) > version
            and (w.expires_at is None or w.expires_at > now)
        ]

    def match_any_waits(
        self, event_name: str, match_key: str, match_values: Sequence[str], now: float
    ) -> list[WaitRow]:
        return [
            w
            for _, w in sorted(self.s.waits.items())
            for value in (w.match_value, *w.also_match)
            if (w.event_name, w.match_key) == (event_name, match_key)
            and value in match_values
            and (w.expires_at is None or w.expires_at > now)
        ]

    def match_range_waits(
        self, event_name: str, match_key: str, low: float, high: float, now: float
    ) -> list[WaitRow]:
        return [
            w
            for _, w in sorted(self.s.waits.items())
            if (w.event_name, w.match_key) == (event_name, match_key)
            and w.match_number is not None
            and low <= w.match_number <= high
            and (w.expires_at is None or w.expires_at > now)
        ]

    def claim_wait(self, wait_id: int) -> bool:
        return self.s.waits.pop(wait_id, None) is not None

    def claim_step_waits(self, run_id: str, step_id: str) -> bool:
        mine = [i for i, w in self.s.waits.items() if (w.run_id, w.step_id) == (run_id, step_id)]
        for wait_id in mine:
            del self.s.waits[wait_id]
        return bool(mine)

    def delete_run_waits(self, run_id: str) -> None:
        self.s.waits = {i: w for i, w in self.s.waits.items() if w.run_id != run_id}

    def child_waits(self, child_run_id: str) -> list[WaitRow]:
        return [
            w
            for w in self.s.waits.values()
            if w.kind == WaitKind.INVOKE and w.event_name == "" and w.match_value == child_run_id
        ]

    def complete_waiting_step(
        self, run_id: str, step_id: str, status: StepStatus, output: str | None, error: str | None, now: float
    ) -> bool:
        step = self.s.steps.get((run_id, step_id))
        if step is None or step.status != StepStatus.WAITING:
            return False
        self.s.steps[(run_id, step_id)] = dataclasses.replace(
            step, status=status, output=output, error=error, ended_at=now
        )
        return True

    def wake_run(self, run_id: str, now: float) -> None:
        item = self.s.queue.get(run_id)
        if item is None:
            return
        if item.owner is None or item.due(now):
            item.available_at = now
        item.wake_requested = item.owner is not None
        if item.available_at is not None:
            self.lower_partition(item.partition_key, item.function_id, item.ckey1, item.available_at)

    # -- FlowTx ---------------------------------------------------------------------------------------
    def claim_key(self, key: str, ref: str, expires_at: float, now: float) -> str | None:
        held = self.s.keys.get(key)
        if held is not None and held[1] > now:
            return held[0]
        self.s.keys[key] = (ref, expires_at)
        return None

    def release_key(self, key: str, ref: str) -> None:
        if self.s.keys.get(key, ("", 0.0))[0] == ref:
            del self.s.keys[key]

    def get_accumulator(self, kind: AccumulatorKind, key: str) -> tuple[str, int, float] | None:
        return self.s.accumulators.get((kind, key))

    def put_accumulator(
        self, kind: AccumulatorKind, key: str, run_id: str, size: int, first_at: float
    ) -> None:
        self.s.accumulators[(kind, key)] = (run_id, size if kind == "batch" else 1, first_at)

    def close_batch(self, key: str) -> None:
        self.s.accumulators.pop(("batch", key), None)

    def pending_item(self, run_id: str) -> bool:
        item = self.s.queue.get(run_id)
        return item is not None and item.owner is None and item.fresh

    def move_item(self, run_id: str, at: float, sort_at: float) -> None:
        item = self.s.queue.get(run_id)
        if item is not None:
            item.available_at, item.sort_at = at, sort_at
            self.lower_partition(item.partition_key, item.function_id, item.ckey1, at)

    def set_run_events(self, run_id: str, events: Sequence[tuple[int, str]], replace: bool) -> None:
        run = self.s.runs[run_id]
        seq, event_id = events[-1]
        if replace:
            run.event_seqs[0:1] = [seq]
            ids = [event_id]
        else:
            run.event_seqs.append(seq)
            ids = [*run.row.event_ids, event_id]
        run.row = dataclasses.replace(run.row, event_ids=ids)


_PARKED = (RunStatus.QUEUED, RunStatus.SLEEPING, RunStatus.WAITING)


class MemoryStore:
    """A ``Store`` over ``MemoryTx``: each operation is one serial transaction;
    one that raises leaves the state as it was."""

    dialect = "memory"
    wakes_own_subscribers = False

    def __init__(self) -> None:
        self.state = MemoryState()
        self._serial = threading.Lock()
        self._inside = threading.local()

    def transact_sync(self, op: Callable[[Any], T]) -> T:
        if getattr(self._inside, "active", False):
            raise RuntimeError("a transaction inside a transaction (the real stores would deadlock too)")
        with self._serial:
            self._inside.active = True
            saved = copy.deepcopy(self.state)
            try:
                return op(MemoryTx(self.state))
            except BaseException:
                self.state = saved
                raise
            finally:
                self._inside.active = False

    read_sync = transact_sync

    async def transact(self, op: Callable[[Any], T]) -> T:
        return self.transact_sync(op)

    async def read(self, op: Callable[[Any], T]) -> T:
        return self.transact_sync(op)

    def submit(self, op: Callable[[Any], T]) -> asyncio.Future[T]:
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        try:
            future.set_result(self.transact_sync(op))
        except Exception as exc:  # noqa: BLE001 - handed to the awaiting caller
            future.set_exception(exc)
        return future

    def migrate(self) -> list[str]:
        return []

    def change_token(self) -> Any:
        return None

    def subscribe(self, callback: Callable[[], Any]) -> Callable[[], None]:
        return lambda: None

    def close(self) -> None:
        return None


class MemoryRoles(RunsTx, QueueTx, JournalTx, ActionsTx, WaitsTx, FlowTx, Protocol):
    """The roles the fake implements (mypy checks ``MemoryTx`` against them)."""


def _implements(tx: MemoryTx) -> MemoryRoles:
    return tx  # a type error here means the fake no longer matches a role's signatures


def _a_store(store: MemoryStore) -> Store:
    return store  # ... or the Store protocol
