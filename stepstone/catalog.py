"""Functions known to the whole database, not only to this process.

Every app writes a JSON description of its functions into the store. Any
process (an app that only sends, a worker of another app, the HTTP server
without user code) rebuilds those descriptions into definitions without
handlers, so that an event sent anywhere starts runs of every function it
triggers, with that function's flow control.

A retired function (one its app's current deploy no longer registers) is left
out: events stop starting runs of it. A process whose own code still has it
(an old worker in a rolling deploy) keeps matching it through its own registry.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from stepstone.errors import StoreUnavailableError
from stepstone.flow import build_flow, load_settings
from stepstone.function import Backoff, FunctionDef, validate_retries
from stepstone.registry import Registry
from stepstone.store.base import FunctionsTx, Store
from stepstone.triggers import Trigger, on_cron, on_event

log = logging.getLogger("stepstone.catalog")


def _remote_handler(ctx: Any) -> None:
    raise RuntimeError("this function's code lives in another process")


def rebuild(description: dict[str, Any]) -> FunctionDef:
    """A handler-less ``FunctionDef`` from ``FunctionDef.describe()`` output,
    its retries, back-off, triggers and flow control checked as decoration
    checks them (``ConfigError`` names the field), so a description from
    elsewhere (an app served over HTTP) is refused whole. (Ids are not checked
    here: an ``on_failure`` function's id may be longer than a user's.)"""
    triggers: list[Trigger] = []
    for raw in description.get("triggers", []):
        if "cron" in raw:
            triggers.append(on_cron(raw["cron"], jitter=raw.get("jitter")))
        else:
            triggers.append(on_event(raw["event"], if_=raw.get("if")))
    backoff = Backoff(**description["backoff"]) if description.get("backoff") else Backoff()
    flow = build_flow(load_settings(description))
    flow.check_triggers(tuple(triggers))
    fn = FunctionDef(
        id=description["id"],
        handler=_remote_handler,
        triggers=tuple(triggers),
        retries=validate_retries(description.get("retries", 4)),
        backoff=backoff.validated(),
        flow=flow,
        options={
            k: v for k, v in description.items() if k not in ("id", "triggers", "retries", "failure_of")
        },
    )
    fn.failure_of = description.get("failure_of")
    return fn


class Catalog:
    """This app's functions plus every function registered in the store and not
    retired, refreshed at most every ``ttl`` seconds."""

    def __init__(self, own: Registry, ttl: float = 2.0) -> None:
        self.own = own
        self.ttl = ttl
        self._merged: Registry | None = None
        self._own_ids: list[str] = []
        self._loaded_at = 0.0
        self._lock = threading.Lock()

    def registry(self, store: Store) -> Registry:
        with self._lock:
            fresh = time.monotonic() - self._loaded_at < self.ttl
            if self._merged is not None and fresh and self._own_ids is self.own.ids():
                return self._merged
            try:
                self._merged = self._load(store)
            except StoreUnavailableError:
                # The database is away: a worker ending a run keeps the catalog it
                # has rather than failing the run's last commit; retried next call.
                if self._merged is None or self._own_ids is not self.own.ids():
                    raise
                log.warning("function catalog not refreshed: the database is unavailable")
                self._loaded_at = time.monotonic()
                return self._merged
            self._own_ids = self.own.ids()
            self._loaded_at = time.monotonic()
            return self._merged

    def invalidate(self) -> None:
        with self._lock:
            self._merged = None

    def _load(self, store: Store) -> Registry:
        def op(tx: FunctionsTx) -> tuple[dict[str, tuple[str, str]], dict[str, float]]:
            return tx.load_functions(), tx.retired_functions()

        rows, retired = store.read_sync(op)
        merged = Registry()
        for fn in self.own:
            merged.add_definition(fn)
        for function_id, (_app, config) in sorted(rows.items()):
            if merged.get(function_id) is None and function_id not in retired:
                merged.add_definition(rebuild(json.loads(config)))
        return merged


RegistrySource = Callable[[], Registry]
