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

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from stepstone import limits, serde
from stepstone.errors import ErrorInfo
from stepstone.registry import Registry
from stepstone.runtime.admission import plain_run, start_run
from stepstone.runtime.incoming import PreparedEvent
from stepstone.runtime.lifecycle import cancel_run
from stepstone.runtime.waits import Learn, Survey, match_event
from stepstone.store.base import Tx
from stepstone.store.rows import LeasedRun, LeaseTerms, NewRun, StepStatus, WaitKind, WaitRow

__all__ = ["Awaited", "Sent", "ingest"]


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
    awaited: Callable[[], str | None] = lambda: None  # after the commit: the name of an
    # ``at_once`` event nothing was written for, a wait being on it: send again without
    unawaited: list[str] = field(default_factory=list)  # names of events no wait was on
    offer: Callable[[float, NewRun], LeaseTerms | None] = lambda now, run: None  # a direct start's
    # lease for a run written at ``now`` at once (``at_once``), if its local worker takes it
    started: Callable[[], list[LeasedRun]] | None = None  # after the commit: the run written
    # taken on ``offer``'s lease (empty: written queued, or not at all), if one was offered


def ingest(
    tx: Tx,
    events: Sequence[PreparedEvent],
    registry: Registry,
    now: float,
    surveys: Mapping[str, Survey] | None = None,
    learn: Learn | None = None,
    sent: Sent | None = None,
    *,
    at_once: bool = False,
) -> list[str]:
    """Record ``events``, resolve the waits they satisfy and start the runs they
    trigger; returns their ids. ``surveys`` (by event id): unindexed waits
    already evaluated before this transaction (``waits.survey``); ``learn``
    hears how many unindexed waits an event read here; ``sent`` hears the runs
    queued and whether a wait was resolved.

    ``at_once`` (a send, with ``sent``): one event that starts one run of a
    function without flow rules is written reading nothing back
    (``Tx.record_event_starting``: on PostgreSQL no round trip before the
    ``COMMIT``), unless a wait is on its name: then nothing is written and,
    after the commit, ``sent.awaited()`` names it: the caller sends it again
    without ``at_once``. If ``sent.offer`` gives a lease for its run (a
    direct start), the run is written already taken on it where a take
    would take it (``sent.started``)."""
    if at_once and sent is not None and _at_once(tx, events, registry, now, sent):
        return [events[0].id]
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
        found = keys()
        if sent is not None and not found:
            sent.unawaited.append(event.name)
        match_event(tx, event.name, event.data, event.variables, now, resolve, surveyed, learn, found)
        queued = None if sent is None else sent.queued
        for fn in registry.match(event.name, event.variables):
            start_run(tx, fn, [(seq, event)], now, registry, publish=ingest, queued=queued)
            if sent is not None:
                sent.admitted += 1
    return ids


class Awaited:
    """The event names a send found a wait on: ``at_once`` would write nothing
    for them and send again, so they are sent the usual way, until a send
    finds no wait on them (``Sent.unawaited``). At most ``LIMIT`` names."""

    LIMIT = 4096

    def __init__(self) -> None:
        self._names: set[str] = set()
        self._lock = threading.Lock()

    def __contains__(self, name: str) -> bool:
        return name in self._names

    def learn(self, sent: Sent) -> bool:
        """After a send's commit: what it found (``awaited``, ``unawaited``);
        whether it is to be sent again (an ``at_once`` event was awaited)."""
        name = sent.awaited()
        if name is None and not self._names:
            return False  # (the usual send: nothing to learn, no lock taken)
        with self._lock:
            self._names.difference_update(sent.unawaited)
            if name is not None:
                if len(self._names) >= self.LIMIT:
                    self._names.clear()
                self._names.add(name)
        return name is not None


def _at_once(tx: Tx, events: Sequence[PreparedEvent], registry: Registry, now: float, sent: Sent) -> bool:
    """``ingest``'s ``at_once`` shape, written (``False``: not that shape)."""
    if len(events) != 1:
        return False
    [event] = events
    functions = registry.match(event.name, event.variables)
    run = plain_run(functions[0], event, now) if len(functions) == 1 else None
    if run is None:
        return False
    lease = sent.offer(now, run)
    recorded = tx.record_event_starting(event.received(now), now + limits.DEDUPE_WINDOW_SECONDS, run, lease)
    tx.taken_here([run.id])  # a wake-up only if it is queued untaken: none for a duplicate
    sent.awaited = lambda: event.name if recorded()[1] else None
    if lease is not None:  # (written taken unless a due item waited before it)
        sent.started = lambda: [] if (leased := recorded()[2]) is None else [leased]
    # As if recorded: if it was a duplicate (or awaited), its run was not written,
    # so no take takes it and the send is not quiet (nothing else reads these).
    sent.recorded.append(event.id)
    sent.admitted += 1
    sent.queued.append(run)
    return True


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
