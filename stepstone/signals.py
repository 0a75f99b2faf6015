"""What crosses the interpreter's boundary besides memos: the signals it raises
to end an invocation (``BaseException``s that a handler's ``except Exception``
cannot swallow), the step executing in the current context (for idempotency
keys and the logger), and the helpers that turn an exception or a retry
request into what is stored."""

from __future__ import annotations

import contextvars
import traceback
from dataclasses import dataclass
from datetime import UTC, datetime

from stepstone.durations import parse_duration
from stepstone.errors import ErrorInfo, Interrupt, NonRetriableError, RetryAfterError
from stepstone.store.rows import RunStatus


class PauseSignal(Interrupt):
    """The invocation must end; the run resumes at ``wake_at`` (``None``: when woken)."""

    def __init__(self, wake_at: float | None, status: RunStatus) -> None:
        super().__init__(wake_at, status)
        self.wake_at = wake_at
        self.status = status


class CancelSignal(Interrupt):
    """The run was cancelled; raised at the next step boundary."""


class LeaseLostSignal(Interrupt):
    """Another worker owns the run now; abandon the invocation without writing."""


@dataclass(frozen=True)
class StepScope:
    """The step whose function is executing in this context."""

    step_id: str
    attempt: int


current_step: contextvars.ContextVar[StepScope | None] = contextvars.ContextVar(
    "stepstone_current_step", default=None
)


def error_info(exc: BaseException, *, with_traceback: bool = True) -> ErrorInfo:
    tb = "".join(traceback.format_exception(exc)) if with_traceback else None
    return ErrorInfo(type(exc).__name__, str(exc), tb)


def retry_at(exc: RetryAfterError, now: float) -> float:
    value = exc.retry_after
    if isinstance(value, datetime):
        moment = value if value.tzinfo else value.replace(tzinfo=UTC)
        return moment.timestamp()
    return now + parse_duration(value, field="retry_after")


def as_timestamp(moment: datetime) -> float:
    if not isinstance(moment, datetime):
        raise NonRetriableError(f"sleep_until needs a datetime, got {type(moment).__name__}")
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()
