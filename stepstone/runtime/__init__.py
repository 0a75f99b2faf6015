"""Inside one transaction: events in, runs admitted, runs ended.

The modules form a one-way order, each importing only those below it:

    ingestion   events -> runs: dedupe, resolve waits, start triggered runs
    admission   event -> run of one function: flow control, queue placement
    lifecycle   how runs end: finish, clean up, wake a parent; cancel, park
    waits       wait rows and event matching
    incoming    events validated and encoded before anything is written

The operations are recursive all the same: a run's end publishes system
events, ingesting an event starts runs, and starting a singleton run may cancel
(end) the run holding its key. So the way down is a parameter: lifecycle and
admission take ``publish`` (ingest prepared events in the transaction), and
ingestion passes itself. This package binds it once; callers outside use the
operations below.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from stepstone import limits
from stepstone.errors import ErrorInfo, LimitExceededError
from stepstone.events import Event
from stepstone.flow.singleton import claim_singleton
from stepstone.function import FunctionDef
from stepstone.registry import INVOKE_EVENT, Registry
from stepstone.runtime import admission, lifecycle
from stepstone.runtime.incoming import PreparedEvent, prepare
from stepstone.runtime.ingestion import Awaited, Sent, ingest
from stepstone.runtime.waits import Survey, Surveyed, survey
from stepstone.store.base import Tx
from stepstone.store.rows import Fence, NewRun, RunRow, RunStatus

__all__ = [
    "Awaited",
    "PreparedEvent",
    "Sent",
    "Survey",
    "Surveyed",
    "cancel_run",
    "claim_singleton",
    "end_run",
    "ingest",
    "park_run",
    "prepare",
    "prepare_invoke",
    "start_invoked",
    "start_run",
    "stored_error",
    "survey",
]


def start_run(
    tx: Tx,
    fn: FunctionDef,
    events: Sequence[tuple[int, PreparedEvent]],
    now: float,
    registry: Registry,
    *,
    parent: tuple[str, str] | None = None,
    available_at: float | None = None,
    run_id: str | None = None,
    queued: list[NewRun] | None = None,
) -> str | None:
    """``admission.start_run``, publishing through ``ingest``."""
    return admission.start_run(
        tx,
        fn,
        events,
        now,
        registry,
        publish=ingest,
        parent=parent,
        available_at=available_at,
        run_id=run_id,
        queued=queued,
    )


def prepare_invoke(data: dict[str, Any], now: float, what: str) -> PreparedEvent:
    """The ``stepstone/function.invoked`` event carrying ``data`` (raises
    ``LimitExceededError`` naming ``what`` when the data is too large)."""
    [event] = prepare(Event(INVOKE_EVENT, data), now, system=True)
    if len(event.data_json.encode()) > limits.MAX_EVENT_BYTES:
        raise LimitExceededError(f"{what}: invoke data over {limits.MAX_EVENT_BYTES} bytes")
    return event


def start_invoked(
    tx: Tx,
    fn: FunctionDef,
    event: PreparedEvent,
    now: float,
    registry: Registry,
    *,
    parent: tuple[str, str] | None = None,
    run_id: str | None = None,
) -> str | None:
    """Record the invoke ``event`` and start a run of ``fn`` (only ``fn``, whatever
    its triggers) with it: ``step.invoke``'s child, or a run invoked by an operator."""
    seq = tx.insert_event(event.received(now))
    return start_run(tx, fn, [(seq, event)], now, registry, parent=parent, run_id=run_id)


def end_run(
    tx: Tx,
    run: RunRow,
    status: RunStatus,
    output: str | None,
    error: ErrorInfo | None,
    now: float,
    matcher: Registry,
    *,
    fence: Fence | None = None,
    events: Sequence[Event] | None = None,
) -> bool:
    """``lifecycle.end_run``, publishing through ``ingest``."""
    return lifecycle.end_run(
        tx, run, status, output, error, now, matcher, publish=ingest, fence=fence, events=events
    )


stored_error = lifecycle.stored_error


def cancel_run(tx: Tx, run_id: str, now: float, matcher: Registry, reason: ErrorInfo | None = None) -> str:
    """``lifecycle.cancel_run``, publishing through ``ingest``."""
    return lifecycle.cancel_run(tx, run_id, now, matcher, reason, publish=ingest)


def park_run(
    tx: Tx,
    run: RunRow,
    fence: Fence,
    status: RunStatus,
    wake_at: float | None,
    attempt: int | None,
    now: float,
    matcher: Registry,
    events: list[Event] | None = None,
) -> RunStatus:
    """``lifecycle.park_run``, publishing through ``ingest``."""
    return lifecycle.park_run(tx, run, fence, status, wake_at, attempt, now, matcher, events, publish=ingest)
