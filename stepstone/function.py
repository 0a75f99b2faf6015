"""Function definitions and their validated configuration.

Every option is checked when the decorator runs: invalid values raise
``ConfigError`` naming the field (``concurrency[0].limit``, ``backoff.factor``).
Flow-control options resolve through ``stepstone.flow`` (one module each).
"""

from __future__ import annotations

import inspect
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from stepstone import limits
from stepstone.durations import Duration
from stepstone.errors import ConfigError
from stepstone.flow import FlowConfig
from stepstone.flow.checks import positive_duration
from stepstone.sizes import Size, parse_size
from stepstone.triggers import CronTrigger, EventTrigger, Trigger, normalise_triggers


@dataclass(frozen=True)
class Backoff:
    """Exponential back-off between attempts: ``initial * factor**n`` capped at
    ``max``, spread by +/- ``jitter`` (a fraction)."""

    initial: Duration = "10s"
    factor: float = 2
    max: Duration = "1h"
    jitter: float = 0.2

    def validated(self, prefix: str = "backoff") -> ResolvedBackoff:
        initial = positive_duration(self.initial, f"{prefix}.initial")
        maximum = positive_duration(self.max, f"{prefix}.max")
        if isinstance(self.factor, bool) or not isinstance(self.factor, int | float) or self.factor < 1:
            raise ConfigError(f"{prefix}.factor", f"must be a number >= 1, got {self.factor!r}")
        if not isinstance(self.jitter, int | float) or not 0 <= self.jitter <= 1:
            raise ConfigError(f"{prefix}.jitter", f"must be between 0 and 1, got {self.jitter!r}")
        if maximum < initial:
            raise ConfigError(f"{prefix}.max", "must not be shorter than backoff.initial")
        return ResolvedBackoff(initial, float(self.factor), maximum, float(self.jitter))


@dataclass(frozen=True)
class ResolvedBackoff:
    initial: float
    factor: float
    max: float
    jitter: float

    def delay(self, failures: int) -> float:
        """Seconds to wait after the ``failures``-th consecutive failure (1-based)."""
        base = min(self.max, self.initial * self.factor ** max(0, failures - 1))
        spread = base * self.jitter
        return max(0.0, base + random.uniform(-spread, spread))


class OnNondeterminism(StrEnum):
    """What a run does when this code diverges from its recorded history."""

    WARN = "warn"  #: record a warning and go on (a changed step's kind still fails the run)
    PAUSE = "pause"  #: stop before the diverging step, status ``paused``, until resumed


def nondeterminism_policy(value: Any, field_name: str = "on_nondeterminism") -> OnNondeterminism:
    try:
        return OnNondeterminism(value)
    except ValueError:
        raise ConfigError(field_name, f"must be 'warn' or 'pause', got {value!r}") from None


Handler = Callable[..., Any]


@dataclass
class FunctionDef:
    """A registered durable function."""

    id: str
    handler: Handler
    triggers: tuple[Trigger, ...]
    retries: int
    backoff: ResolvedBackoff
    flow: FlowConfig
    on_failure: Handler | None = None
    middleware: tuple[Any, ...] = ()
    is_async: bool = field(init=False)
    options: dict[str, Any] = field(default_factory=dict)
    failure_of: str | None = None
    step_timeout: float | None = None  # seconds an attempt of step.run may take (None: no limit)
    on_nondeterminism: OnNondeterminism = OnNondeterminism.WARN
    max_state: int | None = limits.DEFAULT_MAX_STATE_BYTES  # a run's stored outputs, summed (None: no cap)

    def __post_init__(self) -> None:
        self.is_async = inspect.iscoroutinefunction(self.handler)

    @property
    def event_triggers(self) -> tuple[EventTrigger, ...]:
        return tuple(t for t in self.triggers if isinstance(t, EventTrigger))

    @property
    def cron_triggers(self) -> tuple[CronTrigger, ...]:
        return tuple(t for t in self.triggers if isinstance(t, CronTrigger))

    def describe(self) -> dict[str, Any]:
        """A JSON description: triggers and configuration, for the registry and UI."""
        return {
            "id": self.id,
            "triggers": [t.to_json() for t in self.triggers],
            "retries": self.retries,
            "failure_of": self.failure_of,
            **self.options,
        }


def _validate_id(function_id: Any) -> str:
    if not isinstance(function_id, str) or not function_id.strip():
        raise ConfigError("id", "expected a non-empty string")
    if len(function_id) > 256 or any(c.isspace() for c in function_id):
        raise ConfigError("id", f"must be at most 256 characters without spaces: {function_id!r}")
    return function_id


def validate_retries(retries: Any, field_name: str = "retries") -> int:
    if isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= 100:
        raise ConfigError(field_name, f"must be an integer between 0 and 100, got {retries!r}")
    return retries


def build_function(
    handler: Handler,
    *,
    id: str,
    trigger: Trigger | list[Trigger] | None,
    retries: int,
    backoff: Backoff | None,
    on_failure: Handler | None,
    middleware: Sequence[Any],
    flow: FlowConfig,
    options: dict[str, Any],
    step_timeout: Duration | None = None,
    on_nondeterminism: str = OnNondeterminism.WARN,
    max_state: Size | None = limits.DEFAULT_MAX_STATE_BYTES,
) -> FunctionDef:
    if not callable(handler):
        raise ConfigError("handler", "the decorated object must be callable")
    if on_failure is not None and not callable(on_failure):
        raise ConfigError("on_failure", "must be a callable handler(ctx)")
    if backoff is not None and not isinstance(backoff, Backoff):
        raise ConfigError("backoff", f"expected ss.Backoff(...), got {backoff!r}")
    triggers = normalise_triggers(trigger)
    flow.check_triggers(triggers)
    return FunctionDef(
        id=_validate_id(id),
        handler=handler,
        triggers=triggers,
        retries=validate_retries(retries),
        backoff=(backoff or Backoff()).validated(),
        flow=flow,
        on_failure=on_failure,
        middleware=tuple(middleware),
        options=options,
        step_timeout=None if step_timeout is None else positive_duration(step_timeout, "step_timeout"),
        on_nondeterminism=nondeterminism_policy(on_nondeterminism),
        max_state=None if max_state is None else parse_size(max_state, field="max_state"),
    )
