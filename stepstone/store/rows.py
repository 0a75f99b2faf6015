"""What the store reads and writes: run statuses and the rows that cross the
``Tx`` interface (plain frozen dataclasses; values are JSON text, times epoch
seconds)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

# The domain's words. Members are ``str``s: stored values, JSON and comparisons
# with plain strings are unchanged. queries.sql spells some of them as SQL
# literals; tests/unit/test_rows.py checks each is a member.


class RunStatus(StrEnum):
    """Where a run is (DESIGN §1): active until it ends, then final."""

    QUEUED = "queued"  #: created, not started yet (or replayed)
    RUNNING = "running"  #: held by a worker, or due again after a retry back-off
    SLEEPING = "sleeping"  #: parked until a step.sleep wakes it
    WAITING = "waiting"  #: parked until an event or an invoked run wakes it
    COMPLETED = "completed"  #: the handler returned
    FAILED = "failed"  #: out of retries, or a step failed for good
    CANCELLED = "cancelled"  #: cancelled before it ended
    SKIPPED = "skipped"  #: never started: a rate limit or a singleton skipped it


ACTIVE_STATUSES = (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.SLEEPING, RunStatus.WAITING)
ENDED_STATUSES = (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.SKIPPED)
RUN_STATUSES = ACTIVE_STATUSES + ENDED_STATUSES


class StepStatus(StrEnum):
    """A step memo's latest state."""

    COMPLETED = "completed"  #: returned a value (a sleep: woke; a wait: got its event)
    FAILED = "failed"  #: failed for good: replays raise StepError again
    RETRYING = "retrying"  #: failed; runs again after its back-off (``wake_at``)
    SLEEPING = "sleeping"  #: a sleep until ``wake_at``
    WAITING = "waiting"  #: a wait for an event or for an invoked run


class WaitKind(StrEnum):
    """What a wait row waits for (``WaitRow.kind``)."""

    EVENT = "event"  #: step.wait_for_event
    CANCEL = "cancel"  #: a cancel_on event that cancels the run
    INVOKE = "invoke"  #: the end of a child run (step.invoke)


@dataclass(frozen=True)
class EventRow:
    seq: int
    id: str
    name: str
    data: str
    ts: int
    received_at: float
    trace: str | None = None


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
    status: str = RunStatus.QUEUED
    error: str | None = None
    parent_run_id: str | None = None
    parent_step_id: str | None = None
    idempotency_key: str | None = None
    start_deadline: float | None = None
    finish_timeout: float | None = None
    singleton_key: str | None = None
    meta: str | None = None
    spec: QueueSpec | None = None


@dataclass(frozen=True)
class QueueSpec:
    """Where a run queues: its partition (function + first concurrency key), its
    concurrency keys with their limits, and its throttle key."""

    partition_key: str
    ckey1: str | None = None
    limit1: int | None = None
    ckey2: str | None = None
    limit2: int | None = None
    throttle_key: str | None = None

    @property
    def partition_ckey(self) -> str | None:
        return self.ckey1


@dataclass(frozen=True)
class QueueItem:
    """A due queue item as leasing sees it."""

    run_id: str
    function_id: str
    ckey1: str | None
    limit1: int | None
    ckey2: str | None
    limit2: int | None
    throttle_key: str | None
    fresh: bool


class StepKind(StrEnum):
    """What a step call was: a memo is only returned to a call of its own kind."""

    RUN = "run"  #: step.run
    SLEEP = "sleep"  #: step.sleep / sleep_until
    WAIT = "wait"  #: step.wait_for_event
    INVOKE = "invoke"  #: step.invoke
    SEND = "send"  #: step.send_event


@dataclass
class StepRow:
    """One step's memo: its latest state, not its history (see ``SpanRow``).

    ``position`` is the order the run first reached its steps; ``fingerprint``
    names what the call did (the function a ``step.run`` called, the event a
    wait waited for, the function invoked), so a replay can tell when an id
    now points at a different call."""

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
    fingerprint: str | None = None


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
    singleton_key: str | None = None


@dataclass
class LeasedRun:
    """What a worker needs to run an invocation, read in the leasing transaction."""

    run: RunRow
    epoch: int
    events: list[EventRow]
    steps: list[StepRow]
    cancel_requested: bool = False
    start_deadline: float | None = None


@dataclass(frozen=True)
class WaitRow:
    """A run waiting for an event (``kind`` 'event'), for a cancelling event
    ('cancel') or for a child run ('invoke', ``match_value`` = the child's id).
    Indexed waits match ``async.data.<match_key>`` equal to ``match_value``
    (``waits.index_value``; the condition still decides); others have
    ``match_key`` '' and are tested by expression."""

    run_id: str
    step_id: str
    kind: str
    event_name: str
    match_key: str = ""
    match_value: str = ""
    expression: str | None = None
    event_json: str | None = None
    created_at: float = 0.0
    expires_at: float | None = None
    id: int | None = None


@dataclass(frozen=True)
class TimedOut:
    run_id: str
    function_id: str
    leased: bool
    kind: str  # 'start' or 'finish'


CancelFlag = Callable[[], bool]  # read after the commit: was the run's cancellation requested?


@dataclass(frozen=True)
class Fence:
    """Proof of ownership: a write commits only while (owner, epoch) hold the run.

    ``token`` names the invocation: its park or end records it on the run
    (``runs.written_by``), so a retry after an ambiguous commit can tell that
    its first attempt committed."""

    run_id: str
    owner: str
    epoch: int
    token: str | None = None


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


@dataclass(frozen=True)
class KeyBacklogRow:
    """Queue items of one function under one pair of concurrency key values
    (``None``: no such key): due now, held by a live lease, and in all (the rest
    are parked: sleeping, waiting, backing off or scheduled later)."""

    function_id: str
    ckey1: str | None
    ckey2: str | None
    limit1: int | None
    limit2: int | None
    due: int
    leased: int
    total: int


@dataclass(frozen=True)
class TimelineRow:
    """Runs created in one time bucket with one status: how many, how many have
    started, and their queue delays (first start minus creation) in seconds."""

    bucket: int
    status: str
    count: int
    started: int
    delay_sum: float
    delay_max: float | None


@dataclass(frozen=True)
class EventRunRow:
    """A run an event started (or joined, for batches and debounces)."""

    event_seq: int
    run_id: str
    function_id: str
    status: str


class JobStatus(StrEnum):
    """Where a background operator job is: active while queued or running."""

    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    INTERRUPTED = "interrupted"  #: its server stopped (or died) before it finished


JOB_ACTIVE_STATUSES = (JobStatus.QUEUED, JobStatus.RUNNING)
JOB_STATUSES = tuple(JobStatus)


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
