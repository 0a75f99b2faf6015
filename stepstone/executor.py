"""Runs one invocation of a leased run: replay, execute, checkpoint, decide next.

The invocation ends in exactly one final write, committed together with the
last staged step: the run completes, fails, is cancelled, or is parked until
its next wake-up (a sleep, a retry back-off, a wait).
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Protocol, overload

from stepstone import limits, serde
from stepstone.attempts import AbandonedThreads, in_pool
from stepstone.clock import Clock
from stepstone.context import Context
from stepstone.effectops import BoundEffect, prepared_send, realize
from stepstone.errors import (
    ErrorInfo,
    NonRetriableError,
    RetryAfterError,
    StepError,
    StepstoneError,
)
from stepstone.events import Event
from stepstone.function import FunctionDef, OnNondeterminism
from stepstone.interpreter import Interpreter
from stepstone.journal import RunJournal
from stepstone.middleware import Hooks, Middleware
from stepstone.registry import Registry
from stepstone.runstate import MemoSource, StoreMemos
from stepstone.runtime import end_run, park_run, stored_error
from stepstone.runtime.waits import build_wait
from stepstone.services import Journal, Services
from stepstone.signals import CancelSignal, LeaseLostSignal, PauseSignal, error_info, retry_at
from stepstone.steps import AsyncStep, SyncStep
from stepstone.store.base import Store, Tx
from stepstone.store.rows import (
    ENDED_STATUSES,
    EventRow,
    Fence,
    LeasedRun,
    RunRead,
    RunStatus,
    SpanRow,
    StepStatus,
    WaitKind,
    WaitRow,
)
from stepstone.wire import Decision, EffectRecord, SendEvents

log = logging.getLogger("stepstone.executor")
user_log = logging.getLogger("stepstone.run")


class HostServices:
    """The interpreter's ``Services`` over a host's functions: a worker's
    (``ExecEnv``) and an HTTP endpoint's share them, so an effect is built,
    encoded and checked the same way wherever its step ran."""

    registry: Registry
    matcher: Callable[[], Registry]

    def function(self, ref: str | Callable[..., Any]) -> FunctionDef | None:
        """A function by id or by its decorated handler (own first, then ``matcher``)."""
        function_id = ref if isinstance(ref, str) else getattr(ref, "__stepstone_id__", None)
        if function_id is None:
            return None
        return self.registry.get(function_id) or self.matcher().get(function_id)

    # The effects of orchestration steps (the interpreter's ``Services``).
    def wait_row(
        self,
        *,
        run_id: str,
        step_id: str,
        event_name: str,
        condition: str | None,
        run_event: dict[str, Any] | None,
        now: float,
        expires_at: float | None,
    ) -> WaitRow:
        return build_wait(
            run_id=run_id,
            step_id=step_id,
            kind=WaitKind.EVENT,
            event_name=event_name,
            condition=condition,
            run_event=run_event,
            now=now,
            expires_at=expires_at,
            field="if_",
        )

    def send(self, events: Event | Sequence[Event], now: float) -> SendEvents:
        return prepared_send([events] if isinstance(events, Event) else list(events), now)

    def effect(self, record: EffectRecord) -> BoundEffect:
        return realize(record, self.function, self.matcher)


@dataclass
class ExecEnv(HostServices):
    """What the executor needs from the worker that hosts it."""

    store: Store
    registry: Registry
    clock: Clock
    owner: str
    lease_ttl: float
    threads: Executor
    matcher: Callable[[], Registry]
    middleware: tuple[Middleware, ...] = ()
    # Whether the worker's lease on a run is still known to be live (by the
    # worker's own monotonic clock since the lease was last taken or extended).
    lease_held: Callable[[str], bool] = lambda run_id: True
    # The worker's count of sync step threads abandoned past their timeout.
    abandoned: AbandonedThreads = field(default_factory=AbandonedThreads)
    # Whether a caller in this process waits for the run's end (``runs.wait``):
    # the end then tells it the run (``Outcome.ended``: as the end wrote it, or
    # read back by the end's transaction).
    watched: Callable[[str], bool] = lambda run_id: False

    def memos(self, leased: LeasedRun) -> MemoSource:
        """The lease carries the step index; outputs are read a page at a time."""
        return StoreMemos(self.store, leased.run.id, leased.steps, leased.output_bytes)


@dataclass(frozen=True)
class Outcome:
    status: RunStatus
    wake_at: float | None = None
    error: ErrorInfo | None = None
    ended: RunRead | None = None  # the run as its end's transaction left it (if watched)


def _event(row: EventRow) -> Event:
    return Event(row.name, serde.loads(row.data), row.id, row.ts)


def _events(leased: LeasedRun) -> list[Event]:
    return [_event(e) for e in leased.events]


class _StoredEvents(Sequence[Event]):
    """A run's events, each decoded when read: a run's end reads its first one
    only if it publishes a ``stepstone/function.*`` event, which most completed
    runs do not. (Not the handler's decoded copies: the handler may have
    changed them.)"""

    def __init__(self, rows: list[EventRow]) -> None:
        self._rows = rows

    def __len__(self) -> int:
        return len(self._rows)

    @overload
    def __getitem__(self, index: int) -> Event: ...

    @overload
    def __getitem__(self, index: slice) -> list[Event]: ...

    def __getitem__(self, index: int | slice) -> Event | list[Event]:
        if isinstance(index, slice):
            return [_event(row) for row in self._rows[index]]
        return _event(self._rows[index])


Invoke = Callable[[FunctionDef, LeasedRun, RunJournal, ExecEnv], Awaitable[Outcome | None]]


async def execute(leased: LeasedRun, env: ExecEnv, invoke: Invoke | None = None) -> Outcome | None:
    """Run one invocation; returns its outcome, or ``None`` if the lease was lost.
    ``invoke`` runs the handler (default: here; ``pusher.py``: over HTTP)."""
    run = leased.run
    fn = env.registry.get(run.function_id)
    fence = Fence(run_id=run.id, owner=env.owner, epoch=leased.epoch, token=os.urandom(8).hex())
    # A run with no steps yet that a caller here waits for: its end may tell the
    # waiter the run from what this invocation wrote (``_finish``).
    told = not leased.steps and env.watched(run.id)
    journal = RunJournal(env.store, fence, env.clock, held=lambda: env.lease_held(run.id), keep_written=told)
    journal.function_id = run.function_id
    try:
        if fn is None:
            err = ErrorInfo("UnknownFunction", f"no function {run.function_id!r} in this worker")
            return await _finish(journal, env, leased, RunStatus.FAILED, None, err)
        if leased.cancel_requested:
            return await _finish(journal, env, leased, RunStatus.CANCELLED, None, None)
        if leased.start_deadline is not None and leased.start_deadline <= env.clock.now():
            err = ErrorInfo("Timeout", "the run did not start within timeouts.start")
            return await _finish(journal, env, leased, RunStatus.CANCELLED, None, err)
        return await (invoke or _invoke)(fn, leased, journal, env)
    except LeaseLostSignal:
        log.warning("run %s: lease lost; another worker owns it now", run.id)
        return None


class StagingJournal(Journal, Protocol):
    """The interpreter's ``Journal`` as the executor drives it: a worker's
    ``RunJournal`` (commits as it goes) or an endpoint's (stages everything
    for the server's commit)."""

    spans: list[SpanRow]
    lease_lost: bool
    cancel_requested: bool

    def bind(self, interp: Interpreter) -> None:
        """The interpreter staging into this journal (an endpoint's pauses it)."""
        ...


class HandlerHost(Services, Protocol):
    """What running a handler needs from its host: a worker's ``ExecEnv``, or
    an HTTP endpoint serving the function (``endpoint_invoke.py``)."""

    clock: Clock
    threads: Executor
    middleware: tuple[Middleware, ...]
    abandoned: AbandonedThreads

    def memos(self, leased: LeasedRun) -> MemoSource:
        """Where the replay reads the outputs of ``leased``'s recorded steps."""
        ...


@dataclass(frozen=True)
class Handled:
    """One call of a handler: its decision, and what the failure hook needs."""

    decision: Decision
    ctx: Context
    hooks: Hooks


async def _invoke(fn: FunctionDef, leased: LeasedRun, journal: RunJournal, env: ExecEnv) -> Outcome | None:
    handled = await run_handler(fn, leased, journal, env)
    result = await settle(handled.decision, leased, journal, env)
    await failure_hook(handled, result.status)
    return result


async def failure_hook(handled: Handled, status: RunStatus) -> None:
    if status == RunStatus.FAILED and handled.hooks.has("on_failure"):
        await handled.hooks.on_failure(
            handled.ctx, handled.decision.error or ErrorInfo("Error", "the run failed")
        )


async def run_handler(
    fn: FunctionDef, leased: LeasedRun, journal: StagingJournal, host: HandlerHost
) -> Handled:
    """Replay and execute the handler once, staging into ``journal``; returns
    how the invocation ends (raises ``LeaseLostSignal`` if a commit was fenced out)."""
    events = _events(leased)
    hooks = Hooks((*host.middleware, *fn.middleware))
    interp = Interpreter(
        run_id=leased.run.id,
        steps=leased.steps,
        journal=journal,
        clock=host.clock,
        retries=fn.retries,
        backoff=fn.backoff,
        threads=host.threads,
        services=host,
        run_event=events[0].to_json() if events else None,
        hooks=hooks,
        step_timeout=fn.step_timeout,
        abandoned=host.abandoned,
        pause_on_divergence=fn.on_nondeterminism == OnNondeterminism.PAUSE,
        memos=host.memos(leased),
        max_state=fn.max_state,
    )
    journal.bind(interp)
    ctx = _context(fn, leased, events, interp)
    try:
        if hooks.active and hooks.has("transform_input"):  # handed every recorded value: read them all now
            interp.memo_values = await hooks.transform_input(ctx, await interp.recorded_values())
        output = await _call_handler(fn, ctx, interp, host.threads)
        outcome: tuple[str, Any] = ("return", output)
    except (PauseSignal, CancelSignal, LeaseLostSignal) as signal:
        outcome = ("signal", signal)
    except Exception as exc:  # noqa: BLE001 - the handler's failure decides the run's fate
        outcome = ("error", exc)
    await interp.settle()
    if hooks.active:
        if not interp.replaying:  # new code ran, even if it only reached a new sleep
            await hooks.before_execution(ctx)
        await hooks.after_execution(ctx)
    try:
        decision = await _decide(outcome, fn, leased, interp, journal, host.clock)
    finally:
        interp.ctx = None  # the context holds the interpreter: freed with it, not by the collector
    return Handled(decision, ctx, hooks)


def _context(fn: FunctionDef, leased: LeasedRun, events: list[Event], interp: Interpreter) -> Context:
    loop = asyncio.get_running_loop()
    error = failed_run = None
    if fn.failure_of is not None:
        data = events[0].data
        error = ErrorInfo.from_json(data.get("error"))
        failed_run = data.get("run_id")
        events = [Event.from_json(data["event"])] if data.get("event") else events
    step: AsyncStep | SyncStep = AsyncStep(interp) if fn.is_async else SyncStep(interp, loop)
    ctx = Context(
        events=events,
        run_id=leased.run.id,
        function_id=fn.id,
        run_attempt=leased.run.attempt,
        step=step,
        interp=interp,
        logger=user_log,
        error=error,
        failed_run_id=failed_run,
        trace_context=leased.events[0].trace if leased.events else None,
    )
    interp.ctx = ctx
    return ctx


async def _call_handler(fn: FunctionDef, ctx: Context, interp: Interpreter, threads: Executor) -> Any:
    if fn.is_async:
        interp.main_task = asyncio.current_task()
        return await fn.handler(ctx)
    result = await in_pool(threads, fn.handler, (ctx,), contextvars.copy_context())
    if inspect.isawaitable(result):
        result = await result
    return result


async def _decide(
    outcome: tuple[str, Any],
    fn: FunctionDef,
    leased: LeasedRun,
    interp: Interpreter,
    journal: StagingJournal,
    clock: Clock,
) -> Decision:
    kind, value = outcome
    if journal.lease_lost or isinstance(value, LeaseLostSignal):
        raise LeaseLostSignal()  # a commit was fenced out; logged by execute
    if kind == "return":
        try:
            encoded = serde.dumps(
                value, what=f"function {fn.id!r} output", limit=limits.MAX_STEP_OUTPUT_BYTES
            )
            if interp.hooks.active and interp.hooks.has("transform_output"):
                kept = await interp.hooks.transform_output(interp.ctx, serde.loads(encoded), None)
                encoded = serde.dumps(
                    kept, what=f"function {fn.id!r} output", limit=limits.MAX_STEP_OUTPUT_BYTES
                )
        except StepstoneError as exc:
            return Decision(status=RunStatus.FAILED, error=error_info(exc))
        return Decision(status=RunStatus.COMPLETED, output=encoded)
    if isinstance(value, CancelSignal) or journal.cancel_requested:
        return Decision(status=RunStatus.CANCELLED)
    if isinstance(value, PauseSignal):
        return _parked(interp, leased)
    failure: Exception = value
    if isinstance(failure, StepError | NonRetriableError):
        info = error_info(failure)
        if isinstance(failure, StepError):
            info = ErrorInfo(failure.error_type, failure.message, info.traceback)
        return Decision(status=RunStatus.FAILED, error=info)
    return _retry_invocation(failure, fn, leased, journal, clock)


def _parked(interp: Interpreter, leased: LeasedRun) -> Decision:
    wakes = [p.wake_at for p in interp.pauses if p.wake_at is not None]
    wake_at = min(wakes) if wakes else None
    statuses = {p.status for p in interp.pauses}
    status = (
        RunStatus.PAUSED  # a divergence: nothing else may run until an operator resumes
        if RunStatus.PAUSED in statuses
        else RunStatus.RUNNING
        if RunStatus.RUNNING in statuses
        else RunStatus.SLEEPING
        if RunStatus.SLEEPING in statuses
        else RunStatus.WAITING
    )
    return Decision(status=status, wake_at=wake_at, attempt=leased.run.attempt)


async def settle(decision: Decision, leased: LeasedRun, journal: RunJournal, env: ExecEnv) -> Outcome:
    """Commit the decision with whatever is staged: the run's end, or its park."""
    if decision.status in ENDED_STATUSES:
        return await _finish(journal, env, leased, decision.status, decision.output, decision.error)
    return await _park_or_cancel(journal, env, leased, decision.status, decision.wake_at, decision.attempt)


async def _park_or_cancel(
    journal: RunJournal,
    env: ExecEnv,
    leased: LeasedRun,
    status: RunStatus,
    wake_at: float | None,
    attempt: int | None,
) -> Outcome:
    """Park the run, unless its cancellation was requested since the last
    checkpoint: then the same transaction ends it cancelled (reading the run's
    events only then: a park decodes nothing it does not need)."""
    fence, now, matcher = journal.fence, env.clock.now(), env.matcher()

    def park(tx: Tx) -> RunStatus:
        return park_run(tx, leased.run, fence, status, wake_at, attempt, now, matcher)

    if await journal.finish(park) == RunStatus.CANCELLED:
        return Outcome(RunStatus.CANCELLED)
    return Outcome(status, wake_at)


def _retry_invocation(
    exc: Exception, fn: FunctionDef, leased: LeasedRun, journal: StagingJournal, clock: Clock
) -> Decision:
    """An error outside steps: retry the invocation with back-off, like a step."""
    failures = leased.run.attempt + 1
    info = error_info(exc)
    if failures > fn.retries:
        return Decision(status=RunStatus.FAILED, error=info)
    now = clock.now()
    wake_at = retry_at(exc, now) if isinstance(exc, RetryAfterError) else now + fn.backoff.delay(failures)
    journal.spans.append(
        SpanRow(
            run_id=leased.run.id,
            kind="invocation",
            name="handler",
            started_at=now,
            ended_at=now,
            status=StepStatus.RETRYING,
            attempt=leased.run.attempt,
            error=serde.dumps(info.to_json(), what="error"),
        )
    )
    return Decision(status=RunStatus.RUNNING, wake_at=wake_at, attempt=failures)


async def _finish(
    journal: RunJournal,
    env: ExecEnv,
    leased: LeasedRun,
    status: RunStatus,
    output: str | None,
    error: ErrorInfo | None,
) -> Outcome:
    now = env.clock.now()
    matcher = env.matcher()
    events = _StoredEvents(leased.events)
    fence = journal.fence

    watched = env.watched(leased.run.id)

    def final(tx: Tx) -> Callable[[], RunRead] | None:
        ended = end_run(tx, leased.run, status, output, error, now, matcher, fence=fence, events=events)
        if not watched:
            return None
        steps = journal.written() if ended and status != RunStatus.CANCELLED else None
        if steps is None:
            return tx.ended_run_later(leased.run.id)
        row = leased.run.ended(status, output, stored_error(error), now)  # (a cancel's error is the flag's)
        return lambda: (row, steps)

    told = await journal.finish(final)  # (None: a retried end found its first attempt landed)
    return Outcome(status, error=error, ended=told() if told is not None else None)
