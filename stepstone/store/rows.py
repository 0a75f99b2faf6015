"""What the store reads and writes: the domain's words (run, step and job
statuses, step and wait kinds, as ``StrEnum``s) and the rows that cross the
``Tx`` interface (frozen, keyword-only dataclasses, each read from a database
row by its ``from_row``; values are JSON text, times epoch seconds)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

Row = Mapping[str, Any]  # a database row by column name
T = TypeVar("T")

# The domain's words. Members are ``str``s: stored values, JSON and comparisons
# with plain strings are unchanged. queries.sql spells some of them as SQL
# literals; tests/unit/test_rows.py checks each is a member.


class RunStatus(StrEnum):
    """Where a run is (README "Runs"): active until it ends, then final."""

    QUEUED = "queued"  #: created, not started yet (or replayed)
    RUNNING = "running"  #: held by a worker, or due again after a retry back-off
    SLEEPING = "sleeping"  #: parked until a step.sleep wakes it
    WAITING = "waiting"  #: parked until an event or an invoked run wakes it
    PAUSED = "paused"  #: stopped before a step its history does not hold, until resumed
    COMPLETED = "completed"  #: the handler returned
    FAILED = "failed"  #: out of retries, or a step failed for good
    CANCELLED = "cancelled"  #: cancelled before it ended
    SKIPPED = "skipped"  #: never started: a rate limit or a singleton skipped it


ACTIVE_STATUSES = (
    RunStatus.QUEUED,
    RunStatus.RUNNING,
    RunStatus.SLEEPING,
    RunStatus.WAITING,
    RunStatus.PAUSED,  # live (it holds its singleton key), but holds no lease or slot
)
ENDED_STATUSES = (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.SKIPPED)
RUN_STATUSES = ACTIVE_STATUSES + ENDED_STATUSES


class StepStatus(StrEnum):
    """A step memo's latest state."""

    COMPLETED = "completed"  #: returned a value (a sleep: woke; a wait: got its event)
    FAILED = "failed"  #: failed for good: replays raise StepError again
    RETRYING = "retrying"  #: failed; runs again after its back-off (``wake_at``)
    SLEEPING = "sleeping"  #: a sleep until ``wake_at``
    WAITING = "waiting"  #: a wait for an event or for an invoked run


class StepKind(StrEnum):
    """What a step call was: a memo is only returned to a call of its own kind."""

    RUN = "run"  #: step.run
    SLEEP = "sleep"  #: step.sleep / sleep_until
    WAIT = "wait"  #: step.wait_for_event
    INVOKE = "invoke"  #: step.invoke
    SEND = "send"  #: step.send_event
    TRANSACTION = "transaction"  #: step.transaction
    SIGNAL = "signal"  #: step.wait_for_signal
    PATCH = "patch"  #: step.patched: a marker that the run reached this point under the change


class DivergenceReason(StrEnum):
    """Why a run's history no longer fits the code (``app.check``, ``ss.Divergence``)."""

    NEW_STEP = "new-step"  #: the replay stopped while recorded steps were never reached
    KIND_CHANGED = "kind-changed"  #: a recorded id is reached by a call of another kind or function
    ERROR = "error"  #: the handler raised outside any step on the recorded data


class WaitKind(StrEnum):
    """What a wait row waits for (``WaitRow.kind``)."""

    EVENT = "event"  #: step.wait_for_event
    CANCEL = "cancel"  #: a cancel_on event that cancels the run
    INVOKE = "invoke"  #: the end of a child run (step.invoke)
    SIGNAL = "signal"  #: a signal sent to the run (step.wait_for_signal; ``match_value``: its name)


def filled(cls: type[T], **fields: Any) -> T:
    """``cls(**fields)`` for a frozen dataclass given every one of its fields,
    without its ``__init__``, which sets each through ``object.__setattr__``
    (~1 µs a run's row or a step's more, paid for every row read back and
    every record ``runs.wait`` makes). Only for classes without
    ``__post_init__`` or slots; tests/unit/test_rows.py and
    test_engine_cost.py check that each user gives every field."""
    made = object.__new__(cls)
    made.__dict__.update(fields)
    return made


@dataclass(frozen=True, kw_only=True)
class NewEvent:
    """An event to append to the log (``RunsTx.insert_event``, ``record_event``):
    its data encoded as JSON, its timestamp in ms, when it arrived, and the
    sender's trace context (if any)."""

    id: str
    name: str
    data: str
    ts: int
    received_at: float
    trace: str | None = None

    def stored(self, seq: int) -> EventRow:
        """The event as the log holds it, at sequence number ``seq``."""
        return EventRow(
            seq=seq,
            id=self.id,
            name=self.name,
            data=self.data,
            ts=self.ts,
            received_at=self.received_at,
            trace=self.trace,
        )


@dataclass(frozen=True, kw_only=True)
class EventRow(NewEvent):
    """An event in the log: a ``NewEvent`` with its sequence number."""

    seq: int

    @classmethod
    def from_row(cls, row: Row) -> EventRow:
        return cls(
            seq=row["seq"],
            id=row["id"],
            name=row["name"],
            data=row["data"],
            ts=row["ts"],
            received_at=row["received_at"],
            trace=row["trace"],
        )


@dataclass(frozen=True, kw_only=True)
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
    status: RunStatus = RunStatus.QUEUED
    error: str | None = None
    parent_run_id: str | None = None
    parent_step_id: str | None = None
    idempotency_key: str | None = None
    start_deadline: float | None = None
    finish_timeout: float | None = None
    singleton_key: str | None = None
    meta: str | None = None
    spec: QueueSpec | None = None

    @property
    def queue_spec(self) -> QueueSpec:
        """Where it queues (without a spec: its partition, no keys)."""
        return self.spec or QueueSpec(partition_key=self.partition or self.function_id)


@dataclass(frozen=True, kw_only=True)
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


@dataclass(frozen=True, kw_only=True)
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

    @classmethod
    def from_row(cls, row: Row) -> QueueItem:
        return cls(
            run_id=row["run_id"],
            function_id=row["function_id"],
            ckey1=row["ckey1"],
            limit1=row["limit1"],
            ckey2=row["ckey2"],
            limit2=row["limit2"],
            throttle_key=row["throttle_key"],
            fresh=bool(row["fresh"]),
        )


@dataclass(frozen=True, kw_only=True)
class StepRow:
    """One step's memo: its latest state, not its history (see ``SpanRow``).

    ``position`` is the order the run first reached its steps; ``fingerprint``
    names what the call did (the function a ``step.run`` called, the event a
    wait waited for, the function invoked), so a replay can tell when an id
    now points at a different call."""

    run_id: str
    step_id: str
    position: int
    kind: StepKind
    status: StepStatus
    attempts: int = 0
    output: str | None = None
    error: str | None = None
    wake_at: float | None = None
    started_at: float | None = None
    ended_at: float | None = None
    fingerprint: str | None = None

    def without_output(self) -> StepRow:
        """This memo without its output: what a replay keeps once the value is
        handed to the handler. (Copied field by field: ``dataclasses.replace``
        would cost a step checkpoint ~4 us more.)"""
        copy = object.__new__(StepRow)
        fields = copy.__dict__
        fields.update(self.__dict__)
        fields["output"] = None
        return copy

    @classmethod
    def from_row(cls, row: Row) -> StepRow:
        return filled(
            cls,
            run_id=row["run_id"],
            step_id=row["step_id"],
            position=row["position"],
            kind=StepKind(row["kind"]),
            status=StepStatus(row["status"]),
            attempts=row["attempts"],
            output=row["output"],
            error=row["error"],
            wake_at=row["wake_at"],
            started_at=row["started_at"],
            ended_at=row["ended_at"],
            fingerprint=row["fingerprint"],
        )


@dataclass(frozen=True, kw_only=True)
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

    @classmethod
    def from_row(cls, row: Row) -> SpanRow:
        return cls(
            run_id=row["run_id"],
            kind=row["kind"],
            name=row["name"],
            started_at=row["started_at"],
            ended_at=row["ended_at"],
            status=row["status"],
            attempt=row["attempt"],
            error=row["error"],
            detail=row["detail"],
        )


@dataclass(frozen=True, kw_only=True)
class RunRow:
    id: str
    function_id: str
    status: RunStatus
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

    @classmethod
    def from_row(cls, row: Row) -> RunRow:
        return filled(
            cls,
            id=row["id"],
            function_id=row["function_id"],
            status=RunStatus(row["status"]),
            event_ids=json.loads(row["event_ids"]),
            output=row["output"],
            error=row["error"],
            created_at=row["created_at"],
            started_at=row["started_at"],
            ended_at=row["ended_at"],
            attempt=row["attempt"],
            app_version=row["app_version"],
            parent_run_id=row["parent_run_id"],
            parent_step_id=row["parent_step_id"],
            meta=row["meta"],
            singleton_key=row["singleton_key"],
        )

    def ended(self, status: RunStatus, output: str | None, error: str | None, now: float) -> RunRow:
        """This row as ``finish_run`` leaves it (the end of a run it still
        described: nothing else written to it since)."""
        ended = {"status": status, "output": output, "error": error, "ended_at": now}
        return filled(RunRow, **{**self.__dict__, **ended, "event_ids": list(self.event_ids)})


@dataclass(frozen=True, kw_only=True)
class LeaseTerms:
    """The lease a take grants (``QueueTx.take``, ``take_many``,
    ``take_in_order``): held by ``owner`` from ``now`` until ``until``, its run
    marked as running ``app_version`` of the code (when given)."""

    owner: str
    now: float
    until: float
    app_version: str | None = None


@dataclass(frozen=True, kw_only=True)
class LeasedRun:
    """What a worker needs to run an invocation, read in the leasing transaction.

    ``steps`` is the run's step index: its memos *without their outputs*
    (``output`` is ``None``), and ``output_bytes`` each output's stored size; a
    replay reads an output when it reaches its step (``runstate.StoreMemos``)."""

    run: RunRow
    epoch: int
    events: list[EventRow]
    steps: list[StepRow]
    cancel_requested: bool = False
    start_deadline: float | None = None
    output_bytes: dict[str, int] = field(default_factory=dict)


FIRST_EPOCH = 1  # a new run's first lease (runs.epoch's default 0, and item_taken's one more)
Recorded = tuple[int | None, bool, LeasedRun | None]  # a send's event and run (``record_event_starting``)


@dataclass(frozen=True, kw_only=True)
class RunHistory:
    """What a replay needs of one run without leasing it (``app.check``)."""

    run: RunRow
    events: list[EventRow]
    steps: list[StepRow]


@dataclass(frozen=True, kw_only=True)
class WaitRow:
    """A run waiting for an event (``kind`` 'event'), for a cancelling event
    ('cancel') or for a child run ('invoke', ``match_value`` = the child's id).
    Indexed waits are found by ``match_key`` (the shape and the incoming
    event's field, ``runtime.waits``) and ``match_value`` (an index value;
    ``also_match``: more of them, each stored as a row of its own) or
    ``match_number`` (a range); the condition still decides. Others have
    ``match_key`` '' and are tested by expression."""

    run_id: str
    step_id: str
    kind: WaitKind
    event_name: str
    match_key: str = ""
    match_value: str = ""
    expression: str | None = None
    event_json: str | None = None
    created_at: float = 0.0
    expires_at: float | None = None
    id: int | None = None
    also_match: tuple[str, ...] = ()  # written as rows of parts 1.., never read back
    match_number: float | None = None

    @classmethod
    def from_row(cls, row: Row) -> WaitRow:
        return cls(
            run_id=row["run_id"],
            step_id=row["step_id"],
            kind=WaitKind(row["kind"]),
            event_name=row["event_name"],
            match_key=row["match_key"],
            match_value=row["match_value"],
            expression=row["expression"],
            event_json=row["event_json"],
            created_at=row["created_at"],
            expires_at=row["expires_at"],
            id=row["id"],
            match_number=row["match_number"],
        )


@dataclass(frozen=True, kw_only=True)
class SignalRow:
    """A signal sent to a run (``app.runs.signal``): buffered until a
    ``wait_for_signal`` step of the run with its name consumes it, oldest first
    (``seq``: the order sent). ``consumed_by`` names that step."""

    id: str
    run_id: str
    name: str
    data: str  # JSON
    sent_at: float
    consumed_by: str | None = None
    consumed_at: float | None = None
    seq: int | None = None

    @classmethod
    def from_row(cls, row: Row) -> SignalRow:
        return cls(
            id=row["id"],
            run_id=row["run_id"],
            name=row["name"],
            data=row["data"],
            sent_at=row["sent_at"],
            consumed_by=row["consumed_by"],
            consumed_at=row["consumed_at"],
            seq=row["seq"],
        )


@dataclass(frozen=True, kw_only=True)
class TimedOut:
    run_id: str
    function_id: str
    leased: bool
    kind: str  # 'start' or 'finish'


CancelFlag = Callable[[], bool]  # read after the commit: was the run's cancellation requested?


@dataclass(frozen=True, kw_only=True)
class Fence:
    """Proof of ownership: a write commits only while (owner, epoch) hold the run.

    ``token`` names the invocation: its park or end records it on the run
    (``runs.written_by``), so a retry after an ambiguous commit can tell that
    its first attempt committed."""

    run_id: str
    owner: str
    epoch: int
    token: str | None = None


@dataclass(frozen=True, kw_only=True)
class RunEnd:
    """A run's end as ``JournalTx.finish_run`` and ``close_run`` write it: under
    ``fence`` (``None``: an operator's or the runtime's end, unfenced), its
    final status, output or error (JSON) and time."""

    fence: Fence | None
    run_id: str
    status: RunStatus
    output: str | None = None
    error: str | None = None
    now: float
    function_id: str = ""  # the run's: a pipelined store guesses by it what the end resolves


@dataclass(frozen=True, kw_only=True)
class RunClosed:
    """What a run's end (``JournalTx.close_run``) must still resolve."""

    invoked: bool  # a parent's ``step.invoke`` waits on the run (read them: ``child_waits``)
    waited: bool  # a wait listens for the event named ``waited_event``


@dataclass(frozen=True, kw_only=True)
class RunFilter:
    function_id: str | None = None
    statuses: tuple[str, ...] = ()
    event_id: str | None = None
    since: float | None = None
    until: float | None = None
    limit: int = 100
    before_id: str | None = None
    app_version: str | None = None  #: the version of the app that last ran it


# A run and, once it has ended, its steps (``RunsTx.ended_run``: what ``runs.wait`` reads).
RunRead = tuple[RunRow | None, list[StepRow] | None]
