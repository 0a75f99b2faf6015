"""The replay interpreter.

A run's handler is replayed from the top on every invocation. Each step call
is matched by id against the run's memos: a completed step returns its saved
value, a step that failed for good raises ``StepError`` again, a new step
executes. The interpreter does no I/O itself: it *stages* memo writes in a
``Journal`` that the executor commits, and it asks the journal to flush before
any step starts its side effect, so every earlier result is durable first.

When the run must pause (a sleep, a retry back-off, a wait) the interpreter
raises ``PauseSignal`` (``signals.py``), a ``BaseException`` that user code
cannot swallow.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import hashlib
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import Any, TypeVar

from stepstone import limits, mailbox, serde
from stepstone.attempts import AbandonedThreads, Outcome, attempt
from stepstone.branches import Branches
from stepstone.clock import Clock
from stepstone.divergence import Divergence, ReplayOutcome, classify
from stepstone.errors import (
    ErrorInfo,
    LimitExceededError,
    NondeterminismError,
    NonRetriableError,
    RetryAfterError,
    StepError,
    StepstoneError,
)
from stepstone.events import Event
from stepstone.function import ResolvedBackoff
from stepstone.ids import new_id
from stepstone.memos import callable_fingerprint, mismatch
from stepstone.middleware import NO_HOOKS, Hooks
from stepstone.registry import INVOKE_EVENT
from stepstone.services import Effect, Journal, Services
from stepstone.signals import (
    PauseSignal,
    StepScope,
    current_step,
    error_info,
    retry_at,
)
from stepstone.store.base import Tx
from stepstone.store.rows import RunStatus, SpanRow, StepKind, StepRow, StepStatus, WaitKind, WaitRow
from stepstone.txstep import TransactionCommit

T = TypeVar("T")
log = logging.getLogger("stepstone.waits")


UNTIMED_WAIT = "a wait without a timeout waits for ever if its event is lost; give every wait a timeout"
_untimed_waits: set[tuple[str, str]] = set()  # (function, step) warned of in this process


def _warn_untimed_wait(function_id: str, step_id: str) -> None:
    if (function_id, step_id) not in _untimed_waits:
        _untimed_waits.add((function_id, step_id))
        log.warning("function %r, step %r: %s", function_id, step_id, UNTIMED_WAIT)


def _step_error(memo: StepRow) -> StepError:
    info = ErrorInfo.from_json(serde.loads(memo.error)) or ErrorInfo("Error", "unknown error")
    return StepError(memo.step_id, info.type, info.message)


class Interpreter:
    """Replays one invocation of a run's handler against its step memos."""

    def __init__(
        self,
        *,
        run_id: str,
        steps: list[StepRow],
        journal: Journal,
        clock: Clock,
        retries: int,
        backoff: ResolvedBackoff,
        threads: Executor,
        services: Services,
        run_event: dict[str, Any] | None = None,
        hooks: Hooks = NO_HOOKS,
        step_timeout: float | None = None,
        abandoned: AbandonedThreads | None = None,
        pause_on_divergence: bool = False,
    ) -> None:
        self.run_id = run_id
        self.pause_on_divergence = pause_on_divergence  # on_nondeterminism="pause"
        self.hooks = hooks
        self.ctx: Any = None  # the handler's Context, set by the executor
        self.memo_values: dict[str, Any] | None = None  # set when middleware transforms input
        self.services = services
        self.run_event = run_event
        self.memo = {s.step_id: s for s in steps}
        self.journal = journal
        self.clock = clock
        self.retries = retries
        self.backoff = backoff
        self.threads = threads
        self.step_timeout = step_timeout  # the function's; a step's own timeout= wins
        self.abandoned = abandoned or AbandonedThreads()
        self._counters: dict[str, int] = {}
        self._calls: dict[str, tuple[int, str | None]] = {}  # new steps: (position, fingerprint)
        # Recorded steps not reached yet; a ``patched`` marker is never missed
        # (removing the call once no old run remains is the patch's last deploy).
        self._unreached = {s.step_id: s.position for s in steps if s.kind != StepKind.PATCH}
        self._warned = False
        self.branches = Branches()
        self._frontier: list[str] = []  # new steps reached while recorded ones were unreached
        self._verdict: asyncio.Future[Divergence | None] | None = None
        self._last_recorded = max((s.position for s in steps), default=-1)
        self._next_position = self._last_recorded + 1
        self.replaying = bool(steps)
        self.pauses: list[PauseSignal] = []
        self.children: set[asyncio.Task[Any]] = set()
        self.main_task: asyncio.Task[Any] | None = None

    # -- ids, order, replay state ------------------------------------------------------
    def claim_id(self, base: str) -> str:
        """Resolve a user's step id: repeated ids get ``:1``, ``:2``... in call order."""
        if not isinstance(base, str) or not base:
            raise NonRetriableError(f"a step id must be a non-empty string, got {base!r}")
        if len(base) > limits.MAX_STEP_ID_CHARS:
            raise LimitExceededError(f"step id longer than {limits.MAX_STEP_ID_CHARS} characters")
        count = self._counters.get(base, 0)
        self._counters[base] = count + 1
        return base if count == 0 else f"{base}:{count}"

    def _reach(self, step_id: str, kind: StepKind, fingerprint: str | None = None) -> StepRow | None:
        """Note that the handler reached ``step_id`` with a call of ``kind``; returns
        its memo, if one was recorded for a call like this one."""
        task = asyncio.current_task()
        if task is not None and task is not self.main_task:
            self.children.add(task)
        self.branches.reached += 1
        memo = self.memo.get(step_id)
        if memo is not None:
            reason = mismatch(memo, kind, fingerprint)
            if reason is not None:
                self.journal.warn("nondeterminism", reason)
                self._diverged("kind-changed", step_id)
                raise NondeterminismError(reason)
        elif step_id not in self._calls:
            self._calls[step_id] = (self._next_position, fingerprint)
            self._next_position += 1
        if memo is None or memo.position >= self._last_recorded:
            self.replaying = False
        if memo is None:
            if len(self.memo) >= limits.MAX_STEPS_PER_RUN:
                raise LimitExceededError(
                    f"run has {len(self.memo)} steps; the limit is {limits.MAX_STEPS_PER_RUN}"
                )
            if self._unreached:  # judged by ``_judge`` before it executes
                self._frontier.append(step_id)
        self._unreached.pop(step_id, None)
        return memo

    async def _judge(self, step_id: str) -> None:
        """New step ``step_id`` was reached while recorded steps are unreached:
        once every other branch has stopped (``branches``), the history fits the
        code only if they were all reached (``divergence.classify``, as for
        ``app.check``). Every caller of ``_reach`` awaits this, when its step is
        new and recorded ones are unreached, before the step executes."""
        if self._verdict is None:
            self._verdict = asyncio.ensure_future(self._decide())
        async with self.branches.parked():
            divergence = await asyncio.shield(self._verdict)
        if divergence is None:
            return
        if not self._warned:
            self._warned = True
            self.journal.warn(
                "nondeterminism",
                f"new step {divergence.step_id!r} reached while recorded step(s) "
                f"{', '.join(map(repr, divergence.missing))} were not",
            )
        self._diverged(str(divergence.reason), step_id)  # every new step of a diverging run

    async def _decide(self) -> Divergence | None:
        await self.branches.settled(lambda: not self._unreached)
        seen = ReplayOutcome(
            run_id=self.run_id,
            function_id=getattr(self.ctx, "function_id", ""),
            unreached=dict(self._unreached),
            frontier=tuple(self._frontier),
        )
        return classify(seen)

    def _diverged(self, reason: str, step_id: str) -> None:
        """Under ``on_nondeterminism="pause"``, stop before ``step_id`` executes:
        the run parks ``paused`` with the divergence in its trace."""
        if not self.pause_on_divergence:
            return
        if not any(p.status == RunStatus.PAUSED for p in self.pauses):  # the first one is traced
            missing = sorted((s for s in self._unreached if s != step_id), key=self._unreached.__getitem__)
            detail = {"reason": reason, "step_id": step_id, "missing": missing}
            self.journal.warn("paused", serde.dumps(detail, what="divergence"))
        raise self._pause(None, RunStatus.PAUSED)

    def _position(self, step_id: str) -> int:
        """Where the step stands in the order the run first reached its steps."""
        memo = self.memo.get(step_id)
        return memo.position if memo is not None else self._calls[step_id][0]

    def _pause(self, wake_at: float | None, status: RunStatus) -> PauseSignal:
        signal = PauseSignal(wake_at, status)
        self.pauses.append(signal)
        return signal

    def _fingerprint(self, step_id: str) -> str | None:
        """What the step's call did, as its first call recorded it (``memos``)."""
        call = self._calls.get(step_id)
        if call is not None:
            return call[1]
        memo = self.memo.get(step_id)
        return None if memo is None else memo.fingerprint

    def _save(self, row: StepRow, span: SpanRow | None, effect: Effect | None = None) -> None:
        self.memo[row.step_id] = row
        self.journal.stage(row, span, effect)

    # -- step.run ----------------------------------------------------------------------
    async def begin_step(
        self, step_id: str, fn: Callable[..., Any], kind: StepKind = StepKind.RUN
    ) -> tuple[bool, Any]:
        """Decide a ``step.run`` (or ``kind``) of ``fn``: ``(True, value)`` from memo, or
        ``(False, attempt)`` meaning execute now (earlier writes are committed first)."""
        memo = self._reach(step_id, kind, callable_fingerprint(fn))
        if memo is None and self._unreached:
            await self._judge(step_id)
        if memo is not None:
            if memo.status == StepStatus.COMPLETED:
                return True, self.memo_value(memo)
            if memo.status == StepStatus.FAILED:
                raise _step_error(memo)
            if memo.wake_at is not None and memo.wake_at > self.clock.now():
                raise self._pause(memo.wake_at, RunStatus.RUNNING)
        await self.journal.flush()
        if self.hooks.active:
            await self.hooks.before_execution(self.ctx)
            await self.hooks.before_step(self.ctx, step_id)
        return False, (memo.attempts if memo else 0)

    def memo_value(self, memo: StepRow) -> Any:
        """A completed step's value, as middleware's ``transform_input`` left it."""
        if self.memo_values is not None and memo.step_id in self.memo_values:
            return self.memo_values[memo.step_id]
        return serde.loads(memo.output)

    async def finish_step(
        self,
        step_id: str,
        attempt: int,
        started: float,
        result: Any,
        failure: BaseException | None,
        retries: int | None,
        kind: StepKind = StepKind.RUN,
    ) -> Any:
        """Record the outcome of an executed ``step.run`` (or a failed attempt of
        another ``kind``); return its value or raise."""
        if self.hooks.active:
            await self.hooks.after_step(self.ctx, step_id, result, failure)
        now = self.clock.now()
        position = self._position(step_id)
        encoded = stored = None
        if failure is None:
            try:
                encoded = stored = serde.dumps(
                    result, what=f"step {step_id!r} output", limit=limits.MAX_STEP_OUTPUT_BYTES
                )
                if self.hooks.has("transform_output"):
                    kept = await self.hooks.transform_output(self.ctx, serde.loads(encoded), step_id)
                    stored = serde.dumps(
                        kept, what=f"step {step_id!r} output", limit=limits.MAX_STEP_OUTPUT_BYTES
                    )
            except StepstoneError as exc:
                failure = exc
        if failure is None:
            row = StepRow(
                run_id=self.run_id,
                step_id=step_id,
                position=position,
                kind=kind,
                status=StepStatus.COMPLETED,
                attempts=attempt + 1,
                output=stored,
                started_at=started,
                ended_at=now,
                fingerprint=self._fingerprint(step_id),
            )
            self._save(row, None)  # the memo itself is the final attempt's trace entry
            return serde.loads(encoded)
        info = error_info(failure)
        error_json = serde.dumps(info.to_json(), what="error")
        allowed = self.retries if retries is None else retries
        if isinstance(failure, NonRetriableError) or attempt >= allowed:
            row = StepRow(
                run_id=self.run_id,
                step_id=step_id,
                position=position,
                kind=kind,
                status=StepStatus.FAILED,
                attempts=attempt + 1,
                error=error_json,
                started_at=started,
                ended_at=now,
                fingerprint=self._fingerprint(step_id),
            )
            self._save(row, None)
            raise StepError(step_id, info.type, info.message) from failure
        wake = (
            retry_at(failure, now)
            if isinstance(failure, RetryAfterError)
            else now + self.backoff.delay(attempt + 1)
        )
        row = StepRow(
            run_id=self.run_id,
            step_id=step_id,
            position=position,
            kind=kind,
            status=StepStatus.RETRYING,
            attempts=attempt + 1,
            error=error_json,
            wake_at=wake,
            started_at=started,
            fingerprint=self._fingerprint(step_id),
        )
        # A failed attempt that will be retried keeps its own trace entry.
        self._save(
            row,
            SpanRow(
                run_id=self.run_id,
                kind="step",
                name=step_id,
                started_at=started,
                ended_at=now,
                status=StepStatus.RETRYING,
                attempt=attempt,
                error=error_json,
            ),
        )
        raise self._pause(row.wake_at, RunStatus.RUNNING) from failure

    async def run(
        self,
        step_id: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        retries: int | None,
        timeout: float | None = None,
    ) -> Any:
        """``step.run`` for async handlers."""
        done, value = await self.begin_step(step_id, fn)
        if done:
            return value
        attempt_no = int(value)
        started = self.clock.now()
        token = current_step.set(StepScope(step_id, attempt_no))
        try:
            result, failure = await self.call(step_id, fn, args, contextvars.copy_context(), timeout)
        finally:
            current_step.reset(token)
        return await self.finish_step(step_id, attempt_no, started, result, failure, retries)

    async def call(
        self,
        step_id: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        context: contextvars.Context,
        timeout: float | None,
    ) -> Outcome:
        """One attempt of a step's function under its time limit (the step's
        ``timeout``, else the function's ``step_timeout``): ``(result, failure)``."""
        return await attempt(
            step_id,
            fn,
            args,
            context=context,
            timeout=self.time_limit(timeout),
            threads=self.threads,
            abandoned=self.abandoned,
        )

    def time_limit(self, timeout: float | None) -> float | None:
        return self.step_timeout if timeout is None else timeout

    # -- step.transaction --------------------------------------------------------------
    async def transaction(
        self, step_id: str, fn: Callable[..., Any], args: tuple[Any, ...], retries: int | None
    ) -> Any:
        """``step.transaction``: ``fn(conn, *args)`` runs inside the fenced commit
        that writes its memo (``txstep.py``); a failed attempt is recorded and
        retried as for ``step.run``."""
        done, value = await self.begin_step(step_id, fn, StepKind.TRANSACTION)
        if done:
            return value
        attempt, started = int(value), self.clock.now()
        token = current_step.set(StepScope(step_id, attempt))  # for fn: ctx.logger, idempotency_key()
        commit = TransactionCommit(
            fn=fn,
            args=args,
            row=StepRow(
                run_id=self.run_id,
                step_id=step_id,
                position=self._position(step_id),
                kind=StepKind.TRANSACTION,
                status=StepStatus.COMPLETED,
                attempts=attempt + 1,
                started_at=started,
                fingerprint=self._fingerprint(step_id),
            ),
            clock=self.clock,
            hooks=self.hooks,
            ctx=self.ctx,
        )
        current_step.reset(token)
        outcome = await self.journal.apply_step(commit)
        if isinstance(outcome, BaseException):
            return await self.finish_step(
                step_id, attempt, started, None, outcome, retries, StepKind.TRANSACTION
            )
        self.memo[step_id] = outcome
        result = serde.loads(commit.encoded)
        if self.hooks.active:
            await self.hooks.after_step(self.ctx, step_id, result, None)
        return result

    # -- step.sleep --------------------------------------------------------------------
    async def sleep_until(self, step_id: str, wake_at: float) -> None:
        """Pause until ``wake_at`` unless that time has come; no I/O."""
        memo = self._reach(step_id, StepKind.SLEEP)
        if memo is None and self._unreached:
            await self._judge(step_id)
        now = self.clock.now()
        if memo is not None and memo.status == StepStatus.COMPLETED:
            return
        if memo is None:
            if wake_at - now > limits.MAX_SLEEP_SECONDS:
                raise LimitExceededError(f"step {step_id!r}: sleeps are limited to 366 days")
        else:
            wake_at = memo.wake_at if memo.wake_at is not None else now
        started = memo.started_at if memo and memo.started_at else now
        position = self._position(step_id)
        if wake_at <= now:
            row = StepRow(
                run_id=self.run_id,
                step_id=step_id,
                position=position,
                kind=StepKind.SLEEP,
                status=StepStatus.COMPLETED,
                attempts=1,
                wake_at=wake_at,
                started_at=started,
                ended_at=now,
                fingerprint=self._fingerprint(step_id),
            )
            self._save(row, None)
            return
        if memo is None:
            row = StepRow(
                run_id=self.run_id,
                step_id=step_id,
                position=position,
                kind=StepKind.SLEEP,
                status=StepStatus.SLEEPING,
                wake_at=wake_at,
                started_at=started,
                fingerprint=self._fingerprint(step_id),
            )
            self._save(row, None)
        raise self._pause(wake_at, RunStatus.SLEEPING)

    # -- waits: events and invoked functions ------------------------------------------------
    async def _resolved(self, memo: StepRow) -> StepRow | None:
        """A memo that no longer waits: its own, or the outcome of its timeout.
        ``None`` means: still waiting, pause."""
        if memo.status != StepStatus.WAITING:
            return memo
        if memo.wake_at is None or memo.wake_at > self.clock.now():
            raise self._pause(memo.wake_at, RunStatus.WAITING)
        now = self.clock.now()
        failure = None
        if memo.kind == StepKind.INVOKE:
            failure = serde.dumps(
                {
                    "type": "InvokeTimeout",
                    "message": f"step {memo.step_id!r}: the invoked run did not finish in time",
                },
                what="error",
            )
        run_id, step_id = self.run_id, memo.step_id

        def timeout(tx: Tx) -> StepRow | None:
            # Deleting the wait decides the race: the event (or child) or the timeout.
            if tx.claim_step_waits(run_id, step_id):
                status = StepStatus.FAILED if failure else StepStatus.COMPLETED
                tx.complete_waiting_step(run_id, step_id, status, None if failure else "null", failure, now)
            return tx.get_step(run_id, step_id)

        row: StepRow | None = await self.journal.apply(timeout)
        if row is not None:
            self.memo[step_id] = row
        return row

    def _outcome(self, memo: StepRow) -> Any:
        if memo.status == StepStatus.FAILED:
            raise _step_error(memo)
        return self.memo_value(memo)

    async def wait_for_event(
        self,
        step_id: str,
        names: Sequence[str],
        condition: str | None,
        timeout: float | None,
        lookback: float | None = None,
    ) -> Event | None:
        memo = self._reach(step_id, StepKind.WAIT, "|".join(names))
        if memo is None and self._unreached:
            await self._judge(step_id)
        if memo is not None:
            resolved = await self._resolved(memo)
            value = self._outcome(resolved) if resolved else None
            return Event.from_json(value) if value else None
        if timeout is None:
            _warn_untimed_wait(self.ctx.function_id if self.ctx is not None else "", step_id)
        now = self.clock.now()
        expires = self._expiry(step_id, now, timeout)
        since = None if lookback is None else now - self._bounded(step_id, lookback)
        try:
            waits = [
                self.services.wait_row(
                    run_id=self.run_id,
                    step_id=step_id,
                    event_name=name,
                    condition=condition,
                    run_event=self.run_event,
                    now=now,
                    expires_at=expires,
                )
                for name in names
            ]
        except StepstoneError as exc:
            raise NonRetriableError(f"step {step_id!r}: {exc}") from exc
        row = StepRow(
            run_id=self.run_id,
            step_id=step_id,
            position=self._position(step_id),
            kind=StepKind.WAIT,
            status=StepStatus.WAITING,
            wake_at=expires,
            started_at=now,
            fingerprint=self._fingerprint(step_id),
        )
        services = self.services

        def insert_wait(tx: Tx) -> None:  # nothing if this is a repeated commit
            services.begin_wait(tx, waits, since, now)

        self._save(row, None, insert_wait)
        raise self._pause(expires, RunStatus.WAITING)

    async def wait_for_signal(self, step_id: str, name: str, timeout: float | None) -> Any:
        """The data of the run's oldest unconsumed signal ``name`` (``mailbox``),
        received at once if buffered, else when one is sent; ``None`` at the timeout."""
        memo = self._reach(step_id, StepKind.SIGNAL, name)
        if memo is None and self._unreached:
            await self._judge(step_id)
        if memo is not None:
            resolved = await self._resolved(memo)
            return self._outcome(resolved) if resolved else None
        now = self.clock.now()
        expires = self._expiry(step_id, now, timeout)
        row = StepRow(
            run_id=self.run_id,
            step_id=step_id,
            position=self._position(step_id),
            kind=StepKind.SIGNAL,
            status=StepStatus.WAITING,
            wake_at=expires,
            started_at=now,
            fingerprint=self._fingerprint(step_id),
        )
        self._save(row, None)
        wait = mailbox.wait_row(self.run_id, step_id, name, now, expires)

        # Committed now with the memo (one transaction): a buffered signal is
        # received without parking; otherwise the wait is in place before the park.
        def receive_signal(tx: Tx) -> str | None:
            return mailbox.receive(tx, wait)

        output: str | None = await self.journal.apply(receive_signal)
        if output is None:
            raise self._pause(expires, RunStatus.WAITING)
        done = StepStatus.COMPLETED
        self.memo[step_id] = dataclasses.replace(row, status=done, output=output, ended_at=now)
        value = serde.loads(output)
        if self.hooks.has("transform_input"):  # as a memo's value reaches a replay (decrypted)
            value = (await self.hooks.transform_input(self.ctx, {step_id: value}))[step_id]
        return value

    def _expiry(self, step_id: str, now: float, timeout: float | None) -> float | None:
        return None if timeout is None else now + self._bounded(step_id, timeout)

    def _bounded(self, step_id: str, seconds: float) -> float:
        if seconds > limits.MAX_SLEEP_SECONDS:
            raise LimitExceededError(f"step {step_id!r}: timeouts and lookbacks are limited to 366 days")
        return seconds

    async def invoke(
        self, step_id: str, function: str | Callable[..., Any], data: dict[str, Any], timeout: float | None
    ) -> Any:
        target_id = function if isinstance(function, str) else getattr(function, "__stepstone_id__", None)
        memo = self._reach(step_id, StepKind.INVOKE, target_id)
        if memo is None and self._unreached:
            await self._judge(step_id)
        if memo is not None:
            resolved = await self._resolved(memo)
            return self._outcome(resolved) if resolved else None
        target = self.services.function(function)
        if target is None:
            raise NonRetriableError(f"step {step_id!r}: no function {function!r} to invoke")
        now = self.clock.now()
        expires = self._expiry(step_id, now, timeout)
        [invoked] = await self._outgoing([Event(INVOKE_EVENT, data)])  # encrypted like any sent event
        start = self.services.start_child(target, invoked.data, now, (self.run_id, step_id))
        run_id, matcher, child_id = self.run_id, self.services.matcher(), new_id(now)

        def start_child(tx: Tx) -> None:
            # The wait comes first: a repeated commit of this step (an ambiguous
            # COMMIT retried) inserts none, and then starts nothing.
            if not tx.start_wait(
                WaitRow(
                    run_id=run_id,
                    step_id=step_id,
                    kind=WaitKind.INVOKE,
                    event_name="",
                    match_value=child_id,
                    created_at=now,
                    expires_at=expires,
                )
            )():
                return
            child = start(tx, matcher, child_id)
            if child is not None and child != child_id:  # joined a pending debounce or batch run
                tx.set_wait_match(run_id, step_id, child)
            child_run = tx.get_run(child) if child else None
            if child_run is None or child_run.status == RunStatus.SKIPPED:
                reason = serde.dumps(
                    {"type": "InvokeSkipped", "message": "the invoked run was skipped"}, what="error"
                )
                tx.claim_step_waits(run_id, step_id)
                tx.complete_waiting_step(run_id, step_id, StepStatus.FAILED, None, reason, now)
                tx.wake_run(run_id, now)

        row = StepRow(
            run_id=self.run_id,
            step_id=step_id,
            position=self._position(step_id),
            kind=StepKind.INVOKE,
            status=StepStatus.WAITING,
            wake_at=expires,
            started_at=now,
            fingerprint=self._fingerprint(step_id),
        )
        self._save(row, None, start_child)
        raise self._pause(expires, RunStatus.WAITING)

    # -- send_event ------------------------------------------------------------------------
    async def _outgoing(self, events: list[Event]) -> list[Event]:
        """Events the engine writes on the handler's behalf (sent, or an invoke's
        data) as middleware's ``before_send_events`` leaves them (encryption)."""
        if not self.hooks.active:
            return events
        await self.hooks.before_execution(self.ctx)
        return await self.hooks.before_send_events(self.ctx, events)

    async def send_event(self, step_id: str, events: Event | Sequence[Event]) -> list[str]:
        """Ingest ``events`` in the same transaction as the step's memo: exactly once."""
        memo = self._reach(step_id, StepKind.SEND)
        if memo is None and self._unreached:
            await self._judge(step_id)
        if memo is not None and memo.status in (StepStatus.COMPLETED, StepStatus.FAILED):
            return list(self._outcome(memo))
        now = self.clock.now()
        await self.journal.flush()
        try:
            events = await self._outgoing([events] if isinstance(events, Event) else list(events))
            ids, ingest = self.services.send(events, now)
        except StepstoneError as exc:
            info = error_info(exc)
            row = StepRow(
                run_id=self.run_id,
                step_id=step_id,
                position=self._position(step_id),
                kind=StepKind.SEND,
                status=StepStatus.FAILED,
                attempts=1,
                error=serde.dumps(info.to_json(), what="error"),
                started_at=now,
                ended_at=now,
                fingerprint=self._fingerprint(step_id),
            )
            self._save(row, None)
            raise StepError(step_id, info.type, info.message) from exc
        row = StepRow(
            run_id=self.run_id,
            step_id=step_id,
            position=self._position(step_id),
            kind=StepKind.SEND,
            status=StepStatus.COMPLETED,
            attempts=1,
            output=serde.dumps(ids, what="event ids"),
            started_at=now,
            ended_at=now,
            fingerprint=self._fingerprint(step_id),
        )
        matcher = self.services.matcher()

        def ingest_sent(tx: Tx) -> None:  # ids fixed above: a repeated commit is deduplicated
            ingest(tx, matcher)

        self._save(row, None, ingest_sent)
        await self.journal.flush()
        if self.hooks.active:
            await self.hooks.after_send_events(self.ctx, ids)
        return ids

    # -- patched ----------------------------------------------------------------------------
    async def patched(self, step_id: str) -> bool:
        """Whether the run reaches this point under the code with change ``step_id``:
        ``False`` when its recorded history went past this point without the
        marker (it is replaying older code's steps); otherwise the marker is
        recorded like a step, so the run keeps answering ``True``."""
        if step_id not in self.memo and self.replaying:
            return False
        if self._reach(step_id, StepKind.PATCH) is None:
            if self._unreached:
                await self._judge(step_id)
            now = self.clock.now()
            row = StepRow(
                run_id=self.run_id,
                step_id=step_id,
                position=self._position(step_id),
                kind=StepKind.PATCH,
                status=StepStatus.COMPLETED,
                attempts=1,
                output="true",
                started_at=now,
                ended_at=now,
            )
            self._save(row, None)
        return True

    # -- idempotency keys -----------------------------------------------------------------
    def idempotency_key(self, step_id: str | None) -> str:
        if step_id is None:
            scope = current_step.get()
            if scope is None:
                raise NonRetriableError("idempotency_key() without an id must be called inside a step")
            step_id = scope.step_id
        digest = hashlib.sha256(f"{self.run_id}\x00{step_id}".encode()).hexdigest()[:32]
        return f"ss-{digest}"

    # -- settling -------------------------------------------------------------------------
    async def settle(self) -> None:
        """Wait for step calls still running in other tasks (parallel branches)."""
        while True:
            pending = [t for t in self.children if not t.done()]
            if not pending:
                break
            await asyncio.gather(*pending, return_exceptions=True)
        for task in self.children:
            if not task.cancelled():
                task.exception()  # mark retrieved
