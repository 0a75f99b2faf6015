"""From events to runs, inside one transaction.

``prepare`` validates and encodes events before anything is written (a bad
event in a list rejects the whole list: nothing is half-written). ``ingest``
then, in one transaction, dedupes each event by id (24 h), appends it to the
event log, resolves the waits it satisfies (``wait_for_event``, ``cancel_on``)
and starts a run of every function it triggers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from stepstone import limits, serde
from stepstone.errors import ErrorInfo
from stepstone.events import Event, InvalidEventError, encode_event_data, now_ms, validate_event
from stepstone.function import FunctionDef
from stepstone.ids import new_id
from stepstone.registry import Registry
from stepstone.store.base import COMPLETED, ENDED_STATUSES, SKIPPED, NewRun, Tx, WaitRow
from stepstone.waits import build_wait, canonical, match_event

FOREVER = 100 * 365 * 86400.0  # a claim held until released


@dataclass(frozen=True)
class PreparedEvent:
    id: str
    name: str
    data: dict[str, Any]
    data_json: str
    ts: int

    @property
    def variables(self) -> dict[str, Any]:
        return {"event": self.as_json()}

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "data": self.data, "id": self.id, "ts": self.ts}

    def to_event(self) -> Event:
        return Event(self.name, self.data, self.id, self.ts)


def prepare(events: Event | Sequence[Event], now: float, *, system: bool = False) -> list[PreparedEvent]:
    """Validate and encode; raises before any write if one event is bad."""
    items = [events] if isinstance(events, Event) else list(events)
    prepared = []
    for event in items:
        validate_event(event)
        if event.name.startswith("stepstone/") and not system:
            raise InvalidEventError(f"event names starting with 'stepstone/' are reserved: {event.name!r}")
        data_json = (serde.dumps(event.data, what=f"event {event.name!r} data") if system
                     else encode_event_data(event))
        prepared.append(PreparedEvent(
            id=event.id or new_id(now), name=event.name, data=event.data, data_json=data_json,
            ts=event.ts if event.ts is not None else now_ms(now),
        ))
    return prepared


def ingest(tx: Tx, events: Sequence[PreparedEvent], registry: Registry, now: float) -> list[str]:
    """Record ``events``, resolve the waits they satisfy and start the runs they
    trigger; returns their ids."""
    ids = []
    for event in events:
        ids.append(event.id)
        if tx.claim_key(f"event:{event.id}", event.id, now + limits.DEDUPE_WINDOW_SECONDS, now) is not None:
            continue  # the same id was seen in the last 24 h
        seq = tx.insert_event(event.id, event.name, event.data_json, event.ts, now)

        def resolve(wait: WaitRow, event: PreparedEvent = event) -> None:
            _resolve(tx, wait, event, registry, now)

        match_event(tx, event.name, event.data, event.variables, now, resolve)
        for fn in registry.match(event.name, event.variables):
            start_run(tx, fn, [(seq, event)], now, registry)
    return ids


def _resolve(tx: Tx, wait: WaitRow, event: PreparedEvent, registry: Registry, now: float) -> None:
    if wait.kind == "cancel":
        from stepstone.lifecycle import cancel_run

        cancel_run(tx, wait.run_id, now, registry,
                   ErrorInfo("Cancelled", f"cancelled by event {event.name!r} ({event.id})"))
        return
    output = serde.dumps(event.as_json(), what="event")
    if tx.complete_waiting_step(wait.run_id, wait.step_id, COMPLETED, output, None, now):
        tx.wake_run(wait.run_id, now)


def start_run(
    tx: Tx, fn: FunctionDef, events: Sequence[tuple[int, PreparedEvent]], now: float,
    registry: Registry, *, parent: tuple[str, str] | None = None,
    available_at: float | None = None,
) -> str | None:
    """Create a queued run of ``fn`` for ``events`` with its flow control applied;
    returns its id, or ``None`` when an idempotency key already started one."""
    run_id = new_id(now)
    flow = fn.flow
    variables = events[0][1].variables
    if flow.idempotency is not None:
        key = flow.idempotency.key(variables)
        if key is not None and tx.claim_key(
            f"idem:{fn.id}:{canonical(key)}", run_id, now + limits.DEDUPE_WINDOW_SECONDS, now
        ) is not None:
            return None
    singleton_key, skipped = _singleton(tx, fn, run_id, variables, now, registry)
    tx.create_run(NewRun(
        id=run_id,
        function_id=fn.id,
        event_seqs=[seq for seq, _ in events],
        event_ids=[event.id for _, event in events],
        available_at=now if available_at is None else available_at,
        created_at=now,
        status=SKIPPED if skipped else "queued",
        meta=serde.dumps({"skipped": skipped}, what="meta") if skipped else None,
        parent_run_id=parent[0] if parent else None,
        parent_step_id=parent[1] if parent else None,
        start_deadline=None if flow.start_timeout is None else now + flow.start_timeout,
        finish_timeout=flow.finish_timeout,
        singleton_key=singleton_key,
    ))
    if not skipped:
        for i, (cancel, _condition, timeout) in enumerate(flow.cancel_on):
            tx.insert_wait(build_wait(
                run_id=run_id, step_id=f"cancel_on[{i}]", kind="cancel", event_name=cancel.event,
                condition=cancel.if_, run_event=variables["event"], now=now,
                expires_at=None if timeout is None else now + timeout, field=f"cancel_on[{i}].if_",
            ))
    return run_id


def _singleton(tx: Tx, fn: FunctionDef, run_id: str, variables: dict[str, Any], now: float,
               registry: Registry) -> tuple[str | None, str | None]:
    """Claim the singleton key; returns ``(key, skip reason)``."""
    if fn.flow.singleton is None:
        return None, None
    config, expression = fn.flow.singleton
    value = expression.key(variables) if expression is not None else None
    key = f"singleton:{fn.id}:{canonical(value)}"
    holder = tx.claim_key(key, run_id, now + FOREVER, now)
    if holder:
        current = tx.get_run(holder)
        if current is not None and current.status not in ENDED_STATUSES:
            if config.mode == "skip":
                return None, f"singleton: run {holder} is active for this key"
            from stepstone.lifecycle import cancel_run

            cancel_run(tx, holder, now, registry,
                       ErrorInfo("Cancelled", f"replaced by run {run_id} (singleton)"))
        tx.release_key(key, holder)
        tx.claim_key(key, run_id, now + FOREVER, now)
    return key, None
