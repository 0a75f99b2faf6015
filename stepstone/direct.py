"""A send's direct start: the runs a send queues taken in its own write
transaction for a running local worker, handed over in memory after the
commit, with no lease pass and no wake-up; and what the send then knows
without reading (``runs.list(event_id=)`` right after it).

``App._send`` reserves the slots (``reserve``) before its write, takes in the
write (``DirectStart.take``), and hands the taken runs over or gives the slots
back after it. The take itself is ``scheduler.leasing.take_direct``: the same
order and rules as a lease pass."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Sequence

from stepstone.runtime import Sent
from stepstone.scheduler.leasing import starts_now, take_direct
from stepstone.store.base import Tx
from stepstone.store.rows import LeasedRun, LeaseTerms, NewRun, RunFilter, RunRow
from stepstone.worker import Worker

Taking = tuple[list[str] | None, Callable[[], list[LeasedRun]]]
"""A direct start's take: the runs asked for if they are all the send made
available (else ``None``), and the runs taken, given when called."""


def reserve(workers: Sequence[Worker], events: int, sent: float) -> DirectStart | None:
    """Slots for a direct start of a send's runs, on the local worker with the
    most free (``None``: no running local worker has one free). ``sent``: the
    ``time.monotonic()`` the worker measures the runs' leases from, taken
    before the send read the time their leases run from."""
    if len(workers) > 1:  # (one worker, the usual: nothing to compare)
        workers = sorted(workers, key=lambda w: -w.slots.offered())
    for worker in workers:
        slots = worker.reserve(events)
        if slots:
            return DirectStart(worker, slots, sent)
    return None


@dataclasses.dataclass
class DirectStart:
    """Free slots reserved on a running local worker before a send's write; in
    it, the runs queued for the app's functions that allow it are taken for that
    worker as its lease pass would take them (``leasing.take_direct``; a send's
    one run is written taken: ``offer``); after the commit they are handed over
    in memory (or the slots given back)."""

    worker: Worker
    slots: int
    # time.monotonic() before the send read its time (``now``: the leases it
    # writes last until ``now`` + TTL in the store): the worker knows them live
    # no longer (``Presence.hold``), whatever passed between that read and the
    # write (a survey or catalog read, a pause)
    sent: float

    def offer(self, now: float, run: NewRun) -> LeaseTerms | None:
        """``Sent.offer``: the lease a run the send writes at ``now`` is written
        taken on (``None``: written queued, for a take or a lease pass)."""
        w = self.worker
        terms = LeaseTerms(owner=w.lease_owner, now=now, until=now + w.lease_ttl, app_version=w.app_version)
        return terms if w.registry.starts_directly(run.function_id) and starts_now(run, now) else None

    def take(self, tx: Tx, sent: Sent, now: float) -> Taking:
        if sent.started is not None:  # (the send wrote its run taken, or queued: ``ingest``)
            return [run.id for run in sent.queued], sent.started
        w = self.worker
        runs = [run for run in sent.queued if w.registry.starts_directly(run.function_id)]
        asked, taken = take_direct(tx, w.lease_owner, runs, self.slots, now, now + w.lease_ttl, w.app_version)
        every = bool(asked) and len(asked) == len(sent.queued) and not sent.resolved
        if every:  # (a run whose take finds a due item before it still wakes the workers)
            tx.taken_here(asked)
        return (asked if every else None), taken

    def hand_over(self, leased: list[LeasedRun], now: float) -> None:
        """After the commit: the taken runs to the worker, the rest of the slots freed."""
        self.worker.hand_over(leased, self.slots, self.sent, now)

    def give_back(self, now: float) -> None:
        """After a failed write: the reserved slots freed."""
        self.worker.give_back(self.slots, now + self.worker.lease_ttl)


@dataclasses.dataclass(frozen=True)
class SentHere:
    """The runs of a send's one new event when the send started every one of
    them on a local worker: as the send's transaction left them (the rows its
    take returned), newest first as a list by event orders them. Until their
    invocations begin, and while their leases are known live, nothing else
    writes them (their lease is this worker's; an operator's cancel only flags
    a held run), so ``runs.list(event_id=)`` right after the send is answered
    with them, reading nothing."""

    event_id: str
    runs: list[RunRow]
    worker: Worker

    @classmethod
    def of(
        cls, direct: DirectStart | None, sent: Sent, leased: list[LeasedRun], quiet: bool
    ) -> SentHere | None:
        if direct is None or not quiet or len(sent.recorded) != 1 or sent.admitted != len(leased):
            return None  # (quiet: every run queued was taken, no wait resolved)
        runs = [item.run for item in leased]
        if len(runs) > 1:
            runs.sort(key=lambda run: run.id, reverse=True)
        return cls(sent.recorded[0], runs, direct.worker)

    def listed(self, where: RunFilter) -> list[RunRow] | None:
        """What a read of ``where`` returns now, if this knows it."""
        if where != RunFilter(event_id=self.event_id, limit=where.limit):
            return None
        w = self.worker
        if not all(unstarted(w, run.id) and w.presence.live(run.id) for run in self.runs):
            return None  # (a lapsed lease: another worker or an operator may have written it)
        return self.runs[: where.limit]


def unstarted(worker: Worker, run_id: str) -> bool:
    """Whether the run is in flight on ``worker`` and its invocation has not
    begun: nothing of it was written since it was taken (from any thread)."""
    task = worker.inflight.get(run_id)
    coro = None if task is None else task.get_coro()
    return inspect.iscoroutine(coro) and inspect.getcoroutinestate(coro) == inspect.CORO_CREATED
