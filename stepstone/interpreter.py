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

This module is the core every step shares (ids, memo matching, replay state,
retries, ``step.run`` and ``step.transaction``); the steps that park the run
or act through its ``Services`` (sleeps, waits, invoke, send_event) are in
``orchestration.py``, which the public methods below dispatch to.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import Any, TypeVar

from stepstone import limits, orchestration, serde
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
from stepstone.memos import callable_fingerprint, mismatch
from stepstone.middleware import NO_HOOKS, Hooks
from stepstone.runstate import DictMemos, MemoSource, StateBudget
from stepstone.services import Effect, Journal, Services
from stepstone.signals import (
    PauseSignal,
    StepScope,
    current_step,
    error_info,
    retry_at,
)
from stepstone.store.rows import RunStatus, SpanRow, StepKind, StepRow, StepStatus
from stepstone.txstep import TransactionCommit

T = TypeVar("T")


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
        memos: MemoSource | None = None,
        max_state: int | None = None,
    ) -> None:
        """``steps`` are the run's memos, with their outputs or without them
        (a lease's step index): a completed memo without its output gets it
        from ``memos`` when the replay reaches it (by default, the outputs
        ``steps`` carry). ``max_state`` caps the run's stored outputs."""
        self.run_id = run_id
        self.pause_on_divergence = pause_on_divergence  # on_nondeterminism="pause"
        self.hooks = hooks
        self.ctx: Any = None  # the handler's Context, set by the executor
        self.memo_values: dict[str, Any] | None = None  # set when middleware transforms input
        self.services = services
        self.run_event = run_event
        self.memo = {s.step_id: s for s in steps}
        self.memos = DictMemos.of(steps) if memos is None else memos
        self.budget = StateBudget(max_state, self.memos.stored_bytes())
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
        """Stage a memo; the interpreter keeps it without its output (the
        handler holds the value; the journal holds the text until it commits)."""
        self.journal.stage(row, span, effect)
        self.keep(row)

    def keep(self, row: StepRow, *, counted: bool = False) -> None:
        """Remember a memo written in this invocation, counting its output
        (unless ``counted`` already: a transaction's, charged in its commit)."""
        if row.output is not None:
            if not counted:
                self.budget.count(row.output)
            row = row.without_output()
        self.memo[row.step_id] = row

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
                return True, await self.memo_value(memo)
            if memo.status == StepStatus.FAILED:
                raise _step_error(memo)
            if memo.wake_at is not None and memo.wake_at > self.clock.now():
                raise self._pause(memo.wake_at, RunStatus.RUNNING)
        await self.journal.flush()
        if self.hooks.active:
            await self.hooks.before_execution(self.ctx)
            await self.hooks.before_step(self.ctx, step_id)
        return False, (memo.attempts if memo else 0)

    async def memo_value(self, memo: StepRow) -> Any:
        """A completed step's value, as middleware's ``transform_input`` left it."""
        if self.memo_values is not None and memo.step_id in self.memo_values:
            return self.memo_values[memo.step_id]
        output = memo.output if memo.output is not None else await self.memos.output(memo)
        return serde.loads(output)

    async def recorded_values(self) -> dict[str, Any]:
        """Every completed step's value, read at once: what middleware's
        ``transform_input`` is handed before the handler runs."""
        done = [m for m in self.memo.values() if m.status == StepStatus.COMPLETED]
        return {m.step_id: await self.memo_value(m) for m in sorted(done, key=lambda m: m.position)}

    async def _outcome(self, memo: StepRow) -> Any:
        """A settled memo's value, or its error raised again."""
        if memo.status == StepStatus.FAILED:
            raise _step_error(memo)
        return await self.memo_value(memo)

    def _attempt_row(
        self,
        step_id: str,
        kind: StepKind,
        status: StepStatus,
        attempt: int,
        started: float,
        *,
        output: str | None = None,
        error: str | None = None,
        wake_at: float | None = None,
        ended_at: float | None = None,
    ) -> StepRow:
        """The step's memo after attempt ``attempt`` (counted from 0) ended in ``status``."""
        return StepRow(
            run_id=self.run_id,
            step_id=step_id,
            position=self._position(step_id),
            kind=kind,
            status=status,
            attempts=attempt + 1,
            output=output,
            error=error,
            wake_at=wake_at,
            started_at=started,
            ended_at=ended_at,
            fingerprint=self._fingerprint(step_id),
        )

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
        encoded = stored = None
        if failure is None:
            try:
                encoded = stored = serde.dumps(
                    result, what=f"step {step_id!r} output", limit=limits.MAX_STEP_OUTPUT_BYTES
                )
                if self.hooks.active and self.hooks.has("transform_output"):
                    kept = await self.hooks.transform_output(self.ctx, serde.loads(encoded), step_id)
                    stored = serde.dumps(
                        kept, what=f"step {step_id!r} output", limit=limits.MAX_STEP_OUTPUT_BYTES
                    )
                self.budget.charge(step_id, stored)  # checked and counted at once
            except StepstoneError as exc:
                failure = exc
        if failure is None:
            row = self._attempt_row(
                step_id, kind, StepStatus.COMPLETED, attempt, started, output=stored, ended_at=now
            )
            self.journal.stage(row, None)  # the memo itself is the final attempt's trace entry
            self.keep(row, counted=True)
            return serde.round_trip(result, encoded)
        info = error_info(failure)
        error_json = serde.dumps(info.to_json(), what="error")
        allowed = self.retries if retries is None else retries
        if isinstance(failure, NonRetriableError) or attempt >= allowed:
            row = self._attempt_row(
                step_id, kind, StepStatus.FAILED, attempt, started, error=error_json, ended_at=now
            )
            self._save(row, None)
            raise StepError(step_id, info.type, info.message) from failure
        wake = (
            retry_at(failure, now)
            if isinstance(failure, RetryAfterError)
            else now + self.backoff.delay(attempt + 1)
        )
        row = self._attempt_row(
            step_id, kind, StepStatus.RETRYING, attempt, started, error=error_json, wake_at=wake
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
            result, failure = await self.call(step_id, fn, args, None, timeout)
        finally:
            current_step.reset(token)
        return await self.finish_step(step_id, attempt_no, started, result, failure, retries)

    async def call(
        self,
        step_id: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        context: contextvars.Context | None,
        timeout: float | None,
    ) -> Outcome:
        """One attempt of a step's function under its time limit (the step's
        ``timeout``, else the function's ``step_timeout``): ``(result, failure)``.
        A plain function runs in ``context`` (``None``: a copy of this task's)."""
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
            budget=self.budget,
        )
        current_step.reset(token)
        outcome = await self.journal.apply_step(commit)
        if isinstance(outcome, BaseException):
            return await self.finish_step(
                step_id, attempt, started, None, outcome, retries, StepKind.TRANSACTION
            )
        self.keep(outcome, counted=True)
        result = serde.loads(commit.encoded)
        if self.hooks.active:
            await self.hooks.after_step(self.ctx, step_id, result, None)
        return result

    # -- orchestration steps: sleeps, waits, invoke, send_event (orchestration.py) ------
    async def sleep_until(self, step_id: str, wake_at: float) -> None:
        """Pause until ``wake_at`` unless that time has come; no I/O."""
        await orchestration.sleep_until(self, step_id, wake_at)

    async def wait_for_event(
        self,
        step_id: str,
        names: Sequence[str],
        condition: str | None,
        timeout: float | None,
        lookback: float | None = None,
    ) -> Event | None:
        """The first event named one of ``names`` matching ``condition``; ``None`` at the timeout."""
        return await orchestration.wait_for_event(self, step_id, names, condition, timeout, lookback)

    async def wait_for_signal(self, step_id: str, name: str, timeout: float | None) -> Any:
        """The data of the run's oldest unconsumed signal ``name``; ``None`` at the timeout."""
        return await orchestration.wait_for_signal(self, step_id, name, timeout)

    async def invoke(
        self, step_id: str, function: str | Callable[..., Any], data: dict[str, Any], timeout: float | None
    ) -> Any:
        """The output of a child run of ``function`` started with ``data``."""
        return await orchestration.invoke(self, step_id, function, data, timeout)

    async def send_event(self, step_id: str, events: Event | Sequence[Event]) -> list[str]:
        """Ingest ``events`` in the same transaction as the step's memo: exactly once."""
        return await orchestration.send_event(self, step_id, events)

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
