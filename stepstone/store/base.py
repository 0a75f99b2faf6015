"""The narrow, domain-level storage interface.

A ``Store`` runs *operations*: plain functions ``op(tx) -> T`` that call the
domain methods of a ``Tx`` inside one transaction. ``await store.transact(op)``
may share its transaction with other operations submitted at the same moment
(group commit); each caller still waits for its own commit, and an operation
that raises is rolled back alone. ``transact_sync`` runs one operation in its
own transaction from any thread.

Serialisation lives above this layer: values arrive and leave as JSON text.
All times are epoch seconds supplied by the caller (never the database clock),
so the testing harness can run on a virtual clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

T = TypeVar("T")
Op = Callable[["Tx"], T]

# Run statuses (DESIGN §1).
QUEUED, RUNNING, SLEEPING, WAITING = "queued", "running", "sleeping", "waiting"
COMPLETED, FAILED, CANCELLED, SKIPPED = "completed", "failed", "cancelled", "skipped"
ACTIVE_STATUSES = (QUEUED, RUNNING, SLEEPING, WAITING)
ENDED_STATUSES = (COMPLETED, FAILED, CANCELLED, SKIPPED)
RUN_STATUSES = ACTIVE_STATUSES + ENDED_STATUSES


@dataclass(frozen=True)
class EventRow:
    seq: int
    id: str
    name: str
    data: str
    ts: int
    received_at: float


@dataclass(frozen=True)
class NewRun:
    """A run to create with its queue item."""

    id: str
    function_id: str
    event_seqs: Sequence[int]
    event_ids: Sequence[str]
    available_at: float
    created_at: float
    partition: str = ""
    sort_at: float | None = None
    status: str = QUEUED
    error: str | None = None
    parent_run_id: str | None = None
    parent_step_id: str | None = None
    idempotency_key: str | None = None
    start_deadline: float | None = None
    meta: str | None = None


@dataclass
class StepRow:
    """One step's memo: its latest state, not its history (see ``SpanRow``)."""

    run_id: str
    step_id: str
    position: int
    kind: str
    status: str
    attempts: int = 0
    output: str | None = None
    error: str | None = None
    wake_at: float | None = None
    started_at: float | None = None
    ended_at: float | None = None


@dataclass(frozen=True)
class SpanRow:
    """One entry of a run's trace: a step attempt, a sleep, a wait, a warning."""

    run_id: str
    kind: str
    name: str
    started_at: float
    ended_at: float | None
    status: str
    attempt: int = 0
    error: str | None = None
    detail: str | None = None


@dataclass
class RunRow:
    id: str
    function_id: str
    status: str
    event_ids: list[str]
    output: str | None
    error: str | None
    created_at: float
    started_at: float | None
    ended_at: float | None
    attempt: int
    app_version: str | None
    parent_run_id: str | None
    parent_step_id: str | None
    meta: str | None = None


@dataclass
class LeasedRun:
    """What a worker needs to run an invocation, read in the leasing transaction."""

    run: RunRow
    epoch: int
    events: list[EventRow]
    steps: list[StepRow]
    cancel_requested: bool = False


@dataclass(frozen=True)
class Fence:
    """Proof of ownership: a write commits only while (owner, epoch) hold the run."""

    run_id: str
    owner: str
    epoch: int


@dataclass(frozen=True)
class RunFilter:
    function_id: str | None = None
    statuses: tuple[str, ...] = ()
    event_id: str | None = None
    since: float | None = None
    until: float | None = None
    limit: int = 100
    before_id: str | None = None


@dataclass(frozen=True)
class WorkerRow:
    id: str
    app: str
    app_version: str | None
    concurrency: int
    started_at: float
    heartbeat_at: float
    functions: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class BacklogRow:
    """Queue items of one function that are due and not leased."""

    function_id: str
    due: int
    oldest_due_at: float


@dataclass(frozen=True)
class RunCountRow:
    function_id: str
    status: str
    count: int


# Job statuses: a job is active while queued or running.
JOB_ACTIVE_STATUSES = ("queued", "running")
JOB_STATUSES = (*JOB_ACTIVE_STATUSES, "completed", "failed", "interrupted")


@dataclass(frozen=True)
class JobRow:
    """A background operator job (bulk cancel / replay); ``params`` is JSON."""

    id: str
    kind: str
    status: str
    params: str
    created_at: float
    updated_at: float
    done: int = 0
    examined: int = 0
    error: str | None = None
    owner: str | None = None
    finished_at: float | None = None


class Tx(Protocol):
    """Domain operations inside one transaction."""

    # --- functions registry ---------------------------------------------------
    def register_functions(self, app: str, configs: dict[str, str], now: float) -> None:
        """Upsert the JSON descriptions of ``app``'s functions by function id."""
        ...

    def load_functions(self) -> dict[str, tuple[str, str]]:
        """Every registered function: ``{id: (app, config_json)}``."""
        ...

    # --- dedupe keys ------------------------------------------------------------
    def claim_key(self, key: str, ref: str, expires_at: float, now: float) -> str | None:
        """Claim ``key`` until ``expires_at``. Returns ``None`` when claimed now,
        or the ``ref`` of the live claim that already holds it."""
        ...

    # --- events and runs ----------------------------------------------------------
    def insert_event(self, event_id: str, name: str, data: str, ts: int, now: float) -> int:
        """Append an event to the log; returns its sequence number."""
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
    def lease(
        self, owner: str, function_ids: Sequence[str], limit: int, now: float, until: float
    ) -> list[LeasedRun]:
        """Take up to ``limit`` due runs of ``function_ids`` until ``until``; each
        lease bumps the run's epoch so older owners are fenced out."""
        ...

    def next_due(self, function_ids: Sequence[str]) -> float | None:
        """When the earliest queued run of ``function_ids`` becomes due."""
        ...

    def extend_leases(self, owner: str, run_ids: Sequence[str], until: float) -> list[str]:
        """Push the leases this owner still holds; returns the run ids still held."""
        ...

    def release_leases(self, owner: str, now: float) -> int:
        """Give back every lease of ``owner`` so others may take the runs now."""
        ...

    # --- checkpoints (fenced) -----------------------------------------------------
    def checkpoint(self, fence: Fence, steps: Sequence[StepRow], spans: Sequence[SpanRow]) -> bool:
        """Save step memos and trace spans. Raises ``LeaseLostError`` if the
        fence no longer holds (heartbeats extend leases, not checkpoints).
        Returns whether a cancellation was requested for the run."""
        ...

    def save_steps(self, steps: Sequence[StepRow], spans: Sequence[SpanRow]) -> None:
        """Upsert step memos and append spans (unfenced: operator actions)."""
        ...

    def reschedule(
        self, fence: Fence, status: str, available_at: float | None, attempt: int | None
    ) -> None:
        """Release the lease and park the run until ``available_at`` (``None``: until
        something wakes it) with the given status."""
        ...

    def finish_run(
        self, fence: Fence | None, run_id: str, status: str, output: str | None,
        error: str | None, now: float,
    ) -> bool:
        """End the run and drop its queue item; returns ``False`` if it had ended."""
        ...

    # --- operator actions ---------------------------------------------------------
    def requeue_run(self, run_id: str, now: float, reset_steps: Sequence[str] | None) -> None:
        """Put an ended run back in the queue (replay). ``reset_steps`` lists step
        ids to forget (failed ones, or every step from a rerun point)."""
        ...

    def request_cancel(self, run_id: str, now: float) -> str:
        """Cancel a run: at once if no worker holds it, else flag it for the next
        checkpoint. Returns the resulting status."""
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

    # --- background jobs ----------------------------------------------------------------
    def create_job(self, job: JobRow) -> None: ...

    def get_job(self, job_id: str) -> JobRow | None: ...

    def list_jobs(self, limit: int) -> list[JobRow]:
        """Newest first."""
        ...

    def update_job(self, job_id: str, *, status: str, done: int, examined: int, error: str | None,
                   now: float, finished_at: float | None) -> bool:
        """Record progress (and refresh the heartbeat) of an active job; returns
        ``False`` if the job is no longer active."""
        ...

    def interrupt_stale_jobs(self, stale_before: float, now: float, reason: str) -> int:
        """Mark active jobs not refreshed since ``stale_before`` as ``interrupted``."""
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

    def close(self) -> None: ...


def make_store(url: str) -> Store:
    """Open the store for a ``sqlite:///path`` or ``postgresql://...`` URL."""
    if url.startswith("sqlite:"):
        from stepstone.store.sqlite import SqliteStore

        return SqliteStore.from_url(url)
    if url.startswith(("postgresql:", "postgres:")):
        from stepstone.store.postgres import PostgresStore  # type: ignore[import-not-found,unused-ignore]

        store: Store = PostgresStore.from_url(url)
        return store
    from stepstone.errors import ConfigError

    raise ConfigError("database_url", f"unsupported URL {url!r}; use sqlite:/// or postgresql://")

