"""From events to runs, inside one transaction.

Events arrive prepared (``incoming.prepare``: validated and encoded before
anything is written). ``ingest`` then, in one transaction, dedupes each event
by id (24 h), appends it to the event log, resolves the waits it satisfies
(``wait_for_event``, ``cancel_on``) and starts a run of every function it
triggers. It is the top of the runtime's order (see ``stepstone.runtime``):
it hands itself down to admission and lifecycle as the way a run's end
publishes its system events.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from stepstone import limits, serde
from stepstone.errors import ErrorInfo
from stepstone.registry import Registry
from stepstone.runtime.admission import start_run
from stepstone.runtime.incoming import PreparedEvent
from stepstone.runtime.lifecycle import cancel_run
from stepstone.runtime.waits import Learn, Survey, match_event
from stepstone.store.base import Tx
from stepstone.store.rows import NewRun, StepStatus, WaitKind, WaitRow

__all__ = ["Sent", "ingest"]


@dataclass
class Sent:
    """What a send's ingestion did besides recording its events, for a direct
    start (``app.py``): the runs it queued, whether it resolved a wait
    (woke or cancelled a run: work for a lease pass), the events it recorded
    (not seen before) and how many runs they asked for (functions admitting
    them: each queued a run, or was skipped or joined another run)."""

    queued: list[NewRun] = field(default_factory=list)
    resolved: bool = False
    recorded: list[str] = field(default_factory=list)
    admitted: int = 0


def ingest(
    tx: Tx,
    events: Sequence[PreparedEvent],
    registry: Registry,
    now: float,
    surveys: Mapping[str, Survey] | None = None,
    learn: Learn | None = None,
    sent: Sent | None = None,
) -> list[str]:
    """Record ``events``, resolve the waits they satisfy and start the runs they
    trigger; returns their ids. ``surveys`` (by event id): unindexed waits
    already evaluated before this transaction (``waits.survey``); ``learn``
    hears how many unindexed waits an event read here; ``sent`` hears the runs
    queued and whether a wait was resolved."""
    ids = []
    for event in events:
        ids.append(event.id)
        keys = tx.wait_keys_later(event.name)  # (PostgreSQL: with record_event, one round trip)
        seq = tx.record_event(event.received(now), now + limits.DEDUPE_WINDOW_SECONDS)
        if seq is None:
            continue  # the same id was seen in the last 24 h
        if sent is not None:
            sent.recorded.append(event.id)

        def resolve(wait: WaitRow, event: PreparedEvent = event) -> None:
            if sent is not None:
                sent.resolved = True
            _resolve(tx, wait, event, registry, now)

        surveyed = None if surveys is None else surveys.get(event.id)
        match_event(tx, event.name, event.data, event.variables, now, resolve, surveyed, learn, keys())
        queued = None if sent is None else sent.queued
        for fn in registry.match(event.name, event.variables):
            start_run(tx, fn, [(seq, event)], now, registry, publish=ingest, queued=queued)
            if sent is not None:
                sent.admitted += 1
    return ids


def _resolve(tx: Tx, wait: WaitRow, event: PreparedEvent, registry: Registry, now: float) -> None:
    if wait.kind == WaitKind.CANCEL:
        cancel_run(
            tx,
            wait.run_id,
            now,
            registry,
            ErrorInfo("Cancelled", f"cancelled by event {event.name!r} ({event.id})"),
            publish=ingest,
        )
        return
    output = serde.dumps(event.as_json(), what="event")
    if tx.complete_waiting_step(wait.run_id, wait.step_id, StepStatus.COMPLETED, output, None, now):
        tx.wake_run(wait.run_id, now)
