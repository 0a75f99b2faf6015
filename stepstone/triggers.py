"""Triggers: what starts a function's runs (``on_event``, ``on_cron``)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from stepstone.durations import Duration, optional_duration
from stepstone.errors import ConfigError
from stepstone.expressions import Expression, compile_expression
from stepstone.limits import MAX_EVENT_NAME_CHARS


@dataclass(frozen=True)
class EventTrigger:
    """Runs on events named ``event`` (``*`` is a wildcard: ``user.*``, ``app/*``),
    when the CEL condition ``if_`` over ``event`` holds."""

    event: str
    if_: str | None = None
    condition: Expression | None = field(default=None, compare=False, repr=False)
    pattern: re.Pattern[str] | None = field(default=None, compare=False, repr=False)

    def matches(self, name: str, variables: dict[str, Any]) -> bool:
        if self.pattern is not None:
            if not self.pattern.fullmatch(name):
                return False
        elif name != self.event:
            return False
        return self.condition is None or self.condition.test(variables)

    def to_json(self) -> dict[str, Any]:
        return {"event": self.event, "if": self.if_}


@dataclass(frozen=True)
class CronTrigger:
    """Runs on a schedule: ``"[TZ=Area/City] m h dom mon dow"``, with optional jitter."""

    cron: str
    jitter: float | None = None
    timezone: str = "UTC"
    expression: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"cron": self.cron, "jitter": self.jitter}


Trigger = EventTrigger | CronTrigger


def on_event(event: str, if_: str | None = None) -> EventTrigger:
    field_name = "trigger.event"
    if not isinstance(event, str) or not event.strip():
        raise ConfigError(field_name, "expected a non-empty event name")
    if len(event) > MAX_EVENT_NAME_CHARS:
        raise ConfigError(field_name, f"longer than {MAX_EVENT_NAME_CHARS} characters")
    condition = None if if_ is None else compile_expression(if_, field="trigger.if_")
    pattern = None
    if "*" in event:
        pattern = re.compile(".*".join(re.escape(part) for part in event.split("*")))
    return EventTrigger(event, if_, condition, pattern)


def on_cron(cron: str, jitter: Duration | None = None) -> CronTrigger:
    from stepstone.scheduler.cron import parse_cron

    timezone, expression = parse_cron(cron, field="trigger.cron")
    return CronTrigger(cron, optional_duration(jitter, field="trigger.jitter"), timezone, expression)


def normalise_triggers(trigger: Trigger | list[Trigger] | None) -> tuple[Trigger, ...]:
    if trigger is None:
        return ()
    triggers = trigger if isinstance(trigger, list | tuple) else [trigger]
    for item in triggers:
        if not isinstance(item, EventTrigger | CronTrigger):
            raise ConfigError("trigger", f"expected ss.on_event(...) or ss.on_cron(...), got {item!r}")
    return tuple(triggers)
