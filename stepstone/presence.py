"""A worker's presence: its row in the worker registry and the leases it holds.

A lease is known live until a time measured on ``time.monotonic()`` from
before the time its expiry in the store was computed from was read (that read
and the write that took or last extended it may be far apart: a paused
loop, a slow send), its TTL later (``hold``): a step must not
start on a lease that may have lapsed, since another worker may own the run
by then (``live``, ``ExecEnv.lease_held``). Registration at start and a
heartbeat every third of the lease TTL: the database's clock measured again
(``clocksync.resync``), the held leases extended, the row refreshed, and the
time of the last write that reached the database kept for readiness
(``ok_at``, ``Worker.health``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Container

from stepstone.clock import Clock
from stepstone.clocksync import resync
from stepstone.store.base import Store, Tx, WorkersTx
from stepstone.store.viewrows import WorkerRow

log = logging.getLogger("stepstone.worker")


class Presence:
    def __init__(
        self, store: Store, clock: Clock, row: Callable[[float], WorkerRow], owner: str, ttl: float
    ) -> None:
        self.store = store
        self.clock = clock
        self.row = row  # this worker's registry row, its heartbeat at the time given
        self.owner = owner
        self.ttl = ttl
        self.ok_at: float | None = None  # time.monotonic() of the last registration or heartbeat
        self._until: dict[str, float] = {}  # run id -> time.monotonic() its lease is known live until
        self._suspects: set[str] = set()  # runs whose lease the last heartbeat did not extend

    def hold(self, run_id: str, sent: float) -> None:
        """A lease taken at a time read after monotonic ``sent`` (its expiry: that time + TTL)."""
        self._until[run_id] = sent + self.ttl

    def drop(self, run_id: str) -> None:
        self._until.pop(run_id, None)

    def live(self, run_id: str) -> bool:
        """Whether the lease on the run is still known to be live."""
        return time.monotonic() < self._until.get(run_id, float("inf"))

    async def register(self) -> None:
        await resync(self.store, self.clock)
        now = self.clock.now()
        row = self.row(now)

        def op(tx: WorkersTx) -> bool:
            twin = any(w.id == row.id for w in tx.list_workers(now - self.ttl))
            tx.upsert_worker(row)
            return twin

        twin = await self.store.transact(op)
        self.ok_at = time.monotonic()
        if twin:
            log.warning(
                "worker %s: another live worker has this instance id; both will work, "
                "but app.workers.list() shows them as one: give each its own --instance-id",
                row.id,
            )

    async def beat(self, held: list[str], in_flight: Container[str]) -> None:
        """Measure the database's clock again, extend the leases ``held`` and
        refresh the row; warn of a lease lost while its run is still in flight."""
        await resync(self.store, self.clock)
        owner, row = self.owner, self.row(self.clock.now())

        def op(tx: Tx) -> list[str]:
            tx.upsert_worker(row)
            # The time is read when the transaction runs, not when it was
            # queued: a lease that lapsed meanwhile must not be extended.
            now = self.clock.now()
            return tx.extend_leases(owner, held, now + self.ttl, now)

        sent = time.monotonic()
        kept = await self.store.transact(op)
        self.ok_at = time.monotonic()
        for run_id in kept:
            if run_id in self._until:
                self.hold(run_id, sent)
        # A lease the heartbeat skipped because the run is being parked or
        # finished right now looks lost once; one still missing at the next
        # beat while the run is in flight is (its next commit will be refused).
        missing = set(held) - set(kept)
        for run_id in missing & self._suspects:
            if run_id in in_flight:
                log.warning("worker %s: lease on run %s lost", row.id, run_id)
        self._suspects = missing
