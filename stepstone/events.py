"""The event: what triggers runs, resolves waits and cancels runs."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from stepstone import limits, serde
from stepstone.errors import LimitExceededError, StepstoneError


class InvalidEventError(StepstoneError, ValueError):
    """An event is malformed: bad name, data not an object, too large."""


@dataclass(frozen=True)
class Event:
    """``name``; ``data`` (a JSON object); ``id`` (dedupes for 24 h; generated when
    omitted); ``ts`` (milliseconds since the epoch; set on receipt when omitted)."""

    name: str
    data: dict[str, Any] = field(default_factory=dict)
    id: str | None = None
    ts: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "data": self.data, "id": self.id, "ts": self.ts}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Event:
        return cls(name=raw["name"], data=raw.get("data") or {}, id=raw.get("id"), ts=raw.get("ts"))


def validate_event(event: Any, *, max_depth: int | None = limits.MAX_EVENT_DEPTH) -> None:
    """Raise ``InvalidEventError`` / ``LimitExceededError`` if ``event`` cannot be sent.

    ``max_depth`` bounds the nesting of its data, so that no reader (the API, the
    dashboard, CEL) has to recurse deeply; ``None`` for the engine's own events,
    which embed a run's (already bounded) event and output."""
    if not isinstance(event, Event):
        raise InvalidEventError(f"expected stepstone.Event, got {type(event).__name__}")
    if not isinstance(event.name, str) or not event.name.strip():
        raise InvalidEventError("event name must be a non-empty string")
    if len(event.name) > limits.MAX_EVENT_NAME_CHARS:
        raise LimitExceededError(
            f"event name is {len(event.name)} characters, over the limit of {limits.MAX_EVENT_NAME_CHARS}"
        )
    if not isinstance(event.data, dict):
        raise InvalidEventError(f"event {event.name!r}: data must be an object (dict)")
    if max_depth is not None and event.data and nesting_depth(event.data, max_depth) > max_depth:
        raise InvalidEventError(f"event {event.name!r}: data is nested more than {max_depth} levels deep")
    if event.id is not None and (not isinstance(event.id, str) or not event.id):
        raise InvalidEventError(f"event {event.name!r}: id must be a non-empty string")
    if event.ts is not None and (isinstance(event.ts, bool) or not isinstance(event.ts, int)):
        raise InvalidEventError(f"event {event.name!r}: ts must be integer milliseconds")


def nesting_depth(value: Any, stop: int) -> int:
    """How deeply objects and arrays nest in ``value`` (``{}`` is 1), counting no
    further than ``stop + 1``. Iterative: any depth is measured without recursion."""
    deepest, pending = 0, [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if not isinstance(item, dict | list | tuple):
            continue
        deepest = max(deepest, depth)
        if depth > stop:
            return deepest
        children = item.values() if isinstance(item, dict) else item
        pending.extend((child, depth + 1) for child in children)
    return deepest


def encode_event_data(event: Event) -> str:
    return serde.dumps(event.data, what=f"event {event.name!r} data", limit=limits.MAX_EVENT_BYTES)


def now_ms(now: float | None = None) -> int:
    return int((time.time() if now is None else now) * 1000)
