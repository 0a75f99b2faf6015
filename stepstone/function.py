"""Function definitions and their validated configuration.

Every option is checked when the decorator runs: invalid values raise
``ConfigError`` naming the field (``concurrency[0].limit``, ``backoff.factor``).
"""

from __future__ import annotations

import inspect
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

from stepstone.durations import Duration, optional_duration, parse_duration
from stepstone.errors import ConfigError
from stepstone.expressions import Expression, compile_expression
from stepstone.triggers import CronTrigger, EventTrigger, Trigger, normalise_triggers

_EVENT_VARS = frozenset({"event"})
_MATCH_VARS = frozenset({"event", "async"})


def _positive_int(value: Any, field_name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(field_name, f"must be a positive integer, got {value!r}")
    return value


def _positive_duration(value: Duration, field_name: str) -> float:
    seconds = parse_duration(value, field=field_name)
    if seconds <= 0:
        raise ConfigError(field_name, f"must be a positive duration, got {value!r}")
    return seconds


def _key(source: str | None, field_name: str, variables: frozenset[str] = _EVENT_VARS) -> Expression | None:
    return None if source is None else compile_expression(source, field=field_name, variables=variables)


@dataclass(frozen=True)
class Backoff:
    """Exponential back-off between attempts: ``initial * factor**n`` capped at
    ``max``, spread by +/- ``jitter`` (a fraction)."""

    initial: Duration = "10s"
    factor: float = 2
    max: Duration = "1h"
    jitter: float = 0.2

    def validated(self, prefix: str = "backoff") -> ResolvedBackoff:
        initial = _positive_duration(self.initial, f"{prefix}.initial")
        maximum = _positive_duration(self.max, f"{prefix}.max")
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


@dataclass(frozen=True)
class Concurrency:
    """At most ``limit`` runs executing step work at once per value of ``key``."""

    limit: int
    key: str | None = None
    scope: Literal["fn", "env"] = "fn"


@dataclass(frozen=True)
class Throttle:
    """At most ``limit`` run starts per ``period`` (GCRA), ``burst`` extra at once."""

    limit: int
    period: Duration
    burst: int = 1
    key: str | None = None


@dataclass(frozen=True)
class RateLimit:
    """At most ``limit`` runs per ``period`` per key; excess events are skipped."""

    limit: int
    period: Duration
    key: str | None = None


@dataclass(frozen=True)
class Debounce:
    """Start one run ``period`` after the last event for the key, with that event;
    ``timeout`` caps the total delay."""

    period: Duration
    key: str | None = None
    timeout: Duration | None = None


@dataclass(frozen=True)
class Priority:
    """``run`` is CEL yielding seconds (-600..600) that move a run ahead in its queue."""

    run: str


@dataclass(frozen=True)
class Batch:
    """Deliver up to ``max_size`` events per run, or fewer once ``timeout`` passes."""

    max_size: int
    timeout: Duration
    key: str | None = None


@dataclass(frozen=True)
class Singleton:
    """One active run per key: ``skip`` drops new runs, ``cancel`` replaces the old."""

    key: str | None = None
    mode: Literal["skip", "cancel"] = "skip"


@dataclass(frozen=True)
class CancelOn:
    """Cancel the run when ``event`` arrives and ``if_`` (CEL over ``event`` and
    ``async``) holds, within ``timeout`` of the run's start."""

    event: str
    if_: str | None = None
    timeout: Duration | None = None


@dataclass(frozen=True)
class Timeouts:
    """Cancel a run queued longer than ``start`` or running longer than ``finish``."""

    start: Duration | None = None
    finish: Duration | None = None


class OnNondeterminism(StrEnum):
    """What a run does when this code diverges from its recorded history."""

    WARN = "warn"  #: record a warning and go on (a changed step's kind still fails the run)
    PAUSE = "pause"  #: stop before the diverging step, status ``paused``, until resumed


def nondeterminism_policy(value: Any, field_name: str = "on_nondeterminism") -> OnNondeterminism:
    try:
        return OnNondeterminism(value)
    except ValueError:
        raise ConfigError(field_name, f"must be 'warn' or 'pause', got {value!r}") from None


@dataclass(frozen=True)
class FlowConfig:
    """Validated, parsed flow-control settings of one function."""

    concurrency: tuple[tuple[Concurrency, Expression | None], ...] = ()
    throttle: tuple[Throttle, float, Expression | None] | None = None
    rate_limit: tuple[RateLimit, float, Expression | None] | None = None
    debounce: tuple[Debounce, float, float | None, Expression | None] | None = None
    priority: Expression | None = None
    batch: tuple[Batch, float, Expression | None] | None = None
    idempotency: Expression | None = None
    singleton: tuple[Singleton, Expression | None] | None = None
    cancel_on: tuple[tuple[CancelOn, Expression | None, float | None], ...] = ()
    start_timeout: float | None = None
    finish_timeout: float | None = None


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
    on_nondeterminism: OnNondeterminism = OnNondeterminism.WARN

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


def _validate_retries(retries: Any, field_name: str = "retries") -> int:
    if isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= 100:
        raise ConfigError(field_name, f"must be an integer between 0 and 100, got {retries!r}")
    return retries


def build_flow(
    *,
    concurrency: Concurrency | Sequence[Concurrency] | None = None,
    throttle: Throttle | None = None,
    rate_limit: RateLimit | None = None,
    debounce: Debounce | None = None,
    priority: Priority | None = None,
    batch: Batch | None = None,
    idempotency: str | None = None,
    singleton: Singleton | None = None,
    cancel_on: CancelOn | Sequence[CancelOn] | None = None,
    timeouts: Timeouts | None = None,
) -> FlowConfig:
    limits_list = _as_list(concurrency, Concurrency, "concurrency")
    if len(limits_list) > 2:
        raise ConfigError("concurrency", "at most two concurrency limits per function")
    conc = []
    for i, item in enumerate(limits_list):
        prefix = f"concurrency[{i}]"
        _positive_int(item.limit, f"{prefix}.limit")
        if item.scope not in ("fn", "env"):
            raise ConfigError(f"{prefix}.scope", f"must be 'fn' or 'env', got {item.scope!r}")
        if item.scope == "env" and item.key is None:
            raise ConfigError(f"{prefix}.key", "an 'env'-scoped limit needs a key")
        conc.append((item, _key(item.key, f"{prefix}.key")))

    flow_throttle = None
    if throttle is not None:
        _check_type(throttle, Throttle, "throttle")
        _positive_int(throttle.limit, "throttle.limit")
        _positive_int(throttle.burst, "throttle.burst")
        period = _positive_duration(throttle.period, "throttle.period")
        flow_throttle = (throttle, period, _key(throttle.key, "throttle.key"))

    flow_rate = None
    if rate_limit is not None:
        _check_type(rate_limit, RateLimit, "rate_limit")
        _positive_int(rate_limit.limit, "rate_limit.limit")
        period = _positive_duration(rate_limit.period, "rate_limit.period")
        flow_rate = (rate_limit, period, _key(rate_limit.key, "rate_limit.key"))

    flow_debounce = None
    if debounce is not None:
        _check_type(debounce, Debounce, "debounce")
        period = _positive_duration(debounce.period, "debounce.period")
        timeout = None
        if debounce.timeout is not None:
            timeout = _positive_duration(debounce.timeout, "debounce.timeout")
            if timeout < period:
                raise ConfigError("debounce.timeout", "must not be shorter than debounce.period")
        flow_debounce = (debounce, period, timeout, _key(debounce.key, "debounce.key"))

    flow_priority = None
    if priority is not None:
        _check_type(priority, Priority, "priority")
        flow_priority = compile_expression(priority.run, field="priority.run")
        _check_priority_literals(priority.run)

    flow_batch = None
    if batch is not None:
        _check_type(batch, Batch, "batch")
        _positive_int(batch.max_size, "batch.max_size")
        if batch.max_size > 1000:
            raise ConfigError("batch.max_size", "must be at most 1000")
        timeout = _positive_duration(batch.timeout, "batch.timeout")
        flow_batch = (batch, timeout, _key(batch.key, "batch.key"))

    flow_singleton = None
    if singleton is not None:
        _check_type(singleton, Singleton, "singleton")
        if singleton.mode not in ("skip", "cancel"):
            raise ConfigError("singleton.mode", f"must be 'skip' or 'cancel', got {singleton.mode!r}")
        flow_singleton = (singleton, _key(singleton.key, "singleton.key"))

    cancels = []
    for i, item in enumerate(_as_list(cancel_on, CancelOn, "cancel_on")):
        prefix = f"cancel_on[{i}]"
        if not isinstance(item.event, str) or not item.event.strip():
            raise ConfigError(f"{prefix}.event", "expected a non-empty event name")
        cond = _key(item.if_, f"{prefix}.if_", _MATCH_VARS)
        cancels.append((item, cond, optional_duration(item.timeout, field=f"{prefix}.timeout")))

    start_timeout = finish_timeout = None
    if timeouts is not None:
        _check_type(timeouts, Timeouts, "timeouts")
        if timeouts.start is not None:
            start_timeout = _positive_duration(timeouts.start, "timeouts.start")
        if timeouts.finish is not None:
            finish_timeout = _positive_duration(timeouts.finish, "timeouts.finish")

    if flow_batch is not None:
        for name, value in (
            ("cancel_on", cancels),
            ("debounce", flow_debounce),
            ("idempotency", idempotency),
            ("singleton", flow_singleton),
            ("rate_limit", flow_rate),
        ):
            if value:
                raise ConfigError(name, "cannot be combined with batch")
    if flow_debounce is not None and flow_singleton is not None:
        raise ConfigError("singleton", "cannot be combined with debounce")

    return FlowConfig(
        concurrency=tuple(conc),
        throttle=flow_throttle,
        rate_limit=flow_rate,
        debounce=flow_debounce,
        priority=flow_priority,
        batch=flow_batch,
        idempotency=_key(idempotency, "idempotency"),
        singleton=flow_singleton,
        cancel_on=tuple(cancels),
        start_timeout=start_timeout,
        finish_timeout=finish_timeout,
    )


_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?")
_STRING = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")


def _check_priority_literals(source: str) -> None:
    """Priority is seconds in -600..600: reject number literals outside it."""
    for literal in _NUMBER.findall(_STRING.sub("''", source)):
        if abs(float(literal)) > 600:
            raise ConfigError("priority.run", f"{literal} is outside -600..600 seconds")


def _check_type(value: Any, kind: type, field_name: str) -> None:
    if not isinstance(value, kind):
        raise ConfigError(field_name, f"expected ss.{kind.__name__}(...), got {value!r}")


def _as_list(value: Any, kind: type, field_name: str) -> list[Any]:
    if value is None:
        return []
    items = list(value) if isinstance(value, list | tuple) else [value]
    for item in items:
        _check_type(item, kind, field_name)
    return items


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
    on_nondeterminism: str = OnNondeterminism.WARN,
) -> FunctionDef:
    if not callable(handler):
        raise ConfigError("handler", "the decorated object must be callable")
    if on_failure is not None and not callable(on_failure):
        raise ConfigError("on_failure", "must be a callable handler(ctx)")
    if backoff is not None and not isinstance(backoff, Backoff):
        raise ConfigError("backoff", f"expected ss.Backoff(...), got {backoff!r}")
    triggers = normalise_triggers(trigger)
    if flow.batch is not None and any(isinstance(t, CronTrigger) for t in triggers):
        raise ConfigError("batch", "cannot be combined with a cron trigger")
    return FunctionDef(
        id=_validate_id(id),
        handler=handler,
        triggers=triggers,
        retries=_validate_retries(retries),
        backoff=(backoff or Backoff()).validated(),
        flow=flow,
        on_failure=on_failure,
        middleware=tuple(middleware),
        options=options,
        on_nondeterminism=nondeterminism_policy(on_nondeterminism),
    )
