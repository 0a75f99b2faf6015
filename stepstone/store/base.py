"""The narrow, domain-level storage interface.

A ``Store`` runs *operations*: plain functions ``op(tx) -> T`` that call the
domain methods of a ``Tx`` inside one transaction. ``await store.transact(op)``
may share its transaction with other operations submitted at the same moment
(group commit); each caller still waits for its own commit, and an operation
that raises is rolled back alone. ``transact_sync`` runs one operation in its
own transaction from any thread.

Serialisation lives above this layer: values arrive and leave as JSON text.
All times are epoch seconds supplied by the caller, so the testing harness can
run on a virtual clock. Real-time callers read a clock corrected to the
database server's (``Tx.server_time``, ``stepstone.clocksync``), so every
process compares and writes times on one clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from stepstone.store.rows import (
    BacklogRow,
    CancelFlag,
    EventRow,
    EventRunRow,
    Fence,
    JobRow,
    KeyBacklogRow,
    LeasedRun,
    NewRun,
    Pruned,
    QueueItem,
    QueueSpec,
    RunCountRow,
    RunFilter,
    RunRow,
    RunStatus,
    SpanRow,
    StepRow,
    TableSize,
    TimedOut,
    TimelineRow,
    WaitRow,
    WorkerRow,
)

T = TypeVar("T")
Op = Callable[["Tx"], T]


class Tx(Protocol):
    """Domain operations inside one transaction."""

    # --- functions registry ---------------------------------------------------
    def register_functions(
        self, app: str, configs: dict[str, str], now: float, *, retire_others: bool = False
    ) -> None:
        """Upsert the JSON descriptions of ``app``'s functions by function id
        (bringing back any that were retired). With ``retire_others`` (a worker:
        ``configs`` is the whole function set of the deployed code), the
        functions ``app`` registered before and are not in ``configs`` are
        retired; an empty ``configs`` retires nothing."""
        ...

    def load_functions(self) -> dict[str, tuple[str, str]]:
        """Every registered function, retired ones included: ``{id: (app, config_json)}``."""
        ...

    def retired_functions(self) -> dict[str, float]:
        """The retired functions: ``{id: retired_at}``."""
        ...

    # --- dedupe keys ------------------------------------------------------------
    def claim_key(self, key: str, ref: str, expires_at: float, now: float) -> str | None:
        """Claim ``key`` until ``expires_at``. Returns ``None`` when claimed now,
        or the ``ref`` of the live claim that already holds it."""
        ...

    # --- events and runs ----------------------------------------------------------
    def insert_event(
        self, event_id: str, name: str, data: str, ts: int, now: float, trace: str | None = None
    ) -> int:
        """Append an event to the log (with the sender's trace context, if any);
        returns its sequence number."""
        ...

    def create_run(self, run: NewRun) -> None:
        """Insert a run, its links to events and (unless it ended) its queue item."""
        ...

    def get_run(self, run_id: str) -> RunRow | None: ...

    def get_steps(self, run_id: str) -> list[StepRow]: ...

    def get_events(self, run_id: str) -> list[EventRow]: ...

    def list_runs(self, where: RunFilter) -> list[RunRow]:
        """Newest first; ``before_id`` continues a previous page."""
        ...

    def get_spans(self, run_id: str) -> list[SpanRow]: ...

    # --- queue and leases -------------------------------------------------------
    def due_partitions(self, function_ids: Sequence[str], now: float, limit: int) -> list[str]:
        """Partitions of ``function_ids`` that may have due work, least recently
        served first (locked for this transaction where the database can)."""
        ...

    def partition_items(self, key: str, now: float, limit: int) -> list[QueueItem]:
        """A partition's due items in queue order (``sort_at``: priority applied)."""
        ...

    def live_leases(self, slot: int, ckey: str, now: float) -> int:
        """Runs holding a live lease under concurrency key ``ckey`` (slot 1 or 2)."""
        ...

    def take(
        self, owner: str, run_id: str, now: float, until: float, app_version: str | None = None
    ) -> LeasedRun | None:
        """Lease one item until ``until``, bumping the run's epoch so older owners
        are fenced out; marks the run running (recording ``app_version``, when
        given, as the version of the code running it) and reads its events and memos."""
        ...

    def settle_partition(self, key: str, now: float, next_at: float | None, recheck: float) -> None:
        """After a lease pass: set the partition's next due time (``None``: its
        earliest future item) and mark it served; drop it if empty. With
        ``next_at`` ``None``, a due item the pass did not see (another
        transaction held its row) makes the partition due again at ``recheck``."""
        ...

    def lower_partition(self, key: str, function_id: str, ckey: str | None, at: float) -> None:
        """Make sure the partition is looked at no later than ``at``."""
        ...

    def next_due(self, function_ids: Sequence[str]) -> float | None:
        """When a partition of ``function_ids`` is next due."""
        ...

    # --- flow control state -----------------------------------------------------------
    def lock(self, key: str) -> None:
        """Hold a lock on ``key`` until the transaction ends, so concurrent
        read-then-write of its state (GCRA, accumulators, slot counts) cannot
        interleave (a no-op where writers are already serial, as in SQLite)."""
        ...

    def server_time(self) -> float | None:
        """The database server's clock now, in epoch seconds; ``None`` when the
        database runs on this machine's clock (SQLite)."""
        ...

    def try_lock(self, key: str) -> bool:
        """``lock`` without waiting: ``False`` if another transaction holds it."""
        ...

    def gcra_tat(self, key: str) -> float | None:
        """The theoretical arrival time of a throttle or rate-limit key."""
        ...

    def set_gcra_tat(self, key: str, tat: float) -> None: ...

    def get_accumulator(self, kind: str, key: str) -> tuple[str, int, float] | None:
        """The open debounce or batch run for a key: (run id, size, first_at)."""
        ...

    def put_accumulator(self, kind: str, key: str, run_id: str, size: int, first_at: float) -> None: ...

    def close_batch(self, key: str) -> None: ...

    def pending_item(self, run_id: str) -> bool:
        """Queued and never leased (a debounced or batching run may still change)."""
        ...

    def move_item(self, run_id: str, at: float, sort_at: float) -> None:
        """Change when a queued item is due."""
        ...

    def set_run_events(self, run_id: str, events: Sequence[tuple[int, str]], replace: bool) -> None:
        """Replace a run's event (debounce) or append one (batch)."""
        ...

    def extend_leases(self, owner: str, run_ids: Sequence[str], until: float, now: float) -> list[str]:
        """Push the leases this owner still holds live at ``now``; returns their run
        ids. A lease that lapsed is never extended (others may have acted on it)."""
        ...

    def release_leases(self, owner: str, now: float) -> int:
        """Give back every lease of ``owner`` so others may take the runs now."""
        ...

    # --- checkpoints (fenced) -----------------------------------------------------
    def checkpoint(self, fence: Fence, steps: Sequence[StepRow], spans: Sequence[SpanRow]) -> CancelFlag:
        """Save step memos and trace spans. Raises ``LeaseLostError`` if the
        fence no longer holds (heartbeats extend leases, not checkpoints; on
        PostgreSQL the error may come when the transaction commits). Returns
        a function telling, once committed, whether the run's cancellation
        was requested."""
        ...

    def save_steps(self, steps: Sequence[StepRow], spans: Sequence[SpanRow]) -> None:
        """Upsert step memos and append spans (unfenced: operator actions)."""
        ...

    def reschedule(
        self,
        fence: Fence,
        status: str,
        available_at: float | None,
        attempt: int | None,
        now: float,
    ) -> bool:
        """Release the lease and park the run until ``available_at`` (``None``: until
        something wakes it) with the given status; if a wake-up was requested
        while the run was leased, it is due ``now`` instead. Records
        ``fence.token`` as the run's ``written_by``. Returns ``True`` when a
        cancel was requested while the run was leased: the run is then left
        due now, not parked, and the caller must end it cancelled in the same
        transaction (``lifecycle.park_run``)."""
        ...

    def finish_run(
        self,
        fence: Fence | None,
        run_id: str,
        status: str,
        output: str | None,
        error: str | None,
        now: float,
    ) -> bool:
        """End the run and drop its queue item; returns ``False`` if it had ended.
        Records ``fence.token`` as the run's ``written_by``."""
        ...

    def written_by(self, run_id: str) -> str | None:
        """The token of the fence whose park or end last wrote the run."""
        ...

    # --- operator actions ---------------------------------------------------------
    def requeue_run(self, run_id: str, now: float, reset_steps: Sequence[str] | None) -> None:
        """Put an ended run back in the queue (replay). ``reset_steps`` lists step
        ids to forget (failed ones, or every step from a rerun point)."""
        ...

    def queue_spec(self, run_id: str) -> QueueSpec | None:
        """Where the run was placed in the queue when it was created (partition,
        concurrency keys, throttle key); ``None`` if not recorded."""
        ...

    def lock_lease(self, run_id: str, now: float) -> bool:
        """Whether a worker holds a live lease on the run at ``now``, for a writer
        about to act on the answer: the queue item stays locked until the
        transaction ends, and one a lease pass holds is waited for, so the
        answer cannot change before the caller acts on it."""
        ...

    def flag_cancel(self, run_id: str, now: float, reason: str | None = None) -> bool:
        """If a worker holds a live lease on the run at ``now``, ask it to cancel
        the run at its next step boundary or park, for ``reason`` (an ErrorInfo
        as JSON; the first reason given stays), and return ``True``. Otherwise
        flag nothing and return ``False``: the caller ends the run itself."""
        ...

    def cancel_reason(self, run_id: str) -> str | None:
        """The reason a pending cancel was flagged with (JSON), if any."""
        ...

    # --- waits (events, cancellations, invoked children) ----------------------------------
    def insert_wait(self, wait: WaitRow) -> None:
        """Start waiting; events received after this commit can resolve it. A
        step has at most one wait: if it has one already (a repeated commit),
        nothing changes."""
        ...

    def start_wait(self, wait: WaitRow) -> Callable[[], bool]:
        """A step starts waiting: insert its wait only while the step (already
        written in this transaction) is ``waiting`` and has no wait, so that a
        repeated commit inserts nothing, even after the wait was resolved. The
        returned function says whether it inserted (on PostgreSQL, reading it
        costs a round trip; not reading costs none)."""
        ...

    def set_wait_match(self, run_id: str, step_id: str, match_value: str) -> None:
        """Point a step's wait at another value (an invoke's actual child run)."""
        ...

    def wait_keys(self, event_name: str) -> list[str]:
        """The match keys in use by waits on ``event_name`` ('' for unindexed)."""
        ...

    def match_waits(self, event_name: str, match_key: str, match_value: str, now: float) -> list[WaitRow]:
        """Unexpired waits on ``event_name`` whose key equals ``match_value``."""
        ...

    def claim_wait(self, wait_id: int) -> bool:
        """Delete one wait; ``True`` only for the caller that deleted it."""
        ...

    def claim_step_waits(self, run_id: str, step_id: str) -> bool:
        """Delete a step's waits; ``True`` if any was still there (timeouts)."""
        ...

    def delete_run_waits(self, run_id: str) -> None: ...

    def child_waits(self, child_run_id: str) -> list[WaitRow]:
        """Parents' ``invoke`` waits on a child run."""
        ...

    def complete_waiting_step(
        self, run_id: str, step_id: str, status: str, output: str | None, error: str | None, now: float
    ) -> bool:
        """Resolve a ``waiting`` step memo; ``False`` if it was not waiting."""
        ...

    def wake_run(self, run_id: str, now: float) -> None:
        """Make a parked run due now. While an owner is recorded, even one whose
        lease lapsed, also ask that its park make the run due at once."""
        ...

    def get_step(self, run_id: str, step_id: str) -> StepRow | None: ...

    # --- cron and timeouts -----------------------------------------------------------------
    def ensure_cron(self, function_id: str, schedule: str, next_at: float) -> None:
        """Create the schedule's row if missing (keeps an existing ``next_at``)."""
        ...

    def due_crons(self, schedules: Sequence[tuple[str, str]], now: float) -> list[tuple[str, str, float]]:
        """The rows of these ``(function id, schedule)`` pairs due by ``now``: other
        schedules of the same functions (another deploy's) are not this caller's."""
        ...

    def advance_cron(self, function_id: str, schedule: str, expected: float, next_at: float) -> bool:
        """Compare-and-set ``next_at``: ``True`` for the one caller that claims the tick."""
        ...

    def next_cron(self, schedules: Sequence[tuple[str, str]]) -> float | None:
        """The earliest ``next_at`` of these ``(function id, schedule)`` pairs."""
        ...

    def crons_of(self, function_ids: Sequence[str]) -> list[tuple[str, str, float]]:
        """Every schedule row of these functions: ``(function id, schedule, next_at)``."""
        ...

    def delete_stale_cron(self, function_id: str, schedule: str, before: float) -> bool:
        """Delete the schedule's row if its ``next_at`` is before ``before``."""
        ...

    def timed_out(self, now: float, limit: int = 100) -> list[TimedOut]:
        """Runs past their start or finish deadline."""
        ...

    def next_deadline(self) -> float | None: ...

    def clear_deadlines(self, run_id: str) -> None:
        """Forget a run's timeouts (it has been told to cancel)."""
        ...

    def release_key(self, key: str, ref: str) -> None:
        """Drop a claim if ``ref`` still holds it."""
        ...

    # --- workers ----------------------------------------------------------------------
    def upsert_worker(self, worker: WorkerRow) -> None: ...

    def remove_worker(self, worker_id: str) -> None: ...

    def list_workers(self, alive_since: float) -> list[WorkerRow]: ...

    # --- operator views (metrics) ------------------------------------------------------
    def run_backlog(self, now: float) -> list[BacklogRow]:
        """Per function: queue items due by ``now`` that no live lease holds."""
        ...

    def count_active_runs(self) -> list[RunCountRow]:
        """Runs not yet ended, counted per function and status."""
        ...

    # --- operator views (dashboard) -------------------------------------------------------
    def count_runs(
        self, function_id: str | None, since: float | None, until: float | None
    ) -> list[RunCountRow]:
        """Runs created in [since, until) (of one function, or all), per function
        and status."""
        ...

    def key_backlog(self, now: float, limit: int) -> list[KeyBacklogRow]:
        """Queue items per function and concurrency key values, largest first
        within each function."""
        ...

    def run_timeline(
        self, function_id: str | None, origin: int, until: float, width: int
    ) -> list[TimelineRow]:
        """Runs created in [origin, until), grouped by status and by bucket
        ``(created_at - origin) // width`` (whole seconds; a run's creation time is
        rounded to a whole second first, up or down depending on the database)."""
        ...

    def list_events(
        self, name: str | None, event_id: str | None, before_seq: int | None, limit: int
    ) -> list[EventRow]:
        """The event log, newest first; ``before_seq`` continues a previous page."""
        ...

    def event_runs(self, seqs: Sequence[int]) -> list[EventRunRow]:
        """The runs linked to the given events."""
        ...

    # --- background jobs ----------------------------------------------------------------
    def create_job(self, job: JobRow) -> None: ...

    def get_job(self, job_id: str) -> JobRow | None: ...

    def list_jobs(self, limit: int) -> list[JobRow]:
        """Newest first."""
        ...

    def update_job(
        self,
        job_id: str,
        *,
        status: str,
        done: int,
        examined: int,
        error: str | None,
        now: float,
        finished_at: float | None,
    ) -> bool:
        """Record progress (and refresh the heartbeat) of an active job; returns
        ``False`` if the job is no longer active."""
        ...

    def interrupt_stale_jobs(self, stale_before: float, now: float, reason: str) -> int:
        """Mark active jobs not refreshed since ``stale_before`` as ``interrupted``."""
        ...

    # --- transactional steps (issue 15) --------------------------------------------------
    def user_sql(self, fn: Callable[[Any], T], seconds: float) -> T:
        """``fn(connection)`` in a savepoint of this transaction, bounded to
        ``seconds`` (``store/usertx.py``): if it raises or runs too long, its
        writes are rolled back and the error is raised; else they commit with
        the transaction."""
        ...

    # --- database size and retention (issue 17) -------------------------------------------
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
        their steps, spans, event links, waits and queue rows."""
        ...

    def prune_events(self, cutoff: float, limit: int) -> int:
        """Delete up to ``limit`` events received before ``cutoff`` that no run links to."""
        ...

    def prune_dedupe(self, now: float, limit: int) -> int:
        """Delete up to ``limit`` dedupe keys expired at ``now``."""
        ...

    def prune_gcra(self, before: float, limit: int) -> int:
        """Delete up to ``limit`` GCRA cells idle since ``before`` (their arrival
        time is past: a missing cell acts the same)."""
        ...

    def prune_wait_keys(self, limit: int) -> int:
        """Delete up to ``limit`` wait keys no wait uses any more."""
        ...


class Store(Protocol):
    """A database: runs operations in transactions."""

    dialect: str

    async def transact(self, op: Callable[[Tx], T]) -> T:
        """Run ``op`` in a (possibly shared) write transaction on the current loop."""
        ...

    def submit(self, op: Callable[[Tx], T]) -> asyncio.Future[T]:
        """Like ``transact`` but returns the future at once (call on the loop)."""
        ...

    def transact_sync(self, op: Callable[[Tx], T]) -> T:
        """Run ``op`` in its own write transaction, from any thread."""
        ...

    async def read(self, op: Callable[[Tx], T]) -> T:
        """Run a read-only ``op``."""
        ...

    def read_sync(self, op: Callable[[Tx], T]) -> T: ...

    def migrate(self) -> list[str]:
        """Apply pending migrations; returns the names applied."""
        ...

    def change_token(self) -> Any:
        """A cheap value that changes when another connection commits (for idle polling)."""
        ...

    def subscribe(self, callback: Callable[[], Any]) -> Callable[[], None]:
        """Call ``callback`` (from any thread) when another connection may have
        made work available; returns a function that unsubscribes. PostgreSQL
        pushes these (LISTEN/NOTIFY); SQLite never calls back: its workers poll
        ``change_token`` while idle."""
        ...

    def close(self) -> None: ...
