"""Orchestration effects and invocation outcomes as data, and their JSON form.

A run's orchestration steps act on the store (insert a wait, start a child
run, ingest sent events, expire a wait, take a signal). The interpreter
describes each such act as a frozen record; the executor's ``Services`` turn
a record into the store operation (``effectops.py``), whether the step ran
in a worker or in an HTTP endpoint (``ss.serve``), whose answer carries the
records to ``stepstone server``: one home for what each effect does.

The invocation protocol of the push model lives here too: the request the
server sends (the leased run: its row, events and memos) and the answer the
endpoint returns (staged memos, spans, effects, a deferred operation and the
``Decision`` that ends the invocation). Everything round-trips through JSON.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, ClassVar

from stepstone.errors import ErrorInfo
from stepstone.events import Event
from stepstone.store.rows import EventRow, LeasedRun, RunRow, RunStatus, SpanRow, StepRow, WaitRow

PROTOCOL = 1


class WireError(ValueError):
    """A request or an answer that is not a valid invocation document."""


# -- effects ---------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class BeginWait:
    """``wait_for_event``: its wait rows (one per name), or at once the oldest
    event matching since ``since`` (``lookback``)."""

    kind: ClassVar[str] = "wait"
    site: ClassVar[str] = "wait_for_event.insert_wait"
    waits: tuple[WaitRow, ...]
    since: float | None
    now: float


@dataclass(frozen=True, kw_only=True)
class StartChild:
    """``invoke``: the wait for the child ``child_id`` and the child's run."""

    kind: ClassVar[str] = "invoke"
    site: ClassVar[str] = "invoke.start_child"
    run_id: str
    step_id: str
    function_id: str
    data: dict[str, Any]
    now: float
    expires_at: float | None
    child_id: str


@dataclass(frozen=True, kw_only=True)
class SendEvents:
    """``send_event``: events with their ids fixed (a repeated commit dedupes)."""

    kind: ClassVar[str] = "send"
    site: ClassVar[str] = "send_event.ingest_sent"
    events: tuple[Event, ...]
    now: float
    # The events as validated and encoded when the record was made (not sent).
    prepared: Any = field(default=None, compare=False, repr=False)

    @property
    def ids(self) -> list[str]:
        return [str(e.id) for e in self.events]


@dataclass(frozen=True, kw_only=True)
class ExpireWait:
    """A waiting step past its timeout: claim its wait (the race with the event
    or child) and complete it, or fail it for an invoke; returns the memo."""

    kind: ClassVar[str] = "expire"
    site: ClassVar[str] = "_resolved.timeout"
    run_id: str
    step_id: str
    failure: str | None
    now: float


@dataclass(frozen=True, kw_only=True)
class ReceiveSignal:
    """``wait_for_signal``: take a buffered signal, or park on ``wait``."""

    kind: ClassVar[str] = "signal"
    site: ClassVar[str] = "wait_for_signal.receive_signal"
    wait: WaitRow


EffectRecord = BeginWait | StartChild | SendEvents | ExpireWait | ReceiveSignal


def effect_to_json(record: EffectRecord) -> dict[str, Any]:
    body: dict[str, Any] = {"kind": record.kind}
    for f in dataclasses.fields(record):
        if f.name == "prepared":
            continue
        value = getattr(record, f.name)
        if f.name == "waits":
            value = [dataclasses.asdict(w) for w in value]
        elif f.name == "wait":
            value = dataclasses.asdict(value)
        elif f.name == "events":
            value = [e.to_json() for e in value]
        body[f.name] = value
    return body


def effect_from_json(raw: Any) -> EffectRecord:
    try:
        kind = raw["kind"]
        if kind == BeginWait.kind:
            waits = tuple(WaitRow.from_row(w) for w in raw["waits"])
            return BeginWait(waits=waits, since=raw["since"], now=raw["now"])
        if kind == StartChild.kind:
            keys = ("run_id", "step_id", "function_id", "data", "now", "expires_at", "child_id")
            return StartChild(**{k: raw[k] for k in keys})
        if kind == SendEvents.kind:
            return SendEvents(events=tuple(Event.from_json(e) for e in raw["events"]), now=raw["now"])
        if kind == ExpireWait.kind:
            return ExpireWait(
                run_id=raw["run_id"], step_id=raw["step_id"], failure=raw["failure"], now=raw["now"]
            )
        if kind == ReceiveSignal.kind:
            return ReceiveSignal(wait=WaitRow.from_row(raw["wait"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise WireError(f"bad effect: {exc}") from exc
    raise WireError(f"unknown effect kind {raw.get('kind')!r}")


def effect_run_ids(record: EffectRecord) -> set[str]:
    """The runs whose rows the effect writes as their own (the server checks
    that an answer touches only the run it was asked about)."""
    if isinstance(record, BeginWait):
        return {w.run_id for w in record.waits}
    if isinstance(record, ReceiveSignal):
        return {record.wait.run_id}
    if isinstance(record, SendEvents):
        return set()
    return {record.run_id}


# -- decisions -------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Decision:
    """How an invocation ends: the run ends (``status`` ended, with ``output``
    or ``error``), or parks with ``status`` until ``wake_at`` recording ``attempt``."""

    status: RunStatus
    output: str | None = None
    error: ErrorInfo | None = None
    wake_at: float | None = None
    attempt: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "status": str(self.status),
            "output": self.output,
            "error": None if self.error is None else self.error.to_json(),
            "wake_at": self.wake_at,
            "attempt": self.attempt,
        }

    @classmethod
    def from_json(cls, raw: Any) -> Decision:
        try:
            error = raw.get("error")
            return cls(
                status=RunStatus(raw["status"]),
                output=raw.get("output"),
                error=None if error is None else ErrorInfo.from_json(error),
                wake_at=raw.get("wake_at"),
                attempt=raw.get("attempt"),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise WireError(f"bad decision: {exc}") from exc


# -- the invocation request and its answer ---------------------------------------------------
def _run_to_json(run: RunRow) -> dict[str, Any]:
    return {**dataclasses.asdict(run), "event_ids": json.dumps(run.event_ids)}


def encode_request(leased: LeasedRun, request_id: str) -> bytes:
    """The body of the invocation request for a leased run; ``request_id`` (fresh
    per request) must come back in the answer, binding the answer to it."""
    body = {
        "protocol": PROTOCOL,
        "request_id": request_id,
        "run": _run_to_json(leased.run),
        "epoch": leased.epoch,
        "events": [dataclasses.asdict(e) for e in leased.events],
        "steps": [dataclasses.asdict(s) for s in leased.steps],
    }
    return json.dumps(body, separators=(",", ":")).encode()


def decode_request(body: bytes) -> tuple[LeasedRun, str]:
    """The leased run a request carries, and its request id."""
    raw = _document(body, "request")
    try:
        leased = LeasedRun(
            run=RunRow.from_row(raw["run"]),
            epoch=int(raw["epoch"]),
            events=[EventRow.from_row(e) for e in raw["events"]],
            steps=[StepRow.from_row(s) for s in raw["steps"]],
        )
        return leased, _request_id(raw)
    except (KeyError, TypeError, ValueError) as exc:
        raise WireError(f"bad request: {exc}") from exc


def _request_id(raw: dict[str, Any]) -> str:
    value = raw["request_id"]
    if not isinstance(value, str) or not value:
        raise ValueError("'request_id' must be a non-empty string")
    return value


@dataclass(frozen=True, kw_only=True)
class Answer:
    """What an endpoint's invocation staged, in order, and how it ended.
    ``deferred``: an operation that needs the database mid-invocation (a wait's
    timeout, a signal): the server commits it with the memos, then calls again.
    ``request_id``: the request it answers (another request's answer, even
    validly signed, is refused: a captured answer cannot be replayed)."""

    request_id: str
    steps: tuple[StepRow, ...]
    spans: tuple[SpanRow, ...]
    effects: tuple[EffectRecord, ...]
    decision: Decision
    deferred: EffectRecord | None = None

    def encode(self) -> bytes:
        body = {
            "protocol": PROTOCOL,
            "request_id": self.request_id,
            "steps": [dataclasses.asdict(s) for s in self.steps],
            "spans": [dataclasses.asdict(s) for s in self.spans],
            "effects": [effect_to_json(e) for e in self.effects],
            "decision": self.decision.to_json(),
            "deferred": None if self.deferred is None else effect_to_json(self.deferred),
        }
        return json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, body: bytes) -> Answer:
        raw = _document(body, "answer")
        try:
            deferred = raw.get("deferred")
            return cls(
                request_id=_request_id(raw),
                steps=tuple(StepRow.from_row(s) for s in raw["steps"]),
                spans=tuple(SpanRow.from_row(s) for s in raw["spans"]),
                effects=tuple(effect_from_json(e) for e in raw["effects"]),
                decision=Decision.from_json(raw["decision"]),
                deferred=None if deferred is None else effect_from_json(deferred),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise WireError(f"bad answer: {exc}") from exc

    def run_ids(self) -> set[str]:
        """Every run whose rows this answer writes."""
        ids = {s.run_id for s in self.steps} | {s.run_id for s in self.spans}
        for record in (*self.effects, *((self.deferred,) if self.deferred else ())):
            ids |= effect_run_ids(record)
        return ids


def _document(body: bytes, what: str) -> dict[str, Any]:
    try:
        raw = json.loads(body)
    except ValueError as exc:
        raise WireError(f"the {what} is not JSON: {exc}") from exc
    if not isinstance(raw, dict) or raw.get("protocol") != PROTOCOL:
        raise WireError(f"the {what} is not a protocol {PROTOCOL} document")
    return raw
