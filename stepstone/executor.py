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
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from stepstone import limits, serde
from stepstone.clock import Clock
from stepstone.context import Context
from stepstone.errors import (
    ErrorInfo,
    LeaseLostError,
    NonRetriableError,
    RetryAfterError,
    StepError,
    StepstoneError,
)
from stepstone.events import Event
from stepstone.function import FunctionDef
from stepstone.ingest import ingest, prepare
from stepstone.journal import RunJournal
from stepstone.registry import CANCELLED_EVENT, FAILED_EVENT, FINISHED_EVENT, Registry
from stepstone.steps import (
    AsyncStep,
    CancelSignal,
    Interpreter,
    LeaseLostSignal,
    PauseSignal,
    SyncStep,
    _retry_at,
    error_info,
)
from stepstone.store.base import (
    CANCELLED,
    COMPLETED,
    FAILED,
    RUNNING,
    SLEEPING,
    WAITING,
    Fence,
    LeasedRun,
    SpanRow,
    Store,
    Tx,
)

log = logging.getLogger("stepstone.executor")
user_log = logging.getLogger("stepstone.run")


@dataclass
class ExecEnv:
    """What the executor needs from the worker that hosts it."""

    store: Store
    registry: Registry
    clock: Clock
    owner: str
    lease_ttl: float
    threads: Executor
    matcher: Callable[[], Registry]


@dataclass(frozen=True)
class Outcome:
    status: str
    wake_at: float | None = None


def _events(leased: LeasedRun) -> list[Event]:
    return [Event(e.name, serde.loads(e.data), e.id, e.ts) for e in leased.events]


async def execute(leased: LeasedRun, env: ExecEnv) -> Outcome | None:
    """Run one invocation; returns its outcome, or ``None`` if the lease was lost."""
    run = leased.run
    fn = env.registry.get(run.function_id)
    fence = Fence(run.id, env.owner, leased.epoch)
    journal = RunJournal(env.store, fence, env.clock, env.lease_ttl)
    journal.function_id = run.function_id
    if fn is None:
        err = ErrorInfo("UnknownFunction", f"no function {run.function_id!r} in this worker")
        return await _finish(journal, env, run.function_id, leased, FAILED, None, err)
    if leased.cancel_requested:
        return await _finish(journal, env, fn.id, leased, CANCELLED, None, None)
    interp = Interpreter(
        run_id=run.id, steps=leased.steps, journal=journal, clock=env.clock,
        retries=fn.retries, backoff=fn.backoff, threads=env.threads,
    )
    try:
        output = await _call_handler(fn, leased, interp, env)
        outcome: tuple[str, Any] = ("return", output)
    except (PauseSignal, CancelSignal, LeaseLostSignal) as signal:
        outcome = ("signal", signal)
    except Exception as exc:  # noqa: BLE001 - the handler's failure decides the run's fate
        outcome = ("error", exc)
    await interp.settle()
    try:
        return await _conclude(outcome, fn, leased, interp, journal, env)
    except LeaseLostError:
        log.warning("run %s: lease lost; another worker owns it now", run.id)
        return None


async def _call_handler(fn: FunctionDef, leased: LeasedRun, interp: Interpreter,
                        env: ExecEnv) -> Any:
    loop = asyncio.get_running_loop()
    interp.loop = loop
    events = _events(leased)
    error = failed_run = None
    if fn.failure_of is not None:
        data = events[0].data
        error = ErrorInfo.from_json(data.get("error"))
        failed_run = data.get("run_id")
        events = [Event.from_json(data["event"])] if data.get("event") else events
    step: AsyncStep | SyncStep = AsyncStep(interp) if fn.is_async else SyncStep(interp, loop)
    ctx = Context(events=events, run_id=leased.run.id, function_id=fn.id,
                  run_attempt=leased.run.attempt, step=step, interp=interp, logger=user_log,
                  error=error, failed_run_id=failed_run)
    if fn.is_async:
        interp.main_task = asyncio.current_task()
        return await fn.handler(ctx)
    context = contextvars.copy_context()
    result = await loop.run_in_executor(env.threads, context.run, fn.handler, ctx)
    if inspect.isawaitable(result):
        result = await result
    return result


async def _conclude(outcome: tuple[str, Any], fn: FunctionDef, leased: LeasedRun,
                    interp: Interpreter, journal: RunJournal, env: ExecEnv) -> Outcome | None:
    kind, value = outcome
    if journal.lease_lost or isinstance(value, LeaseLostSignal):
        return None
    if kind == "return":
        try:
            encoded = serde.dumps(value, what=f"function {fn.id!r} output",
                                  limit=limits.MAX_STEP_OUTPUT_BYTES)
        except StepstoneError as exc:
            return await _finish(journal, env, fn.id, leased, FAILED, None, error_info(exc))
        return await _finish(journal, env, fn.id, leased, COMPLETED, encoded, None)
    if isinstance(value, CancelSignal) or journal.cancel_requested:
        return await _finish(journal, env, fn.id, leased, CANCELLED, None, None)
    if isinstance(value, PauseSignal):
        return await _park(journal, interp, leased.run.attempt)
    failure: Exception = value
    if isinstance(failure, StepError | NonRetriableError):
        info = error_info(failure)
        if isinstance(failure, StepError):
            info = ErrorInfo(failure.error_type, failure.message, info.traceback)
        return await _finish(journal, env, fn.id, leased, FAILED, None, info)
    return await _retry_invocation(failure, fn, leased, journal, env)


async def _park(journal: RunJournal, interp: Interpreter, attempt: int | None) -> Outcome:
    wakes = [p.wake_at for p in interp.pauses if p.wake_at is not None]
    wake_at = min(wakes) if wakes else None
    statuses = {p.status for p in interp.pauses}
    status = RUNNING if RUNNING in statuses else SLEEPING if SLEEPING in statuses else WAITING
    fence = journal.fence

    def park(tx: Tx) -> None:
        tx.reschedule(fence, status, wake_at, attempt)

    await journal.finish(park)
    return Outcome(status, wake_at)


async def _retry_invocation(exc: Exception, fn: FunctionDef, leased: LeasedRun,
                            journal: RunJournal, env: ExecEnv) -> Outcome | None:
    """An error outside steps: retry the invocation with back-off, like a step."""
    failures = leased.run.attempt + 1
    info = error_info(exc)
    if failures > fn.retries:
        return await _finish(journal, env, fn.id, leased, FAILED, None, info)
    now = env.clock.now()
    wake_at = _retry_at(exc, now) if isinstance(exc, RetryAfterError) else now + fn.backoff.delay(failures)
    journal.spans.append(SpanRow(leased.run.id, "invocation", "handler", now, now, "retrying",
                                 leased.run.attempt, serde.dumps(info.to_json(), what="error")))
    fence = journal.fence

    def park(tx: Tx) -> None:
        tx.reschedule(fence, RUNNING, wake_at, failures)

    await journal.finish(park)
    return Outcome(RUNNING, wake_at)


async def _finish(journal: RunJournal, env: ExecEnv, function_id: str, leased: LeasedRun,
                  status: str, output: str | None, error: ErrorInfo | None) -> Outcome:
    now = env.clock.now()
    run = leased.run
    error_json = None if error is None else serde.dumps(error.to_json(), what="error")
    matcher = env.matcher()
    system = system_events(matcher, function_id, run.id, status, output, error, leased)
    prepared = prepare(system, now, system=True) if system else []
    fence = journal.fence

    def final(tx: Tx) -> None:
        if tx.finish_run(fence, run.id, status, output, error_json, now) and prepared:
            ingest(tx, prepared, matcher, now)

    await journal.finish(final)
    return Outcome(status)


def system_events(registry: Registry, function_id: str, run_id: str, status: str,
                  output: str | None, error: ErrorInfo | None, leased: LeasedRun) -> list[Event]:
    """``stepstone/function.*`` events for a run that ended (see README)."""
    events = _events(leased)
    base: dict[str, Any] = {
        "function_id": function_id,
        "run_id": run_id,
        "event": events[0].to_json() if events else None,
    }
    names: list[tuple[str, dict[str, Any]]] = []
    if status == COMPLETED:
        names.append((FINISHED_EVENT, {**base, "result": serde.loads(output)}))
    elif status == FAILED:
        err = error.to_json() if error else None
        if err:
            err.pop("traceback", None)
        names.append((FAILED_EVENT, {**base, "error": err}))
        names.append((FINISHED_EVENT, {**base, "error": err}))
    elif status == CANCELLED:
        names.append((CANCELLED_EVENT, base))
    return [
        Event(name, data) for name, data in names
        if name != FINISHED_EVENT or registry.listens_to(name)
    ]


def describe_outcome(outcome: Outcome | None) -> str:
    return "lease lost" if outcome is None else outcome.status


Final = Callable[[Tx], Any]
