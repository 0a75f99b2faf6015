"""Events on their way in: validated and encoded before anything is written.

``prepare`` raises on the first bad event of a list, so a list with one bad
event writes nothing. A ``PreparedEvent`` carries the encoded data and the id
fixed here, so a transaction retried after an unknown outcome writes the same
event (and its id deduplicates it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from stepstone import limits, serde
from stepstone.events import Event, InvalidEventError, encode_event_data, now_ms, validate_event
from stepstone.ids import new_id
from stepstone.store.rows import NewEvent
from stepstone.tracing import current_context

__all__ = ["PreparedEvent", "prepare"]


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

    def received(self, now: float) -> NewEvent:
        """The event as the log records it, arrived at ``now``."""
        return NewEvent(
            id=self.id, name=self.name, data=self.data_json, ts=self.ts, received_at=now, trace=self.trace
        )


def prepare(events: Event | Sequence[Event], now: float, *, system: bool = False) -> list[PreparedEvent]:
    """Validate and encode; raises before any write if one event is bad."""
    items = [events] if isinstance(events, Event) else list(events)
    trace = None if system else current_context()
    prepared = []
    for event in items:
        validate_event(event, max_depth=None if system else limits.MAX_EVENT_DEPTH)
        if event.name.startswith("stepstone/") and not system:
            raise InvalidEventError(f"event names starting with 'stepstone/' are reserved: {event.name!r}")
        data_json = (
            serde.dumps(event.data, what=f"event {event.name!r} data") if system else encode_event_data(event)
        )
        prepared.append(
            PreparedEvent(
                id=event.id or new_id(now),
                name=event.name,
                data=event.data,
                data_json=data_json,
                ts=event.ts if event.ts is not None else now_ms(now),
                trace=trace,
            )
        )
    return prepared
