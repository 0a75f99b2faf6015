"""Periodic duties any worker may perform: cron ticks and run timeouts.

Each duty is one transaction built here and run by the worker when its next
due time comes. Several workers may run them at once: a cron tick is claimed
by compare-and-set on the schedule's ``next_at`` (one run per tick), and a
timed-out run is ended by whoever gets there first (``end_run`` is idempotent).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime

from stepstone import serde
from stepstone.errors import ErrorInfo
from stepstone.events import Event
from stepstone.function import FunctionDef
from stepstone.registry import Registry
from stepstone.runtime import end_run, prepare, start_run
from stepstone.scheduler.cron import latest_tick, next_tick
from stepstone.store.base import CronTx, Tx
from stepstone.store.rows import RunStatus

CRON_EVENT = "stepstone/cron"


STALE_SCHEDULE = 86400.0  # a schedule overdue this long has no live host


def schedules_of(functions: Iterable[FunctionDef]) -> list[tuple[str, str]]:
    """The ``(function id, schedule)`` pairs these definitions host."""
    return [(fn.id, trigger.cron) for fn in functions for trigger in fn.cron_triggers]


def register_crons_op(functions: Sequence[FunctionDef], now: float) -> Callable[[Tx], None]:
    """Create each schedule's row (first tick after ``now``) unless it exists, and
    delete the rows of these functions' other schedules once they are stale.

    Rows are keyed by (function, schedule text), so in a rolling deploy old and
    new workers each tick the schedules their code has. A schedule no deployed
    code has any more is ignored by everyone (duties look only at their own
    pairs) and removed here when it is ``STALE_SCHEDULE`` overdue: a live host
    advances its row as soon as it is due, so such a row has none.
    """
    hosted = set(schedules_of(functions))

    def op(tx: CronTx) -> None:
        for fn in functions:
            for trigger in fn.cron_triggers:
                tx.ensure_cron(fn.id, trigger.cron, next_tick(trigger.expression, trigger.timezone, now))
        for function_id, schedule, _next_at in tx.crons_of([fn.id for fn in functions]):
            if (function_id, schedule) not in hosted:
                tx.delete_stale_cron(function_id, schedule, now - STALE_SCHEDULE)

    return op


def cron_op(functions: Sequence[FunctionDef], now: float, matcher: Registry) -> Callable[[Tx], int]:
    """Start one run per due schedule. After downtime only the latest missed tick
    runs (no storm); the next tick is computed from now."""
    hosted = {(fn.id, trigger.cron): (fn, trigger) for fn in functions for trigger in fn.cron_triggers}

    def op(tx: Tx) -> int:
        started = 0
        for function_id, schedule, expected in tx.due_crons(list(hosted), now):
            fn, trigger = hosted[(function_id, schedule)]
            tick = latest_tick(trigger.expression, trigger.timezone, now) or expected
            following = next_tick(trigger.expression, trigger.timezone, now)
            if not tx.advance_cron(function_id, schedule, expected, following):
                continue  # another worker claimed this tick
            moment = datetime.fromtimestamp(tick, UTC).isoformat()
            [event] = prepare(
                Event(
                    CRON_EVENT,
                    {"cron": schedule, "tick": moment},
                    id=f"cron:{function_id}:{schedule}:{tick:.0f}",
                    ts=int(tick * 1000),
                ),
                now,
                system=True,
            )
            seq = tx.record_event(event.received(now), now + 86400)
            if seq is None:
                continue
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
            # A plain read: a lease pass may be starting the run right now. Look
            # again with the item locked (waiting for that pass) before acting.
            leased = tx.lock_lease(item.run_id, now)
            if leased and not item.leased and item.kind == "start":
                continue  # it started meanwhile (its lease cleared the start deadline)
            # A held run is flagged with the reason; its holder cancels it at its
            # next step boundary or park.
            if leased and tx.flag_cancel(item.run_id, now, serde.dumps(reason.to_json(), what="error")):
                tx.clear_deadlines(item.run_id)
            else:
                run = tx.get_run(item.run_id)
                if run is not None:
                    end_run(tx, run, RunStatus.CANCELLED, None, reason, now, matcher)
            handled += 1
        return handled

    return op


def next_duty_op(schedules: Sequence[tuple[str, str]]) -> Callable[[Tx], float | None]:
    """When the next duty is due: the earliest of the caller's own schedules
    (``(function id, schedule)`` pairs) and the earliest run deadline."""

    def op(tx: CronTx) -> float | None:
        return next_duty(tx, schedules, tx.next_deadline())

    return op


def next_duty(tx: CronTx, schedules: Sequence[tuple[str, str]], deadline: float | None) -> float | None:
    """``next_duty_op``'s answer given the earliest run deadline, already read
    (a lease pass reads it with its own next time, ``leasing.pass_times``, and
    takes the earlier of it and ``next_cron`` itself: ``Worker._lease``)."""
    times = [t for t in (tx.next_cron(schedules), deadline) if t is not None]
    return min(times) if times else None


__all__ = [
    "CRON_EVENT",
    "STALE_SCHEDULE",
    "cron_op",
    "next_duty",
    "next_duty_op",
    "register_crons_op",
    "schedules_of",
    "timeouts_op",
]
