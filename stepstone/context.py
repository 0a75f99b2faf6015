"""What a handler receives: the event(s), run identity, the step API, a logger."""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any, Generic

from stepstone.errors import ErrorInfo
from stepstone.events import Event
from stepstone.interpreter import Interpreter
from stepstone.signals import current_step
from stepstone.steps import AsyncStep, SyncStep
from stepstone.store.rows import StepStatus

if TYPE_CHECKING:
    from typing_extensions import TypeVar

    LoggerBase = logging.LoggerAdapter[logging.Logger]
    # A bare ``Context`` annotation leaves ``ctx.step`` untyped, as it always was.
    StepT = TypeVar("StepT", bound=AsyncStep | SyncStep, default=Any)
else:
    from typing import TypeVar

    LoggerBase = logging.LoggerAdapter
    StepT = TypeVar("StepT", bound=AsyncStep | SyncStep)  # typing's takes a default from 3.13


class RunLogger(LoggerBase):
    """A ``logging.Logger``-compatible logger that adds run id, function id, step id
    and attempt to each record, and stays silent while the handler replays steps
    that earlier invocations already passed."""

    def __init__(self, logger: logging.Logger, ctx: Context, interp: Interpreter) -> None:
        super().__init__(logger, {})
        # The run's identity, not the context that holds this logger: a cycle
        # would leave a finished run's objects to the garbage collector.
        self._run = (ctx.run_id, ctx.function_id, ctx.run_attempt)
        self._interp = interp

    def isEnabledFor(self, level: int) -> bool:
        if self._interp.replaying and current_step.get() is None:
            return False
        return self.logger.isEnabledFor(level)

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        scope = current_step.get()
        run_id, function_id, run_attempt = self._run
        extra = dict(kwargs.get("extra") or {})
        extra.update(
            run_id=run_id,
            function_id=function_id,
            step_id=scope.step_id if scope else None,
            attempt=scope.attempt if scope else run_attempt,
        )
        kwargs["extra"] = extra
        return msg, kwargs


class Context(Generic[StepT]):
    """``ctx`` passed to every handler.

    ``step`` is the step API: an ``AsyncStep`` in ``async def`` handlers, a
    ``SyncStep`` in plain ``def`` ones (annotate ``ctx: Context[AsyncStep]``
    or ``Context[SyncStep]`` for a type checker to know which). ``event`` is the triggering event,
    ``events`` the whole batch (one event
    unless the function batches), ``attempt`` the 0-based attempt of the step
    executing now (outside steps: of the invocation), ``error`` the failure an
    ``on_failure`` handler is handling (``None`` elsewhere), ``state`` a dict
    middleware may use during one invocation, ``trace_context`` the sender's
    OpenTelemetry context (JSON) when there was one.
    """

    def __init__(
        self,
        *,
        events: list[Event],
        run_id: str,
        function_id: str,
        run_attempt: int,
        step: StepT,
        interp: Interpreter,
        logger: logging.Logger,
        error: ErrorInfo | None = None,
        failed_run_id: str | None = None,
        trace_context: str | None = None,
    ) -> None:
        self.events = events
        self.event = events[0]
        self.run_id = run_id
        self.function_id = function_id
        self.run_attempt = run_attempt
        self.step = step
        self.error = error
        self.failed_run_id = failed_run_id
        self.trace_context = trace_context
        self.state: dict[str, Any] = {}  # scratch space for middleware, per invocation
        self._interp = interp
        self.logger = RunLogger(logger, self, interp)

    def step_attempt(self, step_id: str) -> int:
        """The 0-based attempt a step is on (its failed attempts so far)."""
        memo = self._interp.memo.get(step_id)
        return memo.attempts if memo is not None and memo.status == StepStatus.RETRYING else 0

    @property
    def attempt(self) -> int:
        scope = current_step.get()
        return scope.attempt if scope is not None else self.run_attempt

    def __repr__(self) -> str:
        return f"<Context run={self.run_id} function={self.function_id}>"
