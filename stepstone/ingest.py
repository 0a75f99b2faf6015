"""From events to runs, inside one transaction.

``prepare`` validates and encodes events before anything is written (a bad
event in a list rejects the whole list: nothing is half-written). ``ingest``
then, in one transaction, dedupes each event by id (24 h), appends it to the
event log and creates a run for every function it triggers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from stepstone import limits
from stepstone.events import Event, encode_event_data, now_ms, validate_event
from stepstone.function import FunctionDef
from stepstone.ids import new_id
from stepstone.registry import Registry
from stepstone.store.base import NewRun, Tx


@dataclass(frozen=True)
class PreparedEvent:
    id: str
    name: str
    data: dict[str, Any]
    data_json: str
    ts: int

    @property
    def variables(self) -> dict[str, Any]:
        return {"event": {"name": self.name, "data": self.data, "id": self.id, "ts": self.ts}}

    def to_event(self) -> Event:
        return Event(self.name, self.data, self.id, self.ts)


def prepare(events: Event | Sequence[Event], now: float, *, system: bool = False) -> list[PreparedEvent]:
    """Validate and encode; raises before any write if one event is bad."""
    items = [events] if isinstance(events, Event) else list(events)
    prepared = []
    for event in items:
        validate_event(event)
        if event.name.startswith("stepstone/") and not system:
            from stepstone.events import InvalidEventError

            raise InvalidEventError(f"event names starting with 'stepstone/' are reserved: {event.name!r}")
        data_json = encode_event_data(event) if not system else _encode_system(event)
        prepared.append(PreparedEvent(
            id=event.id or new_id(now), name=event.name, data=event.data, data_json=data_json,
            ts=event.ts if event.ts is not None else now_ms(now),
        ))
    return prepared


def _encode_system(event: Event) -> str:
    from stepstone import serde

    return serde.dumps(event.data, what=f"event {event.name!r} data")


def ingest(tx: Tx, events: Sequence[PreparedEvent], registry: Registry, now: float) -> list[str]:
    """Record ``events`` and start the runs they trigger; returns their ids."""
    ids = []
    for event in events:
        ids.append(event.id)
        if tx.claim_key(f"event:{event.id}", event.id, now + limits.DEDUPE_WINDOW_SECONDS, now) is not None:
            continue  # the same id was seen in the last 24 h
        seq = tx.insert_event(event.id, event.name, event.data_json, event.ts, now)
        for fn in registry.match(event.name, event.variables):
            start_run(tx, fn, [(seq, event)], now)
    return ids


def start_run(
    tx: Tx, fn: FunctionDef, events: Sequence[tuple[int, PreparedEvent]], now: float,
    *, parent: tuple[str, str] | None = None,
) -> str:
    """Create a queued run of ``fn`` for ``events``."""
    run_id = new_id(now)
    flow = fn.flow
    tx.create_run(NewRun(
        id=run_id,
        function_id=fn.id,
        event_seqs=[seq for seq, _ in events],
        event_ids=[event.id for _, event in events],
        available_at=now,
        created_at=now,
        parent_run_id=parent[0] if parent else None,
        parent_step_id=parent[1] if parent else None,
        start_deadline=None if flow.start_timeout is None else now + flow.start_timeout,
    ))
    return run_id
