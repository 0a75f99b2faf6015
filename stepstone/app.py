"""``ss.App``: the public face. Registers functions, sends events, manages runs
and hosts in-process workers."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import timedelta
from typing import Any, Literal, TypeVar

from stepstone import limits, serde
from stepstone.attempts import DEFAULT_MAX_ABANDONED
from stepstone.bridge import Plan, Portal, async_face, coroutine_call, sync_face
from stepstone.catalog import Catalog
from stepstone.checking import CheckReport, check_app
from stepstone.clock import SYSTEM_CLOCK, Clock, DatabaseClock, SystemClock
from stepstone.clocksync import sync_at_start
from stepstone.direct import SentHere, Taking, reserve
from stepstone.durations import Duration, parse_duration
from stepstone.errors import ConfigError
from stepstone.events import Event
from stepstone.flow import (
    Batch,
    CancelOn,
    Concurrency,
    Debounce,
    Priority,
    RateLimit,
    Singleton,
    Throttle,
    Timeouts,
    build_flow,
)
from stepstone.function import Backoff, FunctionDef, build_function, nondeterminism_policy
from stepstone.histories import from_json as history_from_json
from stepstone.middleware import Hooks, Middleware
from stepstone.registry import Registry
from stepstone.runs import Runs, read_call, write_call
from stepstone.runtime import Awaited, PreparedEvent, Sent, Survey, Surveyed, ingest, prepare, survey
from stepstone.sizes import Size
from stepstone.store import make_store
from stepstone.store.base import FunctionsTx, Store, Tx
from stepstone.store.rows import RunRead
from stepstone.store.viewrows import WorkerRow
from stepstone.triggers import Trigger
from stepstone.worker import Worker

F = TypeVar("F", bound=Callable[..., Any])
DEFAULT_DATABASE_URL = "sqlite:///.stepstone/stepstone.db"


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if callable(value):
        return getattr(value, "__qualname__", repr(value))
    return value


def _as_list(events: Event | Sequence[Event]) -> list[Event]:
    return [events] if isinstance(events, Event) else list(events)


class Workers:
    """``app.workers``: the registry of live workers."""

    def __init__(self, app: App) -> None:
        self._app = app

    def list(self, alive_within: float = 60.0) -> list[WorkerRow]:
        since = self._app.clock.now() - alive_within
        return self._app._store_ready().read_sync(lambda tx: tx.list_workers(since))


DEFAULT_RETENTION = "30d"


def _retention(value: Duration | None) -> float | None:
    if value is None:
        return None
    seconds = parse_duration(value, field="retention")
    if seconds <= 0:
        raise ConfigError("retention", f"expected a positive duration or None, got {value!r}")
    return seconds


class App:
    """A Stepstone application: its functions and the database they run on.

    ``database_url`` defaults to ``$STEPSTONE_DATABASE_URL`` or, without it,
    ``sqlite:///.stepstone/stepstone.db``. A real-time ``clock`` (the default,
    or any ``SystemClock``) is corrected to the database server's clock; any
    other clock is used as given. ``retention`` (default 30 days; ``None``
    keeps everything): ended runs older than that are deleted by the workers'
    periodic duties (``scheduler/retention.py``).
    """

    def __init__(
        self,
        name: str,
        database_url: str | None = None,
        *,
        app_version: str | None = None,
        middleware: Sequence[Middleware] = (),
        clock: Clock | None = None,
        on_nondeterminism: Literal["warn", "pause"] = "warn",
        retention: Duration | None = DEFAULT_RETENTION,
    ) -> None:
        if not isinstance(name, str) or not name.strip():
            raise ConfigError("name", "expected a non-empty app name")
        self.retention = _retention(retention)
        self.name = name
        self.database_url = database_url or os.environ.get("STEPSTONE_DATABASE_URL") or DEFAULT_DATABASE_URL
        self.app_version = app_version
        self.on_nondeterminism = nondeterminism_policy(on_nondeterminism)  # each function's default
        self.middleware = tuple(middleware)
        given = clock or SYSTEM_CLOCK
        self._clock: Clock = DatabaseClock(given) if isinstance(given, SystemClock) else given
        self.registry = Registry()
        self.catalog = Catalog(self.registry)
        self.runs = Runs(self)
        self.workers = Workers(self)
        self._store: Store | None = None
        self._lock = threading.RLock()
        self._surveyed = Surveyed()  # event names with many unindexed waits
        self._awaited = Awaited()  # event names a wait was on (sent the usual way)
        self._local_workers: list[Worker] = []
        self._watchers: dict[str, set[Callable[[RunRead | None], Any]]] = {}
        self._sent_here: SentHere | None = None  # the last send's runs, if it started them all here
        self._portal_: Portal | None = None

    # -- functions -------------------------------------------------------------------------
    def function(
        self,
        *,
        id: str,
        trigger: Trigger | list[Trigger] | None = None,
        retries: int = 4,
        backoff: Backoff | None = None,
        concurrency: Concurrency | Sequence[Concurrency] | None = None,
        throttle: Throttle | None = None,
        rate_limit: RateLimit | None = None,
        debounce: Debounce | None = None,
        priority: Priority | None = None,
        batch: Batch | None = None,
        idempotency: str | None = None,
        singleton: Singleton | None = None,
        cancel_on: CancelOn | Sequence[CancelOn] | None = None,
        timeouts: Timeouts | None = None,
        on_failure: Callable[..., Any] | None = None,
        middleware: Sequence[Any] = (),
        step_timeout: Duration | None = None,
        on_nondeterminism: Literal["warn", "pause"] | None = None,
        max_state: Size | None = limits.DEFAULT_MAX_STATE_BYTES,
    ) -> Callable[[F], F]:
        """Register a durable function; invalid options raise ``ConfigError`` here."""
        flow_options = {
            "concurrency": concurrency,
            "throttle": throttle,
            "rate_limit": rate_limit,
            "debounce": debounce,
            "priority": priority,
            "batch": batch,
            "idempotency": idempotency,
            "singleton": singleton,
            "cancel_on": cancel_on,
            "timeouts": timeouts,
        }
        flow = build_flow(flow_options)
        options = {
            k: _jsonable(v)
            for k, v in {
                "backoff": backoff,
                **flow_options,
                "on_failure": on_failure,
                "step_timeout": step_timeout,
                "on_nondeterminism": on_nondeterminism,
            }.items()
            if v is not None
        }
        if max_state != limits.DEFAULT_MAX_STATE_BYTES:
            options["max_state"] = max_state  # null: no cap

        def decorate(handler: F) -> F:
            fn = build_function(
                handler,
                id=id,
                trigger=trigger,
                retries=retries,
                backoff=backoff,
                on_failure=on_failure,
                middleware=middleware,
                flow=flow,
                options=options,
                step_timeout=step_timeout,
                on_nondeterminism=on_nondeterminism or self.on_nondeterminism,
                max_state=max_state,
            )
            with self._lock:
                self.registry.add(fn)
                try:
                    handler.__stepstone_id__ = fn.id  # type: ignore[attr-defined]
                except (AttributeError, TypeError):
                    pass  # e.g. a bound method: invoke it by id instead
                if self._store is not None:
                    self._register(self._store)
            return handler

        return decorate

    def get_function(self, function_id: str) -> FunctionDef | None:
        return self.registry.get(function_id)

    # -- clock and store -----------------------------------------------------------------------
    @property
    def clock(self) -> Clock:
        """The time every decision of this app is made on. A real-time clock is
        the database server's: reading it first opens the store, which measures
        the offset, so no time is ever taken from the uncorrected clock."""
        clock = self._clock
        if isinstance(clock, DatabaseClock) and not clock.synced:
            self._store_ready()
        return clock

    def _store_ready(self) -> Store:
        store = self._store
        if store is not None:
            return store
        with self._lock:
            if self._store is None:
                store = make_store(self.database_url)
                store.migrate()
                sync_at_start(store, self._clock)
                self._register(store)
                self._store = store
            return self._store

    def _register(self, store: Store, *, retire_others: bool = False) -> None:
        """Write this app's function descriptions to the store. A worker passes
        ``retire_others``: its code is a deploy of this app, so the functions the
        app registered before and no longer has are retired (see README,
        "Deploys")."""
        configs = {fn.id: serde.dumps(fn.describe(), what="function config") for fn in self.registry}
        name, now = self.name, self.clock.now()

        def op(tx: FunctionsTx) -> None:
            tx.register_functions(name, configs, now, retire_others=retire_others)

        store.transact_sync(op)

    def _rebind(self, database_url: str, clock: Clock, *_: Any) -> tuple[str, Clock]:
        """Point the app at another database and clock (``stepstone.testing``);
        returns the previous pair."""
        with self._lock:
            previous = (self.database_url, self._clock)
            if self._store is not None:
                self._store.close()
                self._store = None
            self.database_url, self._clock = database_url, clock
            self.catalog.invalidate()
            return previous

    @property
    def store(self) -> Store:
        return self._store_ready()

    # -- events --------------------------------------------------------------------------------
    def _send(self, events: Event | Sequence[Event]) -> Plan[list[str]]:
        """Record events and start the runs they trigger; returns the event ids.
        An event whose ``id`` was seen in the last 24 h starts nothing new."""
        hooks = Hooks(self.middleware) if self.middleware else None  # (none: nothing to look up)
        if hooks is not None and hooks.has("before_send_events"):
            events = yield coroutine_call(hooks.before_send_events(None, _as_list(events)), self._portal)
        store = self._store_ready()  # (opened: the clock below is the database's)
        began = time.monotonic()  # (before ``now``: a direct start's leases run from ``now``)
        now = self.clock.now()
        prepared = prepare(events, now)
        registry = self.catalog.registry(store)
        surveys: dict[str, Survey] = {}
        if any(self._surveyed.wanted(event.name) for event in prepared):  # many unindexed waits
            surveys = yield read_call(store, lambda tx: self._survey(tx, prepared, now))

        with self._lock:
            workers = list(self._local_workers)
        direct = reserve(workers, len(prepared), began)
        at_once = len(prepared) == 1 and not surveys and prepared[0].name not in self._awaited

        def op(tx: Tx) -> tuple[list[str], Taking, Sent]:
            sent = Sent() if direct is None else Sent(offer=direct.offer)
            ids = ingest(tx, prepared, registry, now, surveys, self._surveyed.learn, sent, at_once=at_once)
            return ids, (None, list) if direct is None else direct.take(tx, sent, now), sent

        try:
            done: tuple[list[str], Taking, Sent] = yield write_call(store, op)
            if self._awaited.learn(done[2]):  # nothing written (a wait is on its event): again
                at_once = False
                done = yield write_call(store, op)
            ids, (expected, taken), sent = done
            leased = taken()  # (PostgreSQL: the take's rows, read with the COMMIT)
            quiet = expected is not None and len(leased) == len(expected)
        except BaseException:
            if direct is not None:
                direct.give_back(now)
            raise
        if direct is not None:
            direct.hand_over(leased, now)
        self._sent_here = SentHere.of(direct, sent, leased, quiet)
        if not quiet:
            self._notify_workers()
        if hooks is not None and hooks.has("after_send_events"):
            yield coroutine_call(hooks.after_send_events(None, ids), self._portal)
        return ids

    def _survey(self, tx: Tx, prepared: Sequence[PreparedEvent], now: float) -> dict[str, Survey]:
        """Unindexed waits read and evaluated before a send's write transaction,
        for the events whose names have many (``runtime.waits.Surveyed``)."""
        found = {}
        for event in prepared:
            if self._surveyed.wanted(event.name):
                done = survey(tx, event.name, event.variables, now, self._surveyed.learn)
                if done is not None:
                    found[event.id] = done
        return found

    send = sync_face(_send)
    send_async = async_face(_send)

    # -- deploy safety -----------------------------------------------------------------------------
    def _check(
        self, function_id: str | None = None, histories: Sequence[Mapping[str, Any]] | None = None
    ) -> Plan[CheckReport]:
        """Replay in-flight runs (or exported ``histories``) against this code;
        executes no step, sleeps nothing, writes nothing (docs/versioning.md)."""
        if function_id is not None and self.registry.get(function_id) is None:
            raise ConfigError("function_id", f"this app has no function {function_id!r}")
        function_ids = [function_id] if function_id else [fn.id for fn in self.registry]
        parsed = None if histories is None else [history_from_json(h) for h in histories]
        with self._check_store(parsed is None) as store:
            body = check_app(self.registry, self.middleware, self._clock, store, function_ids, parsed)
            report: CheckReport = yield coroutine_call(body, self._portal)
        return report

    @contextlib.contextmanager
    def _check_store(self, needed: bool) -> Iterator[Callable[[], Store]]:
        """The store a check reads: the app's own if open, else one opened for the
        check alone (opening the app's would register this code's functions)."""
        if not needed or self._store is not None:
            yield self._store_ready
            return
        store = make_store(self.database_url)
        try:
            yield lambda: store
        finally:
            store.close()

    check = sync_face(_check)
    check_async = async_face(_check)

    # -- in-process notifications ------------------------------------------------------------------
    def _notify_workers(self) -> None:
        """Poke the local workers after a write, unless the store's commit did
        (a second poke would cost an empty lease pass per send)."""
        if self._store is not None and self._store.wakes_own_subscribers:
            return
        for worker in list(self._local_workers):
            worker.notify()

    def _watch(self, run_id: str, callback: Callable[[RunRead | None], Any]) -> None:
        """Call ``callback`` after each local invocation of the run until ``_unwatch``."""
        with self._lock:
            self._watchers.setdefault(run_id, set()).add(callback)

    def _unwatch(self, run_id: str, callback: Callable[[RunRead | None], Any]) -> None:
        with self._lock:
            callbacks = self._watchers.get(run_id)
            if callbacks is not None:
                callbacks.discard(callback)
                if not callbacks:
                    del self._watchers[run_id]

    def _run_changed(self, run_id: str, ended: RunRead | None = None, /) -> None:
        """A local worker's invocation of the run is over; ``ended``: the run as
        its end left it (asked for by ``_watched``; ``executor._finish``)."""
        callbacks = self._watchers.get(run_id)
        if callbacks:
            for callback in list(callbacks):
                callback(ended)

    def _watched(self, run_id: str) -> bool:
        return run_id in self._watchers

    def _held_here(self, run_id: str) -> bool:
        """Whether a local worker's invocation of the run is under way (then ``_run_changed`` follows)."""
        return any(run_id in worker.inflight for worker in list(self._local_workers))

    # -- workers -----------------------------------------------------------------------------------
    def worker(
        self,
        *,
        concurrency: int = 10,
        instance_id: str | None = None,
        lease_ttl: float = 15.0,
        max_abandoned_threads: int = DEFAULT_MAX_ABANDONED,
    ) -> Worker:
        """A worker for this app's functions (not started). Creating it retires the
        functions this app registered before and no longer has."""
        store = self._store_ready()
        self._register(store, retire_others=True)
        worker = Worker(
            store=store,
            registry=self.registry,
            clock=self.clock,
            app_name=self.name,
            app_version=self.app_version,
            concurrency=concurrency,
            instance_id=instance_id,
            lease_ttl=lease_ttl,
            on_run_end=self._run_changed,
            matcher=lambda: self.catalog.registry(self._store_ready()),
            middleware=self.middleware,
            max_abandoned_threads=max_abandoned_threads,
            retention=self.retention,
        )
        worker.watched = self._watched
        return worker

    async def start_async(
        self,
        *,
        concurrency: int = 10,
        instance_id: str | None = None,
        lease_ttl: float = 15.0,
        max_abandoned_threads: int = DEFAULT_MAX_ABANDONED,
    ) -> Worker:
        """Start a worker on the running event loop (``max_abandoned_threads``: how
        many sync steps abandoned past their timeout may still run before it
        stops leasing and reports not ready)."""
        worker = self.worker(
            concurrency=concurrency,
            instance_id=instance_id,
            lease_ttl=lease_ttl,
            max_abandoned_threads=max_abandoned_threads,
        )
        await worker.start()
        with self._lock:
            self._local_workers.append(worker)
        return worker

    async def stop_async(self, drain_timeout: float = 30.0) -> None:
        """Drain and stop the workers started on this loop."""
        loop = asyncio.get_running_loop()
        with self._lock:
            mine = [w for w in self._local_workers if w.loop is loop]
            for worker in mine:
                self._local_workers.remove(worker)
        await asyncio.gather(*(w.stop(drain_timeout) for w in mine))

    def start(
        self,
        *,
        concurrency: int = 10,
        instance_id: str | None = None,
        lease_ttl: float = 15.0,
        max_abandoned_threads: int = DEFAULT_MAX_ABANDONED,
    ) -> None:
        """Start workers in a background thread of this process."""
        self._portal().call(
            self.start_async(
                concurrency=concurrency,
                instance_id=instance_id,
                lease_ttl=lease_ttl,
                max_abandoned_threads=max_abandoned_threads,
            )
        )

    def stop(self, drain_timeout: float = 30.0) -> None:
        """Drain the background workers (in-flight steps finish) and stop them."""
        with self._lock:
            portal = self._portal_
        if portal is not None:
            portal.call(self.stop_async(drain_timeout))

    def _portal(self) -> Portal:
        """The event loop thread of this app's synchronous calls: the workers
        ``start`` runs and ``send``'s middleware hooks. Made on first use,
        closed by ``close``."""
        with self._lock:
            if self._portal_ is None:
                self._portal_ = Portal("stepstone-loop")
            return self._portal_

    def close(self) -> None:
        self.stop()
        with self._lock:
            portal, self._portal_ = self._portal_, None
        if portal is not None:
            portal.close()
        with self._lock:
            if self._store is not None:
                self._store.close()
                self._store = None

    def __enter__(self) -> App:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
