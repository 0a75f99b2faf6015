"""What an operator does to one run, as store operations: cancel it, replay
it from its last good step, resume it once paused, or re-run it from a step
as a new run. Each is an
``op(tx)`` built here; ``app.runs`` (runs.py) submits them, and its bulk actions
apply them page by page."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from stepstone import serde
from stepstone.errors import InvalidStateError, NotFoundError
from stepstone.events import Event, encode_event_data, now_ms, validate_event
from stepstone.ids import new_id
from stepstone.registry import Registry
from stepstone.runtime import cancel_run, claim_singleton
from stepstone.store.base import Tx
from stepstone.store.rows import EventRow, NewEvent, NewRun, RunRow, RunStatus, SpanRow, StepStatus


def cancel_op(run_id: str, now: float, matcher: Registry) -> Callable[[Tx], str]:
    def op(tx: Tx) -> str:
        if tx.get_run(run_id) is None:
            raise NotFoundError(f"no run {run_id!r}")
        return cancel_run(tx, run_id, now, matcher)

    return op


def replay_op(run_id: str, now: float) -> Callable[[Tx], None]:
    def op(tx: Tx) -> None:
        replayable = (RunStatus.FAILED, RunStatus.CANCELLED)
        run = _run_in(tx, run_id, replayable, "only failed or cancelled runs replay")
        _claim_singleton(tx, run, run_id, now, "replay")
        unfinished = [s for s in tx.get_steps(run_id) if s.status != StepStatus.COMPLETED]
        # The failed attempt's memo is about to go: keep it in the trace.
        kept = [
            SpanRow(
                run_id=run_id,
                kind="step",
                name=s.step_id,
                started_at=s.started_at,
                ended_at=s.ended_at,
                status=s.status,
                attempt=max(0, s.attempts - 1),
                error=s.error,
            )
            for s in unfinished
            if s.status == StepStatus.FAILED and s.started_at is not None
        ]
        tx.requeue_run(run_id, now, [s.step_id for s in unfinished])
        tx.save_steps(
            [],
            [*kept, _action_span(run_id, "replay", now, f"replayed from {run.status}")],
        )

    return op


def resume_op(run_id: str, now: float) -> Callable[[Tx], None]:
    """Queue a paused run again, with its history, for the code deployed now: it
    pauses again where that code still diverges."""

    def op(tx: Tx) -> None:
        _run_in(tx, run_id, (RunStatus.PAUSED,), "only paused runs resume")
        tx.requeue_run(run_id, now, None)
        tx.save_steps([], [_action_span(run_id, "resume", now, "resumed from paused")])

    return op


def _run_in(tx: Tx, run_id: str, statuses: tuple[RunStatus, ...], rule: str) -> RunRow:
    """The run an action applies to: ``NotFoundError`` if there is none,
    ``InvalidStateError`` (naming ``rule``) if its status is not one of ``statuses``.
    Its row is locked: a prune deleting it is waited for (the run is then gone),
    one coming later sees it live again (``delete_runs`` checks the status)."""
    run = tx.lock_run(run_id)
    if run is None:
        raise NotFoundError(f"no run {run_id!r}")
    if run.status not in statuses:
        raise InvalidStateError(f"run {run_id} is {run.status}; {rule}")
    return run


def _action_span(run_id: str, kind: str, now: float, detail: str) -> SpanRow:
    """An operator's action, as an instant in the run's trace."""
    return SpanRow(
        run_id=run_id, kind=kind, name=kind, started_at=now, ended_at=now, status="ok", detail=detail
    )


def _claim_singleton(tx: Tx, run: RunRow, claimant: str, now: float, action: str) -> None:
    """A replay or re-run makes a run active: it claims the singleton key of the
    run it starts from, and is refused while another active run holds it (whatever
    the function's mode: an operator's action never skips or cancels silently)."""
    if run.singleton_key is None:
        return
    holder = claim_singleton(tx, run.singleton_key, claimant, now)
    if holder is not None:
        raise InvalidStateError(
            f"cannot {action} run {run.id}: run {holder} is active for its singleton key "
            f"(cancel it or wait for it to end)"
        )


def rerun_op(
    run_id: str, step_id: str, now: float, event_data: dict[str, Any] | None = None
) -> Callable[[Tx], str]:
    """Fork ``run_id`` at ``step_id``. With ``event_data`` the new run's triggering
    event is a new event row (same name, a new id, that data); the original event
    stays as it was, linked to the original run."""

    def op(tx: Tx) -> str:
        run = tx.lock_run(run_id)  # a prune waits: the new run links the events it reads
        if run is None:
            raise NotFoundError(f"no run {run_id!r}")
        steps = tx.get_steps(run_id)
        by_id = {s.step_id: s for s in steps}
        if step_id not in by_id:
            raise NotFoundError(f"run {run_id} has no step {step_id!r}")
        cut = by_id[step_id].position
        new_run = new_id(now)
        _claim_singleton(tx, run, new_run, now, "re-run")
        events = tx.get_events(run_id)
        if event_data is not None:
            events = _edited_events(tx, run_id, events, event_data, now)
        tx.create_run(
            NewRun(
                id=new_run,
                function_id=run.function_id,
                event_seqs=[e.seq for e in events],
                event_ids=[e.id for e in events],
                available_at=now,
                created_at=now,
                meta=serde.dumps(_rerun_meta(run_id, step_id, event_data is not None), what="meta"),
                singleton_key=run.singleton_key,
                spec=tx.queue_spec(run_id),
            )
        )
        kept = [
            dataclasses.replace(s, run_id=new_run)
            for s in steps
            if s.position < cut and s.status == StepStatus.COMPLETED
        ]
        tx.save_steps(
            kept,
            [
                SpanRow(
                    run_id=new_run,
                    kind="rerun",
                    name=step_id,
                    started_at=now,
                    ended_at=now,
                    status="ok",
                    detail=f"forked from run {run_id} at step {step_id!r}",
                )
            ],
        )
        return new_run

    return op


def _rerun_meta(run_id: str, step_id: str, edited: bool) -> dict[str, Any]:
    meta: dict[str, Any] = {"rerun_of": run_id, "from_step": step_id}
    if edited:
        meta["edited_event"] = True
    return meta


def _edited_events(
    tx: Tx, run_id: str, events: list[EventRow], data: dict[str, Any], now: float
) -> list[EventRow]:
    """The run's events with the first (``ctx.event``) replaced by a new event
    row carrying ``data``. A batch run's events are refused: which one the edit
    meant is ambiguous."""
    if len(events) != 1:
        raise InvalidStateError(
            f"run {run_id} was started by {len(events)} events; "
            "only a single-event run reruns with edited data"
        )
    event_id, ts = new_id(now), now_ms(now)
    edited = Event(name=events[0].name, data=data, id=event_id, ts=ts)
    validate_event(edited)
    encoded = encode_event_data(edited)
    event = NewEvent(id=event_id, name=edited.name, data=encoded, ts=ts, received_at=now)
    return [event.stored(tx.insert_event(event))]
