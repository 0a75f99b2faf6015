"""Flow control: the options of ``@app.function`` that decide whether, when and
where an event becomes a run, one module each.

``POLICIES`` is the registry: decoration resolves every given option through
it (:func:`build_flow`), the catalog rebuilds options from stored descriptions
through it, and admission calls each rule's hooks in its order. The order is
the admission order where it matters: batch and idempotency before the rate
limit (a duplicate spends no rate), then debounce, then singleton. A new
option is one module and one line here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from stepstone.errors import ConfigError
from stepstone.flow import (
    batch,
    cancel_on,
    concurrency,
    debounce,
    idempotency,
    priority,
    rate_limit,
    singleton,
    throttle,
    timeouts,
)
from stepstone.flow.base import Option, Rule
from stepstone.flow.batch import Batch
from stepstone.flow.cancel_on import CancelOn
from stepstone.flow.concurrency import Concurrency
from stepstone.flow.debounce import Debounce
from stepstone.flow.priority import Priority
from stepstone.flow.rate_limit import RateLimit
from stepstone.flow.singleton import Singleton
from stepstone.flow.throttle import Throttle
from stepstone.flow.timeouts import Timeouts
from stepstone.triggers import Trigger

POLICIES: tuple[Option, ...] = (
    concurrency.OPTION,
    throttle.OPTION,
    priority.OPTION,
    batch.OPTION,
    idempotency.OPTION,
    rate_limit.OPTION,
    debounce.OPTION,
    singleton.OPTION,
    cancel_on.OPTION,
    timeouts.OPTION,
)

R = TypeVar("R", bound=Rule)


@dataclass(frozen=True, kw_only=True)
class FlowConfig:
    """A function's resolved flow control: one rule per given option, in
    ``POLICIES`` order."""

    rules: tuple[Rule, ...] = ()

    def get(self, kind: type[R]) -> R | None:
        """The rule of that type, if the option was given."""
        return next((rule for rule in self.rules if isinstance(rule, kind)), None)

    @property
    def starts_directly(self) -> bool:
        """Whether a sent run may start in its send's transaction (``Rule.starts_directly``)."""
        return all(rule.starts_directly for rule in self.rules)

    def check_triggers(self, triggers: Sequence[Trigger]) -> None:
        for rule in self.rules:
            rule.check_triggers(triggers)


def build_flow(settings: Mapping[str, Any]) -> FlowConfig:
    """Resolve the options given in ``settings`` (keyword -> the user's value);
    raises ``ConfigError`` naming the field."""
    given = [option for option in POLICIES if option.given(settings.get(option.name))]
    rules = tuple(option.resolve(settings[option.name]) for option in given)
    names = {option.name for option in given}
    for option in given:
        for other in option.excludes:
            if other in names:
                raise ConfigError(other, f"cannot be combined with {option.name}")
    return FlowConfig(rules=rules)


def load_settings(description: Mapping[str, Any]) -> dict[str, Any]:
    """The options of a stored function description, as the user gave them."""
    return {
        option.name: option.load(description[option.name])
        for option in POLICIES
        if description.get(option.name) is not None
    }


__all__ = [
    "POLICIES",
    "Batch",
    "CancelOn",
    "Concurrency",
    "Debounce",
    "FlowConfig",
    "Priority",
    "RateLimit",
    "Singleton",
    "Throttle",
    "Timeouts",
    "build_flow",
    "load_settings",
]
