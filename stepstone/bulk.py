"""Bulk actions: ``app.runs.cancel_many/replay_many/resume_many``.

A bulk action walks the runs matching a filter page by page, newest first,
reading and acting on each page in one transaction, so an action over
thousands of runs never holds one long transaction and reports its progress
between pages. Each run is acted on by the same store operation as a single
action (``actions.py``, ``runtime.cancel_run``). ``Runs`` (``runs.py``)
mixes these plans in; the filters they share with ``app.runs.list`` are
here (``run_filter``), below it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from stepstone import serde
from stepstone.actions import replay_op, resume_op
from stepstone.bridge import Plan, async_face, sync_face
from stepstone.errors import ConfigError, InvalidStateError
from stepstone.expressions import Expression, compile_expression
from stepstone.registry import Registry
from stepstone.runtime import cancel_run
from stepstone.store.base import Tx
from stepstone.store.rows import ACTIVE_STATUSES, RUN_STATUSES, RunFilter, RunRow, RunStatus

T = TypeVar("T")
Moment = datetime | float | int
BULK_PAGE = 200
Progress = Callable[[int, int], Any]  # (runs acted on so far, runs examined so far)


@dataclass
class Bulk:
    """A bulk action walking the matching runs page by page, newest first; each
    page is read and acted on in one transaction."""

    where: RunFilter
    condition: Expression | None
    act: Callable[[Tx, RunRow], bool]
    done: int = 0
    examined: int = 0
    finished: bool = False

    def page_op(self) -> Callable[[Tx], None]:
        """The next page's operation. Run again after its transaction was
        rolled back (a retry, or a PostgreSQL group commit in which another
        operation failed), it acts on the same page and counts it once: it
        starts from the progress as it was when the page began."""
        where, done, examined = self.where, self.done, self.examined

        def op(tx: Tx) -> None:
            rows = tx.list_runs(where)
            acted = sum(1 for row in rows if self._matches(tx, row) and self.act(tx, row))
            self.done, self.examined = done + acted, examined + len(rows)
            self.finished = len(rows) < where.limit
            self.where = dataclasses.replace(where, before_id=rows[-1].id) if rows else where

        return op

    def _matches(self, tx: Tx, row: RunRow) -> bool:
        if self.condition is None:
            return True
        events = tx.get_events(row.id)
        first = events[0] if events else None
        variables = {
            "event": {"name": first.name, "data": serde.loads(first.data), "id": first.id, "ts": first.ts}
            if first
            else {}
        }
        return self.condition.test(variables)


def bulk_action(
    action: str,
    now: float,
    matcher: Registry,
    *,
    function_id: str | None,
    status: str | Sequence[str],
    since: Moment | None,
    until: Moment | None,
    if_: str | None,
) -> Bulk:
    """The bulk ``action`` (``cancel``, ``replay`` or ``resume``) over the runs
    matching the filters (``if_``: CEL over the run's ``event``)."""
    where = run_filter(function_id=function_id, status=status, since=since, until=until, limit=BULK_PAGE)
    condition = None if if_ is None else compile_expression(if_, field="if_")

    def cancel(tx: Tx, row: RunRow) -> bool:
        cancel_run(tx, row.id, now, matcher)  # at once, or at the run's next step boundary
        return True

    def replay(tx: Tx, row: RunRow) -> bool:
        try:
            replay_op(row.id, now)(tx)
        except InvalidStateError:
            return False  # its singleton key is held by another active run (checked before any write)
        return True

    def resume(tx: Tx, row: RunRow) -> bool:
        resume_op(row.id, now)(tx)
        return True

    acts = {"cancel": cancel, "replay": replay, "resume": resume}
    return Bulk(where, condition, acts[action])


class BulkActions:
    """The bulk plans of ``app.runs`` (mixed into ``Runs``, which supplies the
    three methods below)."""

    def _write(self, op: Callable[[Tx], T]) -> Plan[T]:
        """A transaction running ``op``, then local workers notified."""
        raise NotImplementedError

    def _now(self) -> float:
        raise NotImplementedError

    def _matcher(self) -> Registry:
        raise NotImplementedError

    def _cancel_many(
        self,
        *,
        function_id: str | None = None,
        since: Moment | None = None,
        until: Moment | None = None,
        if_: str | None = None,
        progress: Progress | None = None,
    ) -> Plan[int]:
        """Cancel every active run matching the filters (``if_`` is CEL over the
        run's ``event``); returns how many were cancelled or flagged."""
        bulk = bulk_action(
            "cancel",
            self._now(),
            self._matcher(),
            function_id=function_id,
            status=ACTIVE_STATUSES,
            since=since,
            until=until,
            if_=if_,
        )
        return (yield from self._drive(bulk, progress))

    def _replay_many(
        self,
        *,
        function_id: str | None = None,
        status: str | Sequence[str] = RunStatus.FAILED,
        since: Moment | None = None,
        until: Moment | None = None,
        if_: str | None = None,
        progress: Progress | None = None,
    ) -> Plan[int]:
        """Replay every failed (or ``status``: failed/cancelled) run matching the
        filters; returns how many were replayed."""
        bulk = bulk_action(
            "replay",
            self._now(),
            self._matcher(),
            function_id=function_id,
            status=_replayable(status),
            since=since,
            until=until,
            if_=if_,
        )
        return (yield from self._drive(bulk, progress))

    def _resume_many(
        self,
        *,
        function_id: str | None = None,
        since: Moment | None = None,
        until: Moment | None = None,
        if_: str | None = None,
        progress: Progress | None = None,
    ) -> Plan[int]:
        """Resume every paused run matching the filters; returns how many were resumed."""
        bulk = bulk_action(
            "resume",
            self._now(),
            self._matcher(),
            function_id=function_id,
            status=RunStatus.PAUSED,
            since=since,
            until=until,
            if_=if_,
        )
        return (yield from self._drive(bulk, progress))

    def _drive(self, bulk: Bulk, progress: Progress | None) -> Plan[int]:
        while not bulk.finished:
            yield from self._write(bulk.page_op())
            if progress is not None:
                progress(bulk.done, bulk.examined)
        return bulk.done

    cancel_many = sync_face(_cancel_many)
    cancel_many_async = async_face(_cancel_many)
    replay_many = sync_face(_replay_many)
    replay_many_async = async_face(_replay_many)
    resume_many = sync_face(_resume_many)
    resume_many_async = async_face(_resume_many)


def _replayable(status: str | Sequence[str]) -> tuple[str, ...]:
    statuses = (status,) if isinstance(status, str) else tuple(status)
    for item in statuses:
        if item not in (RunStatus.FAILED, RunStatus.CANCELLED):
            raise ConfigError("status", f"only failed or cancelled runs replay, not {item!r}")
    return statuses


# -- the filters of app.runs.list and of the bulk actions ------------------------------------
def _ts(value: Moment | None, field_name: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise ConfigError(field_name, f"expected a datetime or epoch seconds, got {value!r}")


def run_filter(
    *,
    function_id: str | None = None,
    event_id: str | None = None,
    status: str | Sequence[str] | None = None,
    since: Moment | None = None,
    until: Moment | None = None,
    limit: int = 100,
    before: str | None = None,
    app_version: str | None = None,
) -> RunFilter:
    """The store's ``RunFilter``, each argument checked (``ConfigError`` names it)."""
    statuses = (status,) if isinstance(status, str) else tuple(status or ())
    for item in statuses:
        if item not in RUN_STATUSES:
            raise ConfigError("status", f"unknown status {item!r}; one of {', '.join(RUN_STATUSES)}")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1000:
        raise ConfigError("limit", "must be an integer between 1 and 1000")
    lo, hi = _ts(since, "since"), _ts(until, "until")
    if lo is not None and hi is not None and lo > hi:
        raise ConfigError("since", "must not be after until")
    return RunFilter(
        function_id=function_id,
        statuses=statuses,
        event_id=event_id,
        since=lo,
        until=hi,
        limit=limit,
        before_id=before,
        app_version=app_version,
    )
