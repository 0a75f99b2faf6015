"""Admission: how an event becomes a run of one function, with its flow control.

In the ingesting transaction, the function's flow rules (``stepstone.flow``,
one module per option) are asked in their registry order whether the event
joins a pending run (debounce, batch), is a duplicate (idempotency) or makes a
``skipped`` run (rate limit, singleton); then they shape the new run (due time,
queue placement, priority, deadlines) and write what a live run needs beside
it (accumulators, cancel waits). This module only drives the hooks and supplies
what the rules reach above them: cancelling a run and building a wait.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from stepstone import serde
from stepstone.errors import ErrorInfo
from stepstone.expressions import Expression
from stepstone.flow.base import Dropped, Joined, Placement, Skipped, Verdict
from stepstone.function import FunctionDef
from stepstone.ids import new_id
from stepstone.registry import Registry
from stepstone.runtime.incoming import PreparedEvent
from stepstone.runtime.lifecycle import Publish, cancel_run
from stepstone.runtime.waits import build_wait, canonical
from stepstone.store.base import Tx
from stepstone.store.rows import NewRun, RunStatus, WaitKind


@dataclass(kw_only=True)
class _Admission:
    """``stepstone.flow.base.Admission`` for one call of :func:`start_run`."""

    tx: Tx
    fn: FunctionDef
    events: Sequence[tuple[int, PreparedEvent]]
    now: float
    run_id: str
    registry: Registry
    publish: Publish
    variables: dict[str, Any]  # what CEL keys see: the first event, built once

    @property
    def function_id(self) -> str:
        return self.fn.id

    @property
    def last_event(self) -> tuple[int, str]:
        seq, event = self.events[-1]
        return seq, event.id

    def key(self, expression: Expression | None) -> str:
        return canonical(expression.key(self.variables) if expression else None)

    def sort_at(self, due: float) -> float:
        return due - sum(rule.priority(self) for rule in self.fn.flow.rules)

    def cancel(self, run_id: str, message: str) -> None:
        reason = ErrorInfo("Cancelled", message)
        cancel_run(self.tx, run_id, self.now, self.registry, reason, publish=self.publish)

    def add_cancel_wait(
        self, *, step_id: str, event_name: str, condition: str | None, expires_at: float | None, field: str
    ) -> None:
        wait = build_wait(
            run_id=self.run_id,
            step_id=step_id,
            kind=WaitKind.CANCEL,
            event_name=event_name,
            condition=condition,
            run_event=self.variables["event"],
            now=self.now,
            expires_at=expires_at,
            field=field,
        )
        self.tx.insert_wait(wait)


def start_run(
    tx: Tx,
    fn: FunctionDef,
    events: Sequence[tuple[int, PreparedEvent]],
    now: float,
    registry: Registry,
    *,
    publish: Publish,
    parent: tuple[str, str] | None = None,
    available_at: float | None = None,
    run_id: str | None = None,
    queued: list[NewRun] | None = None,
) -> str | None:
    """Admit ``events`` to ``fn``; returns the run id (new, skipped, or the pending
    debounce/batch run they joined), or ``None`` if an idempotency key already
    started a run. A new run gets ``run_id`` if given (fixed by the caller
    before its transaction, so that a repeated commit names the same run).
    ``publish`` ingests the system events of a singleton holder it cancels.
    A new queued run is appended to ``queued`` (a send's direct start)."""
    adm = _Admission(
        tx=tx,
        fn=fn,
        events=events,
        now=now,
        run_id=run_id or new_id(now),
        registry=registry,
        publish=publish,
        variables=events[0][1].variables,
    )
    placement = Placement(due=now if available_at is None else available_at)
    verdict = _verdict(adm, placement)
    if isinstance(verdict, Joined):
        return verdict.run_id
    if isinstance(verdict, Dropped):
        return None
    if isinstance(verdict, Skipped):
        placement.skipped = verdict.reason
    for rule in fn.flow.rules:
        rule.place(adm, placement)
    seqs, event_ids = [seq for seq, _ in adm.events], [event.id for _, event in adm.events]
    sort_at = adm.sort_at(placement.due)
    new = _new_run(adm.run_id, fn.id, (seqs, event_ids), now, sort_at, placement, parent)
    tx.create_run(new)
    if placement.skipped is None:
        for rule in fn.flow.rules:
            rule.opened(adm)
        if queued is not None:
            queued.append(new)
    return adm.run_id


def plain_run(fn: FunctionDef, event: PreparedEvent, now: float) -> NewRun | None:
    """The run ``start_run`` creates for ``event`` alone when ``fn`` has no flow
    rules (else ``None``: its rules decide), before the event is recorded: its
    seq is not known yet (``event_seqs`` empty: ``Tx.record_event_starting``
    links it). Nothing is read or written."""
    if fn.flow.rules:
        return None
    return _new_run(new_id(now), fn.id, ((), [event.id]), now, now, Placement(due=now), None)


def _verdict(adm: _Admission, placement: Placement) -> Verdict | None:
    """The first rule's verdict on the event (``None``: a queued run)."""
    for rule in adm.fn.flow.rules:
        verdict = rule.admit(adm, placement)
        if verdict is not None:
            return verdict
    return None


def _new_run(
    run_id: str,
    function_id: str,
    events: tuple[Sequence[int], Sequence[str]],
    now: float,
    sort_at: float,
    placement: Placement,
    parent: tuple[str, str] | None,
) -> NewRun:
    skipped = placement.skipped
    return NewRun(
        id=run_id,
        function_id=function_id,
        event_seqs=events[0],
        event_ids=events[1],
        available_at=placement.due,
        sort_at=sort_at,
        created_at=now,
        status=RunStatus.SKIPPED if skipped else RunStatus.QUEUED,
        meta=serde.dumps({"skipped": skipped}, what="meta") if skipped else None,
        parent_run_id=parent[0] if parent else None,
        parent_step_id=parent[1] if parent else None,
        start_deadline=placement.start_deadline,
        finish_timeout=placement.finish_timeout,
        singleton_key=placement.singleton_key,
        spec=placement.queue_spec(function_id),
    )
