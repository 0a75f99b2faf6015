"""Reading and managing runs: ``app.runs.get/list/wait/cancel/replay/resume/rerun_from``
(the bulk actions, ``cancel_many``..., are mixed in from ``bulk.py``).

Every operation is a store operation built once (``_*_op``), submitted by one
plan (``Runs._get``...) from which the blocking method and its ``_async`` twin
are derived (``bridge.sync_face``/``async_face``).
"""

from __future__ import annotations

import builtins
import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from stepstone import histories, mailbox, serde
from stepstone.actions import cancel_op, replay_op, rerun_op, resume_op
from stepstone.bridge import Call, Plan, Wakeup, async_face, coroutine_call, sync_face
from stepstone.bulk import BulkActions, Moment, run_filter
from stepstone.durations import Duration, parse_duration
from stepstone.errors import ErrorInfo, NotFoundError, RunTimeoutError
from stepstone.events import Event
from stepstone.ids import new_id
from stepstone.middleware import Hooks
from stepstone.registry import Registry
from stepstone.store.base import RunsTx, Store, Tx
from stepstone.store.rows import (
    ENDED_STATUSES,
    RunFilter,
    RunHistory,
    RunRead,
    RunRow,
    RunStatus,
    SignalRow,
    SpanRow,
    StepKind,
    StepRow,
    StepStatus,
    filled,
)

if TYPE_CHECKING:
    from stepstone.app import App

T = TypeVar("T")
LOCAL_POLL = 0.1  # seconds before runs.wait first polls again when workers run in this process


def _dt(ts: float | None) -> datetime | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC)


@dataclass(frozen=True)
class StepRecord:
    id: str
    status: str
    attempts: int
    output: Any
    error: ErrorInfo | None
    kind: str = "run"
    started_at: datetime | None = None
    ended_at: datetime | None = None


@dataclass(frozen=True)
class Span:
    """One entry of a run's trace. A step span's ``attempt`` is its number from 1
    (``ctx.attempt + 1``), counted again from 1 after a replay; other spans' is 0
    (the run's: its invocation attempt)."""

    kind: str
    name: str
    status: str
    attempt: int
    started_at: datetime
    ended_at: datetime | None
    error: ErrorInfo | None
    detail: Any

    @property
    def duration(self) -> float | None:
        return None if self.ended_at is None else (self.ended_at - self.started_at).total_seconds()


@dataclass(frozen=True)
class Run:
    id: str
    function_id: str
    status: str
    output: Any
    error: ErrorInfo | None
    event_ids: list[str]
    created_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
    steps: list[StepRecord] = field(default_factory=list)
    attempt: int = 0
    meta: dict[str, Any] = field(default_factory=dict)
    app_version: str | None = None  #: the version of the app whose worker last ran it

    @property
    def ended(self) -> bool:
        return self.status in ENDED_STATUSES


def _error(text: str | None) -> ErrorInfo | None:
    return None if text is None else ErrorInfo.from_json(serde.loads(text))


def _step_record(row: StepRow) -> StepRecord:
    return filled(
        StepRecord,
        id=row.step_id,
        status=row.status,
        attempts=row.attempts,
        output=serde.loads(row.output),
        error=_error(row.error),
        kind=row.kind,
        started_at=_dt(row.started_at),
        ended_at=_dt(row.ended_at),
    )


def to_run(row: RunRow, steps: list[StepRow]) -> Run:
    return filled(
        Run,
        id=row.id,
        function_id=row.function_id,
        status=row.status,
        output=serde.loads(row.output),
        error=_error(row.error),
        event_ids=row.event_ids,
        created_at=_dt(row.created_at) or datetime.now(UTC),
        started_at=_dt(row.started_at),
        ended_at=_dt(row.ended_at),
        steps=[_step_record(s) for s in steps],
        attempt=row.attempt,
        meta=serde.loads(row.meta) or {},
        app_version=row.app_version,
    )


def _to_span(row: SpanRow) -> Span:
    return Span(
        kind=row.kind,
        name=row.name,
        status=row.status,
        attempt=row.attempt + 1 if row.kind == "step" else row.attempt,  # stored as ctx.attempt
        started_at=_dt(row.started_at) or datetime.now(UTC),
        ended_at=_dt(row.ended_at),
        error=ErrorInfo.from_json(serde.loads(row.error)),
        detail=serde.loads(row.detail) if row.detail and row.detail[:1] in '{["' else row.detail,
    )


# -- operations ------------------------------------------------------------------------------


def _run_row(tx: RunsTx, run_id: str) -> RunRow:
    return _found(tx.get_run(run_id), run_id)


def _found(row: RunRow | None, run_id: str) -> RunRow:
    if row is None:
        raise NotFoundError(f"no run {run_id!r}")
    return row


def _get_op(run_id: str) -> Callable[[Tx], Run]:
    def op(tx: RunsTx) -> Run:
        return to_run(_run_row(tx, run_id), tx.get_steps(run_id))

    return op


def _ended_op(run_id: str) -> Callable[[Tx], Run | str]:
    """What ``runs.wait`` reads: the run with its steps once it has ended;
    before, only its status (its steps are not read nor decoded)."""

    def op(tx: RunsTx) -> Run | str:
        return _seen(tx.ended_run(run_id), run_id)

    return op


def _seen(read: RunRead, run_id: str) -> Run | str:
    """The run once it has ended, else its status (``RunsTx.ended_run``'s read)."""
    row, steps = read
    run = _found(row, run_id)
    return run.status if steps is None else to_run(run, steps)


def _export_op(run_id: str) -> Callable[[Tx], dict[str, Any]]:
    def op(tx: Tx) -> dict[str, Any]:
        row = _run_row(tx, run_id)
        history = RunHistory(run=row, events=tx.get_events(run_id), steps=tx.get_steps(run_id))
        return histories.to_json(history)

    return op


def _list_op(where: RunFilter) -> Callable[[Tx], list[Run]]:
    def op(tx: RunsTx) -> list[Run]:
        rows, steps = tx.runs_page(where)  # one round trip, however many runs
        return [to_run(row, steps[row.id]) for row in rows]

    return op


def _trace_op(run_id: str) -> Callable[[Tx], list[Span]]:
    """The trace: stored spans (retried attempts, warnings, operator actions) plus
    the final state of every step, plus the run's time in the queue."""

    def op(tx: RunsTx) -> list[Span]:
        run = _run_row(tx, run_id)
        spans = [_to_span(s) for s in tx.get_spans(run_id)]
        # a step waiting for its retry is already traced by its failed attempts
        spans.extend(
            _step_span(step)
            for step in tx.get_steps(run_id)
            if step.started_at is not None and step.status != StepStatus.RETRYING
        )
        created = _dt(run.created_at) or datetime.now(UTC)
        spans.append(
            Span(
                "queued",
                "queue",
                "done" if run.started_at else "waiting",
                0,
                created,
                _dt(run.started_at),
                None,
                None,
            )
        )
        spans.append(
            Span(
                "run",
                run.function_id,
                run.status,
                run.attempt,
                created,
                _dt(run.ended_at),
                ErrorInfo.from_json(serde.loads(run.error)),
                None,
            )
        )
        spans.sort(key=lambda s: (s.started_at, _SPAN_ORDER.get(s.kind, 2)))
        return spans

    return op


_STEP_SPAN_KIND = {StepKind.RUN: "step", StepKind.TRANSACTION: "step"}  # steps with attempts
_SPAN_ORDER = {"run": 0, "queued": 1}


def _step_span(row: StepRow) -> Span:
    started = _dt(row.started_at) or datetime.now(UTC)
    return Span(
        kind=_STEP_SPAN_KIND.get(row.kind, row.kind),
        name=row.step_id,
        status=row.status,
        attempt=max(1, row.attempts) if row.kind in _STEP_SPAN_KIND else 0,
        started_at=started,
        ended_at=_dt(row.ended_at),
        error=ErrorInfo.from_json(serde.loads(row.error)) if row.status == StepStatus.FAILED else None,
        detail={"wake_at": row.wake_at} if row.wake_at is not None else None,
    )


def read_call(store: Store, op: Callable[[Tx], T]) -> Call[T]:
    """A plan's read of ``op`` in one snapshot."""
    return Call(lambda: store.read_sync(op), lambda: store.read(op))


def write_call(store: Store, op: Callable[[Tx], T]) -> Call[T]:
    """A plan's transaction running ``op``."""
    return Call(lambda: store.transact_sync(op), lambda: store.transact(op))


class Runs(BulkActions):
    """``app.runs``. Each operation is written once, as a plan (``bridge``);
    its blocking method and its ``_async`` twin are derived from it."""

    def __init__(self, app: App) -> None:
        self._app = app

    def _read(self, op: Callable[[Tx], T]) -> Call[T]:
        return read_call(self._app._store_ready(), op)

    def _write(self, op: Callable[[Tx], T]) -> Plan[T]:
        result: T = yield write_call(self._app._store_ready(), op)
        self._app._notify_workers()
        return result

    def _now(self) -> float:
        return self._app.clock.now()

    def _matcher(self) -> Registry:
        return self._app.catalog.registry(self._app._store_ready())

    # -- reading -----------------------------------------------------------------------
    def _get(self, run_id: str) -> Plan[Run]:
        """The run with its steps; ``NotFoundError`` if there is none."""
        run: Run = yield self._read(_get_op(run_id))
        return run

    def _export(self, run_id: str) -> Plan[dict[str, Any]]:
        """The run's history as a JSON-serialisable document (``app.check(histories=...)``)."""
        doc: dict[str, Any] = yield self._read(_export_op(run_id))
        return doc

    def _list(
        self,
        *,
        function_id: str | None = None,
        event_id: str | None = None,
        status: str | Sequence[str] | None = None,
        since: Moment | None = None,
        until: Moment | None = None,
        limit: int = 100,
        before: str | None = None,
        app_version: str | None = None,
    ) -> Plan[builtins.list[Run]]:
        """Newest first, at most ``limit`` (1 to 1000) runs; ``status`` one or several
        run statuses, ``since``/``until`` bounds on the creation time, ``before`` a
        run id (the last of the previous page), ``app_version`` the version of the
        app that last ran them."""
        where = run_filter(
            function_id=function_id,
            event_id=event_id,
            status=status,
            since=since,
            until=until,
            limit=limit,
            before=before,
            app_version=app_version,
        )
        here = self._app._sent_here  # (a list by event right after this app's send)
        listed = None if here is None else here.listed(where)
        if listed is not None:
            return [to_run(row, []) for row in listed]  # (new runs: no steps yet)
        runs: builtins.list[Run] = yield self._read(_list_op(where))
        return runs

    def _trace(self, run_id: str) -> Plan[builtins.list[Span]]:
        """Every step attempt, sleep, wait and warning of the run, in order."""
        spans: builtins.list[Span] = yield self._read(_trace_op(run_id))
        return spans

    # -- acting --------------------------------------------------------------------------
    def _cancel(self, run_id: str) -> Plan[str]:
        """Cancel a run; a run executing a step ends after that step. Returns its status."""
        return (yield from self._write(cancel_op(run_id, self._now(), self._matcher())))

    def _replay(self, run_id: str) -> Plan[None]:
        """Resume a failed or cancelled run from its last successful step."""
        yield from self._write(replay_op(run_id, self._now()))

    def _resume(self, run_id: str) -> Plan[None]:
        """Continue a paused run under the code deployed now (``InvalidStateError``
        if it is not paused)."""
        yield from self._write(resume_op(run_id, self._now()))

    def _rerun_from(self, run_id: str, step_id: str, event_data: dict[str, Any] | None = None) -> Plan[str]:
        """Fork a new run that keeps the steps before ``step_id`` and re-executes from it;
        with ``event_data``, the new run's event carries that data instead (a new event
        row: the original event is left unchanged)."""
        return (yield from self._write(rerun_op(run_id, step_id, self._now(), event_data)))

    def _signal(self, run_id: str, name: str, data: Any = None) -> Plan[str]:
        """Send signal ``name`` with JSON ``data`` to an active run (``mailbox``):
        delivered to its ``wait_for_signal(name)``, now or when that wait begins,
        exactly once, in the order sent. Returns the signal's id;
        ``InvalidStateError`` if the run ended, ``NotFoundError`` if there is none."""
        hooks = Hooks(self._app.middleware)
        if hooks.has("before_send_events") and isinstance(data, dict):  # encrypted as event data is
            sealed = hooks.before_send_events(None, [Event(name, data)])
            data = (yield coroutine_call(sealed, self._app._portal))[0].data
        now = self._now()
        encoded = mailbox.encode(name, data)
        signal = SignalRow(id=new_id(now), run_id=run_id, name=name, data=encoded, sent_at=now)
        return (yield from self._write(lambda tx: mailbox.send(tx, signal)))

    # -- waiting -------------------------------------------------------------------------
    def _wait(self, run_id: str, timeout: Duration = "30s") -> Plan[Run]:
        """Wait until the run ends; ``RunTimeoutError`` (a ``TimeoutError``) if not."""
        waiter = _Waiter(run_id, timeout, local=bool(self._app._local_workers))
        told = _Told()
        self._app._watch(run_id, told)
        try:
            # A run a local worker holds tells its end (``_run_changed``), as the
            # end left it: then nothing is read here.
            held = self._app._held_here(run_id)
            while True:
                ended, told.ended = told.ended, None
                seen: Run | str
                if ended is not None:
                    seen = _seen(ended, run_id)
                elif held and not waiter.expired():
                    seen = RunStatus.RUNNING
                else:
                    seen = yield self._read(_ended_op(run_id))
                pause = waiter.check(seen)
                if isinstance(pause, Run):
                    return pause
                held = False  # polled from now on, as for a run held elsewhere
                yield told.wakeup.wait(pause)
        finally:
            self._app._unwatch(run_id, told)

    get = sync_face(_get)
    get_async = async_face(_get)
    export = sync_face(_export)
    export_async = async_face(_export)
    list = sync_face(_list)
    list_async = async_face(_list)
    trace = sync_face(_trace)
    trace_async = async_face(_trace)
    cancel = sync_face(_cancel)
    cancel_async = async_face(_cancel)
    replay = sync_face(_replay)
    replay_async = async_face(_replay)
    resume = sync_face(_resume)
    resume_async = async_face(_resume)
    rerun_from = sync_face(_rerun_from)
    rerun_from_async = async_face(_rerun_from)
    signal = sync_face(_signal)
    signal_async = async_face(_signal)
    wait = sync_face(_wait)
    wait_async = async_face(_wait)


class _Told:
    """A waiter's watch (``App._watch``): woken after each local invocation
    of the run, with the run as its end left it when the invocation ended it."""

    def __init__(self) -> None:
        self.wakeup = Wakeup()
        self.ended: RunRead | None = None

    def __call__(self, ended: RunRead | None) -> None:
        if ended is not None:
            self.ended = ended
        self.wakeup.set()


@functools.lru_cache(maxsize=64, typed=True)
def _seconds(timeout: Duration) -> float:
    """``runs.wait``'s time-out in seconds: most callers pass the same few."""
    return parse_duration(timeout, field="timeout")


class _Waiter:
    """Deadline and poll interval of ``runs.wait``: in-process runs signal their end;
    runs finished by other processes are noticed by polling (2 ms, doubling to 250 ms).
    With workers in this process the run usually ends there, so polling starts
    at 100 ms: each poll is a read (four round trips on PostgreSQL) that competes
    with the run it waits for."""

    def __init__(self, run_id: str, timeout: Duration, *, local: bool = False) -> None:
        self.run_id = run_id
        self.timeout = timeout
        self.deadline = time.monotonic() + _seconds(timeout)
        self.interval = LOCAL_POLL if local else 0.002

    def expired(self) -> bool:
        return time.monotonic() >= self.deadline

    def check(self, seen: Run | str) -> Run | float:
        """The run once it has ended (``_ended_op``), else how long to wait before reading again."""
        if isinstance(seen, Run):
            return seen
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise RunTimeoutError(f"run {self.run_id} still {seen} after {self.timeout}")
        pause = min(self.interval, remaining)
        self.interval = min(self.interval * 2, 0.25)
        return pause
