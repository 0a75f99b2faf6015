"""A run's mailbox: signals sent to one run (``app.runs.signal``), received by
its ``step.wait_for_signal`` steps. Both sides are store operations written
here, once.

A signal is never lost and never received twice. Each one is a row of
``signals``, consumed exactly once, oldest first: either the send finds a
parked wait for its name and delivers to it (claims the wait, completes the
step's memo, wakes the run) in the send's own transaction, or it stays
buffered and the wait takes it (``take_signal``) in the transaction that
commits the wait's memo. A send and a wait commit of the same run are
ordered by the run's queue row, which both lock (the send with
``lock_lease``, the wait's commit with its fence), so whichever transaction
comes second sees the other's row and does the delivery: a signal arriving
while the run is between "check the buffer" and "park" is delivered by
whichever commits last. On SQLite writers are serial anyway.

Replays keep a run's mailbox (same run: unconsumed signals stay buffered, a
consumed one stays with the memo of the step that received it); a re-run from
a step is a new run with an empty mailbox.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from stepstone import limits, serde
from stepstone.errors import ConfigError, InvalidStateError, NotFoundError
from stepstone.events import nesting_depth
from stepstone.store.base import Tx
from stepstone.store.rows import ENDED_STATUSES, SignalRow, SpanRow, StepStatus, WaitKind, WaitRow

TRACE_KIND = "signal"  # the kind of a signal's entries in a run's trace


def encode(name: str, data: Any) -> str:
    """Validate a signal before anything is written; returns its data as JSON.
    Bounded like an event's data (size, nesting)."""
    if not isinstance(name, str) or not name.strip():
        raise ConfigError("name", "a signal name must be a non-empty string")
    if len(name) > limits.MAX_EVENT_NAME_CHARS:
        raise ConfigError("name", f"longer than {limits.MAX_EVENT_NAME_CHARS} characters")
    if nesting_depth(data, limits.MAX_EVENT_DEPTH) > limits.MAX_EVENT_DEPTH:
        raise ConfigError("data", f"nested more than {limits.MAX_EVENT_DEPTH} levels deep")
    return serde.dumps(data, what=f"signal {name!r} data", limit=limits.MAX_EVENT_BYTES)


def send(tx: Tx, signal: SignalRow) -> str:
    """Send ``signal`` (``consumed_by`` unset) to its run: deliver it to the
    oldest parked wait for its name, or buffer it. ``NotFoundError`` for an
    unknown run, ``InvalidStateError`` for one that ended."""
    run_id, now = signal.run_id, signal.sent_at
    tx.lock_lease(run_id, now)  # orders this send with the run's wait commits (see above)
    run = tx.get_run(run_id)
    if run is None:
        raise NotFoundError(f"no run {run_id!r}")
    if run.status in ENDED_STATUSES:
        raise InvalidStateError(f"run {run_id} is {run.status}; only an active run can be signalled")
    receiver = _deliver(tx, signal)
    consumed_at = None if receiver is None else now
    tx.insert_signal(dataclasses.replace(signal, consumed_by=receiver, consumed_at=consumed_at))
    spans = [_span(signal, "sent", now, None)]
    if receiver is not None:
        spans.append(_span(signal, "consumed", now, receiver))
        tx.wake_run(run_id, now)
    tx.save_steps([], spans)
    return signal.id


def _deliver(tx: Tx, signal: SignalRow) -> str | None:
    """Claim the oldest parked wait for the signal and complete its step with the
    signal's data; returns that step's id. Deleting the wait decides any race
    with its timeout."""
    for wait in tx.signal_waits(signal.run_id, signal.name, signal.sent_at):
        if wait.id is None or not tx.claim_wait(wait.id):
            continue
        if tx.complete_waiting_step(
            signal.run_id, wait.step_id, StepStatus.COMPLETED, signal.data, None, signal.sent_at
        ):
            return wait.step_id
    return None


def receive(tx: Tx, wait: WaitRow) -> str | None:
    """Inside the transaction that writes a ``wait_for_signal`` step's memo (as
    ``waiting``): consume the oldest buffered signal of its name, completing the
    step; otherwise park on ``wait``. Returns the step's output (the signal's
    data as JSON) once completed, ``None`` while it waits. Safe to repeat: a
    repeated commit consumes nothing more and reads what the first one left."""
    run_id, step_id, now = wait.run_id, wait.step_id, wait.created_at
    taken = tx.take_signal(run_id, wait.match_value, step_id, now)
    if taken is not None:
        tx.complete_waiting_step(run_id, step_id, StepStatus.COMPLETED, taken.data, None, now)
        tx.save_steps([], [_span(taken, "consumed", now, step_id)])
        return taken.data
    if tx.start_wait(wait)():
        return None
    step = tx.get_step(run_id, step_id)  # a repeated commit: resolved meanwhile, or still waiting
    return None if step is None or step.status == StepStatus.WAITING else step.output


def wait_row(run_id: str, step_id: str, name: str, now: float, expires_at: float | None) -> WaitRow:
    """The wait of a ``wait_for_signal`` step (no event matches it: no event name)."""
    return WaitRow(
        run_id=run_id,
        step_id=step_id,
        kind=WaitKind.SIGNAL,
        event_name="",
        match_value=name,
        created_at=now,
        expires_at=expires_at,
    )


def _span(signal: SignalRow, status: str, now: float, step_id: str | None) -> SpanRow:
    detail = {"signal_id": signal.id, **({"step_id": step_id} if step_id else {})}
    return SpanRow(
        run_id=signal.run_id,
        kind=TRACE_KIND,
        name=signal.name,
        started_at=now,
        ended_at=now,
        status=status,
        detail=serde.dumps(detail, what="span detail"),
    )
