"""One error tree for Stepstone.

Everything a user may catch derives from :class:`StepstoneError`. Control-flow
signals used by the replay interpreter derive from :class:`BaseException` (see
``Interrupt``) so that a user's ``except Exception`` cannot swallow them.
Driver errors are translated at the store boundary into :class:`StoreError`,
keeping the original as ``__cause__``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from stepstone import limits
from stepstone.truncate import clip


class StepstoneError(Exception):
    """Root of every error Stepstone raises on purpose."""


class ConfigError(StepstoneError, ValueError):
    """Invalid configuration, raised at decoration time; the message names the field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class NonRetriableError(StepstoneError):
    """Raise from a step or handler to fail now, with no further attempts."""


class RetryAfterError(StepstoneError):
    """Raise from a step or handler to retry at a given time.

    ``retry_after`` is a duration (``"30s"``, a ``timedelta``, seconds) or an
    aware ``datetime``.
    """

    def __init__(self, message: str, retry_after: str | float | timedelta | datetime) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class TransactionTooLongError(StepstoneError):
    """A ``step.transaction`` function ran past its bound
    (``limits.MAX_TRANSACTION_SECONDS``): its writes were rolled back and the
    step is retried like any failed attempt."""


class StepError(StepstoneError):
    """Raised inside the handler when a step has failed for good.

    Catch it to compensate or roll back; left uncaught it fails the run.
    """

    def __init__(self, step_id: str, error_type: str, message: str) -> None:
        super().__init__(f"step {step_id!r} failed: {error_type}: {message}")
        self.step_id = step_id
        self.error_type = error_type
        self.message = message


class StepTimeoutError(StepstoneError):
    """An attempt of ``step.run`` ran past its timeout (``timeout=`` or the
    function's ``step_timeout``); retried like any error. An async step was
    cancelled; a sync step's thread was abandoned and its late result discarded."""


class NondeterminismError(NonRetriableError):
    """A replay reached a step id whose recorded memo belongs to a different call
    (another kind of step, or another function at a repeated id): the run fails
    rather than hand that call another step's value."""


class SerializationError(NonRetriableError):
    """A value that must be stored is not JSON-serialisable."""


class LimitExceededError(NonRetriableError):
    """A payload, name or count exceeds a documented limit."""


class ExpressionError(StepstoneError, ValueError):
    """A CEL expression failed to compile or evaluate."""


class NotFoundError(StepstoneError, LookupError):
    """A run, function or job does not exist."""


class InvalidStateError(StepstoneError):
    """The operation does not apply to the object's current state."""


class RunTimeoutError(StepstoneError, TimeoutError):
    """``runs.wait`` gave up before the run ended."""


class AuthenticationError(StepstoneError):
    """An HTTP request carried no valid key for what it asked (HTTP 401)."""


class ServerUnavailableError(StepstoneError):
    """``ss.Client`` could not reach the Stepstone server (transient; callers may retry)."""


class EndpointError(StepstoneError):
    """An app served over HTTP could not be reached, refused this server's
    signature, or answered unsigned or invalid (HTTP 502 from the API)."""


class StoreError(StepstoneError):
    """The database failed; the driver's error is the ``__cause__``."""


class StoreUnavailableError(StoreError):
    """The database could not be reached (transient; callers may retry)."""


class LeaseLostError(StoreError):
    """This worker no longer owns the run: another worker took it over."""


@dataclass(frozen=True)
class ErrorInfo:
    """A stored error: its type name, its message and, when known, a traceback.

    Every error Stepstone stores (a step memo, a trace span, a run's error, a
    system event) is one of these, so each part is bounded here, once:
    the type name to ``MAX_ERROR_TYPE_BYTES``, the message and the traceback to
    ``MAX_ERROR_TEXT_BYTES`` each (see ``truncate.clip``).
    """

    type: str
    message: str
    traceback: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "type", clip(self.type, limits.MAX_ERROR_TYPE_BYTES))
        object.__setattr__(self, "message", clip(self.message, limits.MAX_ERROR_TEXT_BYTES))
        if self.traceback is not None:
            object.__setattr__(self, "traceback", clip(self.traceback, limits.MAX_ERROR_TEXT_BYTES))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type, "message": self.message}
        if self.traceback:
            out["traceback"] = self.traceback
        return out

    @classmethod
    def from_json(cls, raw: dict[str, Any] | None) -> ErrorInfo | None:
        if raw is None:
            return None
        return cls(str(raw["type"]), str(raw["message"]), raw.get("traceback"))


# --- control-flow signals (not errors) -------------------------------------


class Interrupt(BaseException):
    """Unwinds the handler when the run must pause; never seen by user code."""
