"""The queue role: transaction-scoped key locks, GCRA state, and the queue
and its leases (what a lease pass, which applies throttles, and a heartbeat need)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from stepstone.store.rows import LeasedRun, LeaseTerms, QueueItem


class LocksTx(Protocol):
    """Transaction-scoped key locks and the database's clock."""

    def lock(self, key: str) -> None:
        """Hold a lock on ``key`` until the transaction ends, so concurrent
        read-then-write of its state (GCRA, accumulators, slot counts) cannot
        interleave (a no-op where writers are already serial, as in SQLite)."""
        ...

    def try_lock(self, key: str) -> bool:
        """``lock`` without waiting: ``False`` if another transaction holds it."""
        ...

    def server_time(self) -> float | None:
        """The database server's clock now, in epoch seconds; ``None`` when the
        database runs on this machine's clock (SQLite)."""
        ...


class GcraTx(LocksTx, Protocol):
    """GCRA state (theoretical arrival times) of throttle and rate-limit keys,
    read and written under ``lock``."""

    def gcra_tat(self, key: str) -> float | None:
        """The theoretical arrival time of a throttle or rate-limit key."""
        ...

    def set_gcra_tat(self, key: str, tat: float) -> None:
        """Store the theoretical arrival time of a throttle or rate-limit key."""
        ...


class QueueTx(GcraTx, Protocol):
    """The queue and its leases: what a lease pass (which applies throttles) and a
    heartbeat need."""

    def due_partitions(self, function_ids: Sequence[str], now: float, limit: int) -> list[str]:
        """Partitions of ``function_ids`` that may have due work, least recently
        served first (locked for this transaction where the database can)."""
        ...

    def partition_items(self, key: str, now: float, limit: int) -> list[QueueItem]:
        """A partition's due items in queue order (``sort_at``: priority applied)."""
        ...

    def due_ahead(self, key: str, now: float, run_ids: Sequence[str]) -> bool:
        """Whether a due item of the partition other than ``run_ids`` waits (a
        direct start must not jump it). A plain read: it takes no lock."""
        ...

    def taken_here(self, run_ids: Sequence[str]) -> None:
        """The work the running operation made available is at most the runs
        ``run_ids``, queued in this transaction and taken in it by a worker of
        this process (a direct start), its takes' results perhaps not read
        yet: at commit, wake other processes' workers (and this process's)
        only if one of them is queued and was left untaken (its take found a
        due item before it, or none was asked for). One not written at all
        (a send's duplicate event: ``record_event_starting``) wakes no one.
        Another operation's work wakes them as usual."""
        ...

    def live_leases(self, slot: int, ckey: str, now: float) -> int:
        """Runs holding a live lease under concurrency key ``ckey`` (slot 1 or 2)."""
        ...

    def take(self, lease: LeaseTerms, run_id: str) -> LeasedRun | None:
        """Lease one item on ``lease``'s terms, bumping the run's epoch so older
        owners are fenced out; marks the run running (recording the lease's
        ``app_version``, when given, as the version of the code running it) and
        reads its events and memos."""
        ...

    def take_many(
        self, lease: LeaseTerms, run_ids: Sequence[str], *, accumulators: bool = True, new: bool = False
    ) -> list[LeasedRun]:
        """``take`` for several items at once (a lease pass's choice in one
        partition), in a fixed number of statements whatever their number; in
        the order of ``run_ids``, less any that vanished. ``accumulators=False``
        skips dropping the runs' open debounce and batch rows (for functions
        that have neither; a stale row only makes a later join start a new run).
        ``new``: runs queued in this transaction, which have no memos to read
        and whose events it wrote (not read back)."""
        ...

    def take_in_order_later(
        self, lease: LeaseTerms, key: str, queued: Sequence[str], run_ids: Sequence[str], *, settle: bool
    ) -> Callable[[], list[LeasedRun] | None]:
        """A send's direct start: ``take_many(new=True, accumulators=False)`` of
        ``run_ids`` (queued in this transaction, in partition ``key``) unless
        a due item of the partition other than ``queued`` (the runs the send
        queued there) waits: then ``None``, nothing taken (``due_ahead``: a
        direct start never jumps a queue). If it took and ``settle`` (it took
        every run queued there), the partition is next due when its earliest
        item is, as a lease pass leaves it. The taken runs, given when called:
        on PostgreSQL two statements read after the transaction's ``COMMIT``
        (the take, the settle conditional on it: no round trip of their own)."""
        ...

    def settle_partition(self, key: str, now: float, next_at: float | None, recheck: float) -> None:
        """After a lease pass: set the partition's next due time (``None``: its
        earliest future item) and mark it served; drop it if empty. With
        ``next_at`` ``None``, a due item the pass did not see (another
        transaction held its row) makes the partition due again at ``recheck``."""
        ...

    def lower_partition(self, key: str, function_id: str, ckey: str | None, at: float) -> None:
        """Make sure the partition is looked at no later than ``at``."""
        ...

    def next_due(self, function_ids: Sequence[str]) -> float | None:
        """When a partition of ``function_ids`` is next due."""
        ...

    def extend_leases(self, owner: str, run_ids: Sequence[str], until: float, now: float) -> list[str]:
        """Push the leases this owner still holds live at ``now``; returns their run
        ids. A lease that lapsed is never extended (others may have acted on it)."""
        ...

    def release_leases(self, owner: str, now: float) -> int:
        """Give back every lease of ``owner`` so others may take the runs now."""
        ...

    def unqueue_run(self, run_id: str, now: float) -> None:
        """Take a parked run out of the queue (a run paused on a divergence: no
        lease, slot or timeout applies to it until ``requeue_run`` resumes it)."""
        ...
