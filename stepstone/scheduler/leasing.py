"""Fair leasing: which due runs a worker takes, under concurrency limits and
throttles, without head-of-line blocking across keys.

Work is partitioned by function and first concurrency key. A lease pass visits
due partitions least-recently-served first and takes items from each in queue
order (``sort_at``: priority applied) while their concurrency keys have free
slots and their throttle allows a start. A partition whose key is at its limit
is parked until one of its runs releases a slot (``wake_ckey``) or a lease
expires, so a deep backlog behind a full key costs other keys nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from stepstone.flow.batch import ResolvedBatch
from stepstone.flow.debounce import ResolvedDebounce
from stepstone.flow.throttle import ResolvedThrottle
from stepstone.registry import Registry
from stepstone.store.base import QueueTx, Tx
from stepstone.store.rows import LeasedRun, LeaseTerms, NewRun, QueueItem

SCAN_SLACK = 16  # extra items read per partition, to step over ones a second key blocks
RECHECK = 0.25  # seconds before re-reading a partition whose scan window was all blocked, or
# whose due items another transaction held (skipped, not waited for)
BLOCKED_RECHECK = 5.0  # at most this long between looks at a partition whose key is full


@dataclass
class _Pass:
    tx: QueueTx
    terms: LeaseTerms
    functions: Registry
    wanted: int
    room: Callable[[], int] | None = None  # the final ``wanted``, read before the first choice
    leased: list[LeasedRun] = field(default_factory=list)
    live: dict[tuple[int, str], int] = field(default_factory=dict)
    contended: set[str] = field(default_factory=set)

    @property
    def now(self) -> float:
        return self.terms.now

    def has_slot(self, slot: int, ckey: str | None, limit: int | None) -> bool:
        if ckey is None or limit is None:
            return True
        key = (slot, ckey)
        if key not in self.live:
            if not self.tx.try_lock(ckey):  # another worker is counting this key's slots now
                self.live[key] = limit
                self.contended.add(ckey)
                return False
            self.live[key] = self.tx.live_leases(slot, ckey, self.now)
        return self.live[key] < limit

    def count(self, item: QueueItem) -> None:
        for slot, ckey in ((1, item.ckey1), (2, item.ckey2)):
            if ckey is not None:
                self.live[(slot, ckey)] = self.live.get((slot, ckey), 0) + 1

    def throttled_until(self, item: QueueItem) -> float | None:
        """When a never-started item's throttle lets it start (``None``: now)."""
        if not item.fresh or item.throttle_key is None:
            return None
        fn = self.functions.get(item.function_id)
        throttle = None if fn is None else fn.flow.get(ResolvedThrottle)
        return None if throttle is None else throttle.start_at(self.tx, item.throttle_key, self.now)

    def serve(self, key: str) -> float | None:
        """Take what this partition may give, in one ``take_many``; returns its
        next due time (``None``: its earliest future item)."""
        chosen: list[QueueItem] = []
        if self.room is not None:
            self.wanted, self.room = min(self.wanted, self.room()), None
        next_at = self.choose(key, chosen)
        if chosen:
            ids = [item.run_id for item in chosen]
            self.leased += self.tx.take_many(self.terms, ids, accumulators=self.accumulates(chosen))
        return next_at

    def choose(self, key: str, chosen: list[QueueItem]) -> float | None:
        """Append to ``chosen`` the partition's items to take now, counting their
        slots; returns the partition's next due time (as ``serve``)."""
        room = self.wanted - len(self.leased)
        window = room + SCAN_SLACK
        items = self.tx.partition_items(key, self.now, window)
        blocked_until: float | None = None
        for item in items:
            if len(chosen) >= room:
                return self.now  # more due here; the worker is full
            if not self.has_slot(1, item.ckey1, item.limit1):
                if item.ckey1 in self.contended:
                    return self.now + RECHECK
                # The partition's key is full: a release wakes it (and, should a
                # worker die holding the slots, the re-check below).
                return self.now + BLOCKED_RECHECK
            if not self.has_slot(2, item.ckey2, item.limit2):
                continue
            throttled = self.throttled_until(item)
            if throttled is not None:
                blocked_until = throttled if blocked_until is None else min(blocked_until, throttled)
                continue
            chosen.append(item)
            self.count(item)
        if len(items) == window:
            return self.now + RECHECK
        if blocked_until is None and items and len(chosen) < room:
            return self.now + BLOCKED_RECHECK  # due items a second key blocks
        return blocked_until

    def accumulates(self, items: list[QueueItem]) -> bool:
        """Whether a taken run may have an open debounce or batch (unknown code: yes)."""
        for function_id in {item.function_id for item in items}:
            fn = self.functions.get(function_id)
            if fn is None or fn.flow.get(ResolvedDebounce) or fn.flow.get(ResolvedBatch):
                return True
        return False


def lease(
    tx: QueueTx,
    owner: str,
    functions: Registry,
    wanted: int,
    now: float,
    until: float,
    app_version: str | None = None,
    room: Callable[[], int] | None = None,
) -> list[LeasedRun]:
    """Lease up to ``wanted`` due runs of ``functions`` for ``owner`` until ``until``
    (recording ``app_version``, when given, on each run). ``room``, if given,
    is read once a due partition is found, before anything is chosen: at most
    ``wanted``, fewer if a send started runs directly meanwhile (``slots.py``)."""
    if wanted <= 0:
        return []
    terms = LeaseTerms(owner=owner, now=now, until=until, app_version=app_version)
    state = _Pass(tx, terms, functions, wanted, room)
    for key in tx.due_partitions(functions.ids(), now, wanted + SCAN_SLACK):
        if len(state.leased) >= state.wanted:
            break  # untouched partitions stay due for the next pass
        tx.settle_partition(key, now, state.serve(key), now + RECHECK)
    return state.leased


def starts_now(run: NewRun, now: float) -> bool:
    """Whether a run queued at ``now`` may be taken by its send as a lease pass
    would take it (a due item of its partition aside: ``QueueTx.due_ahead``):
    due now, without concurrency keys, throttle or priority."""
    spec = run.queue_spec
    plain = spec.ckey1 is None and spec.ckey2 is None and spec.throttle_key is None
    return plain and run.available_at <= now and (run.sort_at is None or run.sort_at == run.available_at)


def take_direct(
    tx: QueueTx,
    owner: str,
    runs: Sequence[NewRun],
    wanted: int,
    now: float,
    until: float,
    app_version: str | None = None,
) -> tuple[list[str], Callable[[], list[LeasedRun]]]:
    """Take up to ``wanted`` of the runs queued in this transaction for
    ``owner``, as a lease pass would (``take_many``), where that changes
    nothing in who runs what or when: each is due now, queued without
    concurrency keys, throttle or priority (the caller passes only functions
    whose rules allow it: ``FlowConfig.starts_directly``), and no other due
    item of its partition waits (queue order: a direct start never jumps a
    queue). A partition taken from is settled as a pass leaves it; one with
    an item waiting keeps the runs queued for a pass. Returns the ids of the
    runs asked for (each partition's are taken all or none) and the runs
    taken, given when called (``take_in_order_later``: on PostgreSQL after
    the commit); a partition's take is read before the commit only when the
    room left for the next one depends on it (more runs than ``wanted``)."""
    by_partition: dict[str, list[str]] = {}
    for run in runs:
        if starts_now(run, now):
            by_partition.setdefault(run.queue_spec.partition_key, []).append(run.id)
    terms = LeaseTerms(owner=owner, now=now, until=until, app_version=app_version)
    takes: list[Callable[[], list[LeasedRun] | None]] = []
    asked: list[str] = []
    for key, ids in by_partition.items():
        room = wanted - len(asked)
        if room < len(ids):  # the room depends on what the earlier takes took: read them
            room = wanted - sum(len(take() or ()) for take in takes)
        if room <= 0:
            break
        # settle: every run queued there taken (else its hint stays due now, for the runs left)
        takes.append(tx.take_in_order_later(terms, key, ids, ids[:room], settle=room >= len(ids)))
        asked += ids[:room]
    return asked, lambda: [leased for take in takes for leased in take() or ()]


def pass_times(
    tx: Tx, function_ids: Sequence[str], now: float, took: bool
) -> Callable[[], tuple[float | None, float | None]]:
    """The end of a lease pass in one read of its times: when the next pass is
    due (``next_pass_at``) and the earliest run deadline (the duties'), given
    when called. A pass that took runs has them read after its commit
    (``next_times_later``: on PostgreSQL they come in with the ``COMMIT``, one
    round trip fewer while the pass holds its partitions' rows); one that took
    nothing reads them now (it may look at the due partitions again)."""
    if took:
        return tx.next_times_later(function_ids)
    due, deadline = tx.next_times(function_ids)
    times = _next_pass(tx, function_ids, now, took, due), deadline
    return lambda: times


def next_pass_at(tx: QueueTx, function_ids: Sequence[str], now: float, took: bool) -> float | None:
    """When the worker's next lease pass is due: the earliest partition hint.
    After a pass that took nothing, a hint still due names a partition the pass
    did not visit: one another worker's pass held (skipped, not waited for),
    or one past the pass's limit. Only in the first case, when no due
    partition is left that this worker could lock now, the worker waits
    ``RECHECK`` (or less: a run ending anywhere notifies it) instead of passing
    again at once and spinning on the other pass's lock."""
    return _next_pass(tx, function_ids, now, took, tx.next_due(function_ids))


def _next_pass(
    tx: QueueTx, function_ids: Sequence[str], now: float, took: bool, due: float | None
) -> float | None:
    if took or due is None or due > now:
        return due
    return due if tx.due_partitions(function_ids, now, 1) else now + RECHECK
