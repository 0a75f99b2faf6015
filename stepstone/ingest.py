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
from stepstone.ids import new_id
from stepstone.registry import Registry
from stepstone.scheduler.admission import start_run
from stepstone.store.base import Tx
from stepstone.store.rows import StepStatus, WaitKind, WaitRow
from stepstone.tracing import current_context
from stepstone.waits import match_event

__all__ = ["PreparedEvent", "ingest", "prepare", "start_run"]


@dataclass(frozen=True)
class PreparedEvent:
    id: str
    name: str
    data: dict[str, Any]
    data_json: str
    ts: int
    trace: str | None = None

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
    trace = None if system else current_context()
    prepared = []
    for event in items:
        validate_event(event, max_depth=None if system else limits.MAX_EVENT_DEPTH)
        if event.name.startswith("stepstone/") and not system:
            raise InvalidEventError(f"event names starting with 'stepstone/' are reserved: {event.name!r}")
        data_json = (serde.dumps(event.data, what=f"event {event.name!r} data") if system
                     else encode_event_data(event))
        prepared.append(PreparedEvent(
            id=event.id or new_id(now), name=event.name, data=event.data, data_json=data_json,
            ts=event.ts if event.ts is not None else now_ms(now), trace=trace,
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
        seq = tx.insert_event(event.id, event.name, event.data_json, event.ts, now, event.trace)

        def resolve(wait: WaitRow, event: PreparedEvent = event) -> None:
            _resolve(tx, wait, event, registry, now)

        match_event(tx, event.name, event.data, event.variables, now, resolve)
        for fn in registry.match(event.name, event.variables):
            start_run(tx, fn, [(seq, event)], now, registry)
    return ids


def _resolve(tx: Tx, wait: WaitRow, event: PreparedEvent, registry: Registry, now: float) -> None:
    if wait.kind == WaitKind.CANCEL:
        from stepstone.lifecycle import cancel_run

        cancel_run(tx, wait.run_id, now, registry,
                   ErrorInfo("Cancelled", f"cancelled by event {event.name!r} ({event.id})"))
        return
    output = serde.dumps(event.as_json(), what="event")
    if tx.complete_waiting_step(wait.run_id, wait.step_id, StepStatus.COMPLETED, output, None, now):
        tx.wake_run(wait.run_id, now)
