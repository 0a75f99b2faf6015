"""Workers: lease due runs, execute them, heartbeat, drain on stop.

A worker is an asyncio task family: one loop that leases up to
``concurrency`` runs and spawns an invocation per run, and one heartbeat that
extends the leases it holds and keeps its row in the worker registry (both
kept by ``presence.Presence``). A worker
that dies loses its leases after ``lease_ttl``; other workers then resume its
runs from their last checkpoint.

The background loops outlive any exception: an iteration that raises is
logged and retried after a growing pause (a database outage, a bug in one
duty). A loop whose task still ends (a ``BaseException``) makes the worker
report not ready (``health``), so a supervisor can restart the process.

Lease expiries are written and compared on ``clock``: for a real-time app the
database server's clock (``stepstone.clocksync``), measured at each heartbeat.

Wake-ups: sends in this process notify the worker directly, its own runs'
ends as ``_lease_after`` says; other processes' commits are pushed when the
store can (PostgreSQL LISTEN/NOTIFY) or noticed through its change token
(SQLite's ``data_version``); timers wake it at the next due time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from stepstone import metrics
from stepstone.attempts import DEFAULT_MAX_ABANDONED, AbandonedThreads
from stepstone.bridge import wait_event
from stepstone.clock import Clock
from stepstone.errors import StoreError
from stepstone.executor import ExecEnv, Outcome, execute
from stepstone.function import FunctionDef
from stepstone.loops import forever
from stepstone.middleware import Middleware
from stepstone.presence import Presence
from stepstone.registry import Registry
from stepstone.scheduler.leasing import RECHECK, lease, pass_times
from stepstone.scheduler.maintenance import (
    cron_op,
    next_duty_op,
    register_crons_op,
    schedules_of,
    timeouts_op,
)
from stepstone.scheduler.retention import pace_for, prune_plan
from stepstone.slots import Slots
from stepstone.store.base import Store, Tx
from stepstone.store.batching import Unsynced
from stepstone.store.rows import ENDED_STATUSES, LeasedRun, RunRead
from stepstone.store.viewrows import WorkerRow

log = logging.getLogger("stepstone.worker")
Execute = Callable[[LeasedRun, ExecEnv], Awaitable[Outcome | None]]
Times = tuple[float | None, float | None]  # a lease pass's next due time and the earliest run deadline
PRUNE_EVERY = 600.0  # seconds between retention passes (at most half the retention)
DUTY_RETRY = 1.0  # seconds before failed duties are tried again
STORE_RETRY = 0.5  # seconds the lease loop pauses while the database fails


def default_instance_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class Worker:
    def __init__(
        self,
        *,
        store: Store,
        registry: Registry,
        clock: Clock,
        app_name: str,
        app_version: str | None = None,
        concurrency: int = 10,
        instance_id: str | None = None,
        lease_ttl: float = 15.0,
        idle_poll: float = 0.05,
        max_idle_sleep: float = 1.0,
        on_idle: Callable[[], Any] | None = None,
        on_run_end: Callable[[str, RunRead | None], Any] | None = None,
        matcher: Callable[[], Registry] | None = None,
        middleware: Sequence[Middleware] = (),
        max_abandoned_threads: int = DEFAULT_MAX_ABANDONED,
        retention: float | None = None,
        execute: Execute = execute,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.store = store
        self.registry = registry
        self.clock = clock
        self.app_name = app_name
        self.app_version = app_version
        self.concurrency = concurrency
        self.id = instance_id or default_instance_id()
        # Leases are held under a name no other process has, even one started
        # with the same instance id: each fences and releases only its own.
        self.lease_owner = f"{self.id}/{secrets.token_hex(4)}"
        self.lease_ttl = lease_ttl
        self.idle_poll = idle_poll
        self.max_idle_sleep = max_idle_sleep
        self.on_idle = on_idle
        self.on_run_end = on_run_end  # after each invocation, with the run as its end left it if watched
        self.watched: Callable[[str], bool] = lambda run_id: False  # (``ExecEnv.watched``)
        self.matcher = matcher or (lambda: registry)
        self.middleware = tuple(middleware)
        self.retention = retention
        self.execute = execute  # one invocation of a leased run (pusher.py: over HTTP)
        self.threads = ThreadPoolExecutor(max_workers=concurrency + 4, thread_name_prefix="stepstone")
        # Threads of timed-out sync steps still running: at the bound, lease nothing.
        self.abandoned = AbandonedThreads(max_abandoned_threads, on_change=self.notify)
        self.inflight: dict[str, asyncio.Task[Any]] = {}
        self.started_at = clock.now()
        self.presence = Presence(store, clock, self._row, self.lease_owner, lease_ttl)  # the leases held
        # Free slots, claimed by lease passes and by direct starts (a send in
        # this process taking runs for this worker: ``reserve``/``hand_over``).
        self.slots = Slots(concurrency, lambda: concurrency if self.abandoned.full else len(self.inflight))
        self._unclaimed: asyncio.Event | None = None
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False
        self._want_lease = True
        self._more = False
        self._due: float | None = None  # the next lease pass comes no later than this
        self._due_in_pass: float | None = None  # due times learned while a pass is in flight
        self._duty_due: float | None = clock.now()  # run duties (cron, timeouts) at start
        self._tasks: list[asyncio.Task[Any]] = []
        self._token: Any = None  # the store's change token as the lease loop last saw it
        self._unsubscribe: Callable[[], None] | None = None
        self.invocations = 0
        self._ended = 0  # invocations over (``_idle`` polls the store's token only when none ended)

    @property
    def _function_ids(self) -> list[str]:
        return self.registry.ids()

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        return self._loop

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._unclaimed = asyncio.Event()
        self._unsubscribe = self.store.subscribe(self.notify)
        metrics.load()  # prometheus_client's import belongs to the start, not to the first run
        await self.presence.register()
        self._token = self.store.change_token()
        self._tasks = [
            asyncio.create_task(
                self._forever("lease loop", self._lease_once, STORE_RETRY), name=f"stepstone-worker-{self.id}"
            ),
            # the heartbeat's own interval paces its retries during an outage
            asyncio.create_task(
                self._forever("heartbeat", self._heartbeat_once, 0.0), name=f"stepstone-heartbeat-{self.id}"
            ),
            asyncio.create_task(
                self._forever("retention", self._prune_once, STORE_RETRY),
                name=f"stepstone-retention-{self.id}",
            ),
        ]
        for task in self._tasks:
            task.add_done_callback(self._loop_ended)

    def health(self) -> dict[str, Any]:
        """Readiness for a probe (thread-safe): registered, not draining, every
        background loop alive, and its last heartbeat reached the database
        within one lease TTL."""
        ok_at = self.presence.ok_at
        since = None if ok_at is None else round(time.monotonic() - ok_at, 3)
        dead = self.dead_loops()
        full = self.abandoned.full
        ready = since is not None and since < self.lease_ttl and not self._stopping and not dead and not full
        return {
            "ready": ready,
            **({"reason": "abandoned step threads at their bound"} if full else {}),
            "abandoned_threads": self.abandoned.count,
            "max_abandoned_threads": self.abandoned.limit,
            "worker": self.id,
            "draining": self._stopping,
            "in_flight": len(self.inflight),
            "concurrency": self.concurrency,
            "seconds_since_heartbeat": since,
            "dead_loops": dead,
        }

    def dead_loops(self) -> list[str]:
        """Names of the background loops whose task has ended."""
        return [task.get_name() for task in list(self._tasks) if task.done()]

    async def _forever(self, what: str, once: Callable[[], Awaitable[None]], store_pause: float) -> None:
        await forever(self.id, what, once, store_pause, lambda: self._stopping)

    def _loop_ended(self, task: asyncio.Task[Any]) -> None:
        if task.cancelled():
            return
        exc = task.exception()  # retrieved here, so asyncio does not complain later
        if not self._stopping:
            log.error(
                "worker %s: %s ended (%r); the worker reports not ready",
                self.id,
                task.get_name(),
                exc,
                exc_info=exc,
            )

    def notify(self) -> None:
        """Wake the worker (thread-safe): new work may be due."""
        self._want_lease = True
        self._poke()

    def _poke(self) -> None:
        if self._wake is not None:
            self._on_loop(self._wake.set)

    def _on_loop(self, fn: Callable[..., None], *args: Any) -> None:
        """Call ``fn`` on the worker's loop (now if this is it), from any thread."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return  # stopped: leases it holds expire and other workers resume the runs
        if asyncio.events._get_running_loop() is loop:  # (None off any loop's thread)
            fn(*args)
        else:
            loop.call_soon_threadsafe(fn, *args)

    async def stop(self, drain_timeout: float = 30.0) -> None:
        """Stop taking work, let in-flight invocations finish (up to the timeout),
        then give back every lease so other workers resume at once."""
        self._stopping = True
        self.slots.close()  # no direct start from now on
        if self._unsubscribe is not None:
            self._unsubscribe()
        self.notify()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._handed_over()  # direct starts committing now join the drain
        pending = list(self.inflight.values())
        if pending:
            _done, still = await asyncio.wait(pending, timeout=drain_timeout)
            for task in still:
                task.cancel()
            await asyncio.gather(*still, return_exceptions=True)
        owner, now = self.lease_owner, self.clock.now()

        def release(tx: Tx) -> None:
            tx.release_leases(owner, now)
            tx.remove_worker(self.id)

        try:
            await self.store.transact(release)
        except StoreError:
            log.exception("worker %s: could not release leases; they will expire", self.id)
        self.threads.shutdown(wait=False, cancel_futures=True)

    # -- leasing: only when there may be work (a wake-up, a due time, a run's end:
    # ``_lease_after``); never on a fixed timer but the ``max_idle_sleep`` net.
    async def _lease_once(self) -> None:
        """A turn of the lease loop: duties if due, else a warranted lease pass, else wait for one."""
        if self._duty_due is not None and self._duty_due <= self.clock.now():
            await self._duties()  # then lease: duties never starve leasing
            if self._stopping:
                return
        claim = self.slots.claim_pass() if self._want_lease else 0
        if claim > 0:
            self._want_lease = False
            try:
                self._due_in_pass = None
                leased, due, self._duty_due = await self._lease(claim, self.slots.seal_pass)
                self._due = _earliest(due, self._due_in_pass)  # the pass's snapshot may predate them
                self._more = bool(leased) and len(leased) == self.slots.pass_room  # it filled its slots
                for item in leased:
                    self._spawn(item)
            except BaseException:
                self._want_lease = True  # the retry leases again
                raise
            finally:
                self.slots.end_pass()
            return
        self._token = await self._idle(self._token)

    async def _handed_over(self) -> None:
        """Wait until no slot is claimed: every direct start committing now has
        been handed over (or given back)."""
        assert self._unclaimed is not None
        while self.slots.claimed:
            self._unclaimed.clear()
            await self._unclaimed.wait()

    def _release(self, count: int) -> None:
        """A direct start's slots back (on the worker's loop)."""
        if self.slots.release(count) and self._unclaimed is not None:
            self._unclaimed.set()
        if count and self._want_lease:
            self._poke()  # a pass waits for these slots

    # -- direct starts (app.py): runs taken in the send's own transaction -------------------------
    def reserve(self, wanted: int) -> int:
        """Slots for runs a send in this process may take for this worker (from
        any thread); 0 unless it is running and not stopping. Every reservation
        ends with one ``hand_over`` or ``give_back``."""
        loop = self._loop
        if loop is None or loop.is_closed() or not self._tasks:
            return 0
        return self.slots.reserve(wanted)

    def hand_over(self, leased: Sequence[LeasedRun], reserved: int, sent: float, now: float) -> None:
        """Start the runs a send took for this worker (leased under its owner at
        ``now``, the write sent at monotonic ``sent``) as if its lease pass had
        taken them, and give back the rest of the ``reserved`` slots (from any
        thread)."""
        self._on_loop(self._adopt, leased, reserved, sent, now)

    def give_back(self, reserved: int, until: float) -> None:
        """After a send that failed: its slots back (from any thread). It may
        have committed all the same (an unknown outcome), leasing runs to this
        worker until ``until``: the next lease pass comes no later than that."""
        self._on_loop(self._given_back, reserved, until)

    def _adopt(self, leased: Sequence[LeasedRun], reserved: int, sent: float, now: float) -> None:
        try:
            for item in leased:
                self.presence.hold(item.run.id, sent)
                metrics.run_started(item.run.function_id, now - item.run.created_at)
                self._spawn(item)
        finally:
            self._release(reserved)

    def _given_back(self, reserved: int, until: float) -> None:
        self._learn_due(until)
        self._release(reserved)
        self._poke()

    def _learn_due(self, at: float) -> None:
        """A time by which the next lease pass must come (a parked run's wake-up,
        a lease lapsing after a send failed). A pass in flight may have read
        the store before the write behind it, so its answer must not erase it."""
        self._due = _earliest(self._due, at)
        self._due_in_pass = _earliest(self._due_in_pass, at)

    async def _lease(
        self, claim: int, room: Callable[[], int] | None = None
    ) -> tuple[list[LeasedRun], float | None, float | None]:
        """A lease pass for up to ``claim`` runs, ``room()`` once it finds work (``leasing.lease``)."""
        sent = time.monotonic()  # (before ``now``: the leases last until ``now`` + TTL in the store)
        owner, ids, now = self.lease_owner, self._function_ids, self.clock.now()
        until, version = now + self.lease_ttl, self.app_version
        schedules, registry = self._schedules(), self.registry

        def op(tx: Tx) -> tuple[list[LeasedRun], Callable[[], Times], float | None]:
            leased = lease(tx, owner, registry, claim, now, until, version, room)
            return leased, pass_times(tx, ids, now, bool(leased)), tx.next_cron(schedules)

        leased, times, cron = await self.store.transact(Unsynced(op))
        due, deadline = times()  # (read with the commit: ``pass_times``)
        for item in leased:
            self.presence.hold(item.run.id, sent)
            if item.run.started_at == now:  # its first start: the lease set started_at
                metrics.run_started(item.run.function_id, now - item.run.created_at)
        return leased, due, _earliest(cron, deadline)  # (the next duty: as ``next_duty``)

    # -- duties: cron ticks, timeouts ------------------------------------------------------
    def _cron_functions(self) -> list[FunctionDef]:
        return [fn for fn in self.registry if fn.cron_triggers]

    def _schedules(self) -> list[tuple[str, str]]:
        """The (function id, schedule) pairs this worker's code hosts: the only
        cron rows whose times it waits for (another deploy's are not its duty)."""
        return schedules_of(self.registry)

    async def _duties(self) -> None:
        """Run the periodic duties. A failure postpones them by ``DUTY_RETRY`` so
        leasing goes on meanwhile; a ``StoreError`` is logged here, anything
        else raised to the caller."""
        now = self.clock.now()
        try:
            matcher = self.matcher()
            crons = self._cron_functions()
            await self.store.transact(register_crons_op(list(self.registry), now))
            if crons:
                await self.store.transact(cron_op(crons, now, matcher))
            await self.store.transact(timeouts_op(now, matcher))
            self._duty_due = await self.store.read(next_duty_op(self._schedules()))
        except StoreError as exc:
            log.warning("worker %s: periodic duties failed (%s); retrying", self.id, exc)
            self._duty_due = now + DUTY_RETRY
        except Exception:
            self._duty_due = now + DUTY_RETRY
            raise
        finally:
            self._want_lease = True

    # -- retention: its own loop, so that leasing never waits for it --------------------------
    async def _prune_once(self) -> None:
        """One retention pass (``scheduler/retention.py``), resting between its
        batches as its ``Pace`` says, then a pause until the next: ``PRUNE_EVERY``, at most half the
        retention."""
        pace = pace_for(self.store.dialect)
        plan = prune_plan(self.retention, self.clock.now(), pace)
        with contextlib.suppress(StopIteration):
            op = next(plan)
            while not self._stopping:
                batch = await self.store.transact(op)
                rest = pace.after()
                metrics.pruned(batch[0].counts)
                op = plan.send(batch)
                await asyncio.sleep(rest)
        every = PRUNE_EVERY if self.retention is None else min(PRUNE_EVERY, self.retention / 2)
        await asyncio.sleep(every)

    async def _idle(self, token: Any) -> Any:
        """Wait until a lease is warranted; returns the latest change token."""
        assert self._wake is not None
        if self.on_idle is not None and not self.inflight:
            self.on_idle()
        # The net: the token is polled, and a pass made, at least every
        # max_idle_sleep, whatever woke the worker or did not (a lost NOTIFY).
        polled = began = time.monotonic()
        while not self._stopping:
            now = self.clock.now()
            free = self.slots.free()  # none while abandoned step threads are at their bound
            if free > 0 and self._want_lease:
                break
            deadline = now + self.max_idle_sleep - (time.monotonic() - began)
            if self._due is not None and free > 0:
                deadline = min(deadline, self._due)
            if self._duty_due is not None:
                deadline = min(deadline, self._duty_due)
            if deadline <= now:
                self._want_lease = True
                break
            if self._duty_due is not None and self._duty_due <= now:
                break
            self._wake.clear()
            ended = self._ended
            woken = await wait_event(self._wake, min(deadline - now, self.idle_poll)) or self._ended != ended
            if woken and time.monotonic() - polled < self.max_idle_sleep:
                continue  # (a local run's end moved the token: poll once runs stop ending)
            polled, current = time.monotonic(), self.store.change_token()
            if current != token:
                token = current
                self._want_lease = True
        return token

    async def drain(self) -> None:
        """Run every duty and invocation due now, in the foreground (``stepstone.testing``)."""
        env = self._env()
        while True:
            await self._duties()
            leased, _due, _duty = await self._lease(self.concurrency)
            if not leased:
                return
            await asyncio.gather(*(self.execute(item, env) for item in leased))
            for item in leased:
                self.presence.drop(item.run.id)

    def _env(self) -> ExecEnv:
        return ExecEnv(
            self.store,
            self.registry,
            self.clock,
            self.lease_owner,
            self.lease_ttl,
            self.threads,
            self.matcher,
            self.middleware,
            self.presence.live,
            self.abandoned,
            self.watched,
        )

    def _spawn(self, item: LeasedRun) -> None:
        task = asyncio.create_task(self._invoke(item, self._env()), name=f"stepstone-run-{item.run.id}")
        self.inflight[item.run.id] = task

    async def _invoke(self, item: LeasedRun, env: ExecEnv) -> None:
        outcome: Outcome | None = None
        try:
            outcome = await self.execute(item, env)
            self.invocations += 1
            if outcome is not None and outcome.status in ENDED_STATUSES:
                metrics.run_finished(item.run.function_id, outcome.status)
            if outcome is not None and outcome.wake_at is not None:
                self._learn_due(outcome.wake_at)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("run %s: invocation crashed; the lease will expire and it will resume", item.run.id)
        finally:
            # (After a lost lease, the slot may belong to a newer invocation of the run.)
            if self.inflight.get(item.run.id) is asyncio.current_task():
                del self.inflight[item.run.id]
                self.presence.drop(item.run.id)
            if self.on_run_end is not None:
                self.on_run_end(item.run.id, None if outcome is None else outcome.ended)
            if self._lease_after(item.run.function_id):
                self._want_lease = True
            self._ended += 1
            # Wake the idle loop only if this changed what it waits for (a pass, a due time, a free slot).
            if self._want_lease or outcome is None or outcome.wake_at is not None or self.slots.free() <= 1:
                self._poke()

    def _lease_after(self, function_id: str) -> bool:
        """Whether a run's end warrants a pass (no store wakes us then): the last
        pass filled its slots or left due work (another pass held it), or the
        function has rules (a concurrency key...) that hold queued runs."""
        fn, due = self.registry.get(function_id), self._due
        if self._more or (due is not None and due <= self.clock.now() + RECHECK):
            return True
        return fn is None or not fn.flow.starts_directly

    # -- presence: the registry row and the held leases (presence.py) ----------------------
    def _row(self, heartbeat_at: float) -> WorkerRow:
        return WorkerRow(
            id=self.id,
            app=self.app_name,
            app_version=self.app_version,
            concurrency=self.concurrency,
            started_at=self.started_at,
            heartbeat_at=heartbeat_at,
            functions=self._function_ids,
        )

    async def _heartbeat_once(self) -> None:
        """Every third of the lease TTL: the leases held extended, the row refreshed."""
        await asyncio.sleep(self.lease_ttl / 3)
        await self.presence.beat(list(self.inflight), self.inflight)


def _earliest(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    return a if b is None else min(a, b)
