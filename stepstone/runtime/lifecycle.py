"""How runs end: one place that finishes a run, cleans up what it held, resolves
a parent waiting on it (``step.invoke``) and records the system events; and how
a held run is cancelled or parked, so that a cancel asked for while a worker
holds the run is never lost: it is flagged for the holder (the queue item
locked first), and the holder's park honours it in its own transaction.

A system event embeds the run's first event (up to the event size limit
itself), its error (bounded by ``ErrorInfo``) and, for ``function.finished``,
its output (up to 4 MB): each is kept within the event size limit like any
other event (``fit_event_data``). They are ingested through ``publish``, which
the caller passes down (``runtime.ingestion.ingest``; ``stepstone.runtime``
binds it): ingesting may start runs, and starting one may end another.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from stepstone import limits, serde
from stepstone.errors import ErrorInfo
from stepstone.events import Event
from stepstone.registry import CANCELLED_EVENT, FAILED_EVENT, FINISHED_EVENT, Registry
from stepstone.runtime.incoming import PreparedEvent, prepare
from stepstone.store.base import Tx, WaitsTx
from stepstone.store.rows import ENDED_STATUSES, Fence, RunEnd, RunRow, RunStatus, StepStatus

# Ingest prepared events in the transaction: ``ingest(tx, events, matcher, now)``.
Publish = Callable[[Tx, Sequence[PreparedEvent], Registry, float], object]


def end_run(
    tx: Tx,
    run: RunRow,
    status: RunStatus,
    output: str | None,
    error: ErrorInfo | None,
    now: float,
    matcher: Registry,
    *,
    publish: Publish,
    fence: Fence | None = None,
    events: Sequence[Event] | None = None,
) -> bool:
    """End ``run`` with ``status``; ``False`` if it had already ended. A run
    cancelled without a reason gets the one its pending cancel flag carries."""
    if status == RunStatus.CANCELLED and error is None:
        flagged = tx.cancel_reason(run.id)
        error = None if flagged is None else ErrorInfo.from_json(serde.loads(flagged))
    error_json = stored_error(error)
    closed = tx.close_run(
        RunEnd(
            fence=fence,
            run_id=run.id,
            status=status,
            output=output,
            error=error_json,
            now=now,
            function_id=run.function_id,
        ),
        FINISHED_EVENT,
    )
    if closed is None:
        return False
    if run.singleton_key:
        tx.release_key(run.singleton_key, run.id)
    if closed.invoked:
        _resolve_parents(tx, run.id, status, output, error, now)
    if events is None:
        events = [Event(e.name, serde.loads(e.data), e.id, e.ts) for e in tx.get_events(run.id)]
    system = system_events(tx, matcher, run, status, output, error, events, finished_waited=closed.waited)
    if system:
        publish(tx, prepare(system, now, system=True), matcher, now)
    return True


def stored_error(error: ErrorInfo | None) -> str | None:
    """An ended run's error as its row holds it."""
    return None if error is None else serde.dumps(error.to_json(), what="error")


def cancel_run(
    tx: Tx, run_id: str, now: float, matcher: Registry, reason: ErrorInfo | None = None, *, publish: Publish
) -> str:
    """Cancel at once if no worker holds the run; otherwise flag it so the worker
    cancels it at its next step boundary or park. Returns the run's status."""
    run = tx.get_run(run_id)
    if run is None or run.status in ENDED_STATUSES:
        return run.status if run else ""
    reason_json = None if reason is None else serde.dumps(reason.to_json(), what="error")
    # lock_lease waits for a lease pass holding the item (an UPDATE alone would
    # judge the row by the version before that pass and skip it); flag_cancel
    # then flags only a live lease.
    if tx.lock_lease(run_id, now) and tx.flag_cancel(run_id, now, reason_json):
        return run.status
    end_run(tx, run, RunStatus.CANCELLED, None, reason, now, matcher, publish=publish)
    return RunStatus.CANCELLED


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
    *,
    publish: Publish,
) -> RunStatus:
    """Park the held ``run`` (sleep, wait, invoke, retry back-off) until ``wake_at``
    (or pause it: out of the queue until resumed),
    or, if its cancellation was requested while it was held, end it cancelled
    in this same transaction. Returns the status the run is left in."""
    if not tx.reschedule(fence, status, wake_at, attempt, now):
        if status == RunStatus.PAUSED:  # only an operator's resume queues it again
            tx.unqueue_run(run.id, now)
        return status
    end_run(tx, run, RunStatus.CANCELLED, None, None, now, matcher, publish=publish, events=events)
    return RunStatus.CANCELLED


def _resolve_parents(
    tx: WaitsTx, child_id: str, status: RunStatus, output: str | None, error: ErrorInfo | None, now: float
) -> None:
    for wait in tx.child_waits(child_id):
        if wait.id is None or not tx.claim_wait(wait.id):
            continue
        if status == RunStatus.COMPLETED:
            tx.complete_waiting_step(wait.run_id, wait.step_id, StepStatus.COMPLETED, output, None, now)
        else:
            info = error or ErrorInfo(
                "Cancelled" if status == RunStatus.CANCELLED else "Failed",
                f"invoked run {child_id} ended {status}",
            )
            failure = serde.dumps({"type": info.type, "message": info.message}, what="error")
            tx.complete_waiting_step(wait.run_id, wait.step_id, StepStatus.FAILED, None, failure, now)
        tx.wake_run(wait.run_id, now)


def system_events(
    tx: WaitsTx,
    matcher: Registry,
    run: RunRow,
    status: RunStatus,
    output: str | None,
    error: ErrorInfo | None,
    events: Sequence[Event],
    *,
    finished_waited: bool | None = None,
) -> list[Event]:
    """``stepstone/function.*`` events for a run that ended (see README).
    ``finished_waited``: whether a wait listens for ``function.finished``, if
    the caller knows (``close_run`` tells); else it is read."""

    def data(**fields: Any) -> dict[str, Any]:  # the run's event is read only for an event sent
        first = events[0].to_json() if events else None
        return fit_event_data({"function_id": run.function_id, "run_id": run.id, "event": first, **fields})

    err = None if error is None else {"type": error.type, "message": error.message}
    found: list[Event] = []
    if status == RunStatus.FAILED:
        found.append(Event(FAILED_EVENT, data(error=err)))
    elif status == RunStatus.CANCELLED:
        found.append(Event(CANCELLED_EVENT, data(error=err)))
    if status in (RunStatus.COMPLETED, RunStatus.FAILED) and (
        matcher.listens_to(FINISHED_EVENT)
        or (finished_waited if finished_waited is not None else bool(tx.wait_keys(FINISHED_EVENT)))
    ):
        result = {"result": serde.loads(output)} if status == RunStatus.COMPLETED else {"error": err}
        found.append(Event(FINISHED_EVENT, data(status=status, **result)))
    return found


def fit_event_data(data: dict[str, Any]) -> dict[str, Any]:
    """A system event's ``data`` within ``MAX_EVENT_BYTES``. While it is too
    large, the larger of the embedded event and ``result`` gives way first: the
    event to a reference (its ``name``, ``id``, ``ts``), ``result`` to ``None``;
    last, the reference to ``None``. What was cut is listed under ``truncated``
    (the run itself keeps all of it)."""
    if not _too_large(data):
        return data
    cuts: list[tuple[str, str, Any]] = []  # (name listed, key replaced, replacement)
    event = data.get("event")
    if isinstance(event, dict):
        cuts.append(("event.data", "event", {k: event.get(k) for k in ("name", "id", "ts")}))
    if data.get("result") is not None:
        cuts.append(("result", "result", None))
    cuts.sort(key=lambda cut: -_size(data[cut[1]]))
    if event is not None:
        cuts.append(("event", "event", None))
    truncated: list[str] = []
    for name, key, replacement in cuts:
        truncated.append(name)
        data = {**data, key: replacement, "truncated": list(truncated)}
        if not _too_large(data):
            break
    return data


def _size(value: Any) -> int:
    return len(serde.dumps(value, what="system event data").encode())


def _too_large(data: dict[str, Any]) -> bool:
    return _size(data) > limits.MAX_EVENT_BYTES
