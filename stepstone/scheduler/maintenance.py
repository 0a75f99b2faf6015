"""Periodic duties any worker may perform: cron ticks and run timeouts.

Each duty is one transaction built here and run by the worker when its next
due time comes. Several workers may run them at once: a cron tick is claimed
by compare-and-set on the schedule's ``next_at`` (one run per tick), and a
timed-out run is ended by whoever gets there first (``end_run`` is idempotent).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from stepstone import serde
from stepstone.errors import ErrorInfo
from stepstone.events import Event
from stepstone.function import FunctionDef
from stepstone.ingest import prepare
from stepstone.lifecycle import end_run
from stepstone.registry import Registry
from stepstone.scheduler.admission import start_run
from stepstone.scheduler.cron import latest_tick, next_tick
from stepstone.store.base import Tx
from stepstone.store.rows import CANCELLED

CRON_EVENT = "stepstone/cron"


def register_crons_op(functions: Sequence[FunctionDef], now: float) -> Callable[[Tx], None]:
    """Create each schedule's row (first tick after ``now``) unless it exists."""
    def op(tx: Tx) -> None:
        for fn in functions:
            for trigger in fn.cron_triggers:
                tx.ensure_cron(fn.id, trigger.cron,
                               next_tick(trigger.expression, trigger.timezone, now))
    return op


def cron_op(functions: Sequence[FunctionDef], now: float, matcher: Registry) -> Callable[[Tx], int]:
    """Start one run per due schedule. After downtime only the latest missed tick
    runs (no storm); the next tick is computed from now."""
    by_id = {fn.id: fn for fn in functions}

    def op(tx: Tx) -> int:
        started = 0
        for function_id, schedule, expected in tx.due_crons(list(by_id), now):
            fn = by_id[function_id]
            trigger = next((t for t in fn.cron_triggers if t.cron == schedule), None)
            if trigger is None:
                continue
            tick = latest_tick(trigger.expression, trigger.timezone, now) or expected
            following = next_tick(trigger.expression, trigger.timezone, now)
            if not tx.advance_cron(function_id, schedule, expected, following):
                continue  # another worker claimed this tick
            moment = datetime.fromtimestamp(tick, UTC).isoformat()
            [event] = prepare(Event(CRON_EVENT, {"cron": schedule, "tick": moment},
                                    id=f"cron:{function_id}:{schedule}:{tick:.0f}",
                                    ts=int(tick * 1000)), now, system=True)
            if tx.claim_key(f"event:{event.id}", event.id, now + 86400, now) is not None:
                continue
            seq = tx.insert_event(event.id, event.name, event.data_json, event.ts, now)
            delay = random.uniform(0, trigger.jitter) if trigger.jitter else 0.0
            start_run(tx, fn, [(seq, event)], now, matcher, available_at=now + delay)
            started += 1
        return started
    return op


def timeouts_op(now: float, matcher: Registry) -> Callable[[Tx], int]:
    """Cancel runs queued past ``timeouts.start`` or running past ``timeouts.finish``
    (a run executing a step is cancelled at its next step boundary)."""
    def op(tx: Tx) -> int:
        handled = 0
        for item in tx.timed_out(now):
            limit = "start" if item.kind == "start" else "finish"
            reason = ErrorInfo("Timeout", f"the run exceeded timeouts.{limit}")
            # A held run is flagged (with the reason) in the statement that
            # checks the lease; the holder cancels it at its next boundary.
            if tx.flag_cancel(item.run_id, now, serde.dumps(reason.to_json(), what="error")):
                tx.clear_deadlines(item.run_id)
            else:
                run = tx.get_run(item.run_id)
                if run is not None:
                    end_run(tx, run, CANCELLED, None, reason, now, matcher)
            handled += 1
        return handled
    return op


def next_duty_op(cron_ids: Sequence[str]) -> Callable[[Tx], float | None]:
    def op(tx: Tx) -> float | None:
        times = [t for t in (tx.next_cron(cron_ids), tx.next_deadline()) if t is not None]
        return min(times) if times else None
    return op


__all__ = ["CRON_EVENT", "cron_op", "next_duty_op", "register_crons_op", "timeouts_op"]
