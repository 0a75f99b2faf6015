"""The store operation of each orchestration effect (``wire.py``'s records).

One home for what a wait, an invoke, a sent event, a wait's timeout and a
taken signal write, used alike by a worker's executor (the interpreter hands
its records to ``ExecEnv.effect``) and by ``stepstone server`` committing the
answer of a function served over HTTP (``pusher.py``). Each operation runs
inside the transaction of its step's memo and is safe to repeat: a wait row is
unique per step, a child's run id and sent events' ids are fixed in the record.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stepstone import mailbox, serde
from stepstone.function import FunctionDef
from stepstone.registry import Registry
from stepstone.runtime import ingest, prepare, prepare_invoke, start_invoked
from stepstone.runtime.waits import begin_wait
from stepstone.store.base import Tx
from stepstone.store.rows import RunStatus, StepRow, StepStatus, WaitKind, WaitRow
from stepstone.wire import BeginWait, EffectRecord, ExpireWait, SendEvents, StartChild


class BoundEffect:
    """A record bound to its operation: called with a transaction, named for
    fault injection (``site``) as the record says."""

    __slots__ = ("op", "record")

    def __init__(self, record: EffectRecord, op: Callable[[Tx], Any]) -> None:
        self.record = record
        self.op = op

    @property
    def site(self) -> str:
        return self.record.site

    def __call__(self, tx: Tx) -> Any:
        return self.op(tx)


def prepared_send(events: list[Any], now: float) -> SendEvents:
    """Validate and encode sent events now (raises ``StepstoneError``), fixing their ids."""
    prepared = prepare(events, now)
    return SendEvents(events=tuple(p.to_event() for p in prepared), now=now, prepared=prepared)


def realize(
    record: EffectRecord, function: Callable[[str], FunctionDef | None], matcher: Callable[[], Registry]
) -> BoundEffect:
    """The operation of ``record``. Encoding happens now (an invoke's data over
    its limit raises ``LimitExceededError`` before anything is staged)."""
    if isinstance(record, BeginWait):
        return BoundEffect(record, lambda tx: begin_wait(tx, record.waits, record.since, record.now))
    if isinstance(record, SendEvents):
        return BoundEffect(record, _send(record, matcher()))
    if isinstance(record, StartChild):
        return BoundEffect(record, _start_child(record, function(record.function_id), matcher()))
    if isinstance(record, ExpireWait):
        return BoundEffect(record, lambda tx: expire_wait(tx, record))
    return BoundEffect(record, lambda tx: mailbox.receive(tx, record.wait))


def _send(record: SendEvents, matcher: Registry) -> Callable[[Tx], None]:
    prepared = record.prepared if record.prepared is not None else prepare(list(record.events), record.now)

    def ingest_sent(tx: Tx) -> None:  # ids fixed in the record: a repeated commit is deduplicated
        ingest(tx, prepared, matcher, record.now)

    return ingest_sent


def expire_wait(tx: Tx, record: ExpireWait) -> StepRow | None:
    """Deleting the wait decides the race: the event (or child) or the timeout."""
    run_id, step_id = record.run_id, record.step_id
    if tx.claim_step_waits(run_id, step_id):
        status = StepStatus.FAILED if record.failure else StepStatus.COMPLETED
        output = None if record.failure else "null"
        tx.complete_waiting_step(run_id, step_id, status, output, record.failure, record.now)
    return tx.get_step(run_id, step_id)


def _fail_waiting_step(tx: Tx, record: StartChild, kind: str, message: str) -> None:
    reason = serde.dumps({"type": kind, "message": message}, what="error")
    tx.claim_step_waits(record.run_id, record.step_id)
    tx.complete_waiting_step(record.run_id, record.step_id, StepStatus.FAILED, None, reason, record.now)
    tx.wake_run(record.run_id, record.now)


def _start_child(record: StartChild, target: FunctionDef | None, matcher: Registry) -> Callable[[Tx], None]:
    where = f"step {record.step_id!r}"
    event = None if target is None else prepare_invoke(record.data, record.now, where)
    parent = (record.run_id, record.step_id)

    def start_child(tx: Tx) -> None:
        # The wait comes first: a repeated commit of this step (an ambiguous
        # COMMIT retried) inserts none, and then starts nothing.
        wait = WaitRow(
            run_id=record.run_id,
            step_id=record.step_id,
            kind=WaitKind.INVOKE,
            event_name="",
            match_value=record.child_id,
            created_at=record.now,
            expires_at=record.expires_at,
        )
        if not tx.start_wait(wait)():
            return
        if target is None or event is None:  # served elsewhere and unknown to this catalog
            _fail_waiting_step(
                tx, record, "NonRetriableError", f"no function {record.function_id!r} to invoke"
            )
            return
        child = start_invoked(tx, target, event, record.now, matcher, parent=parent, run_id=record.child_id)
        if child is not None and child != record.child_id:  # joined a pending debounce or batch run
            tx.set_wait_match(record.run_id, record.step_id, child)
        child_run = tx.get_run(child) if child else None
        if child_run is None or child_run.status == RunStatus.SKIPPED:
            _fail_waiting_step(tx, record, "InvokeSkipped", "the invoked run was skipped")

    return start_child
