"""``debounce=``: one run ``period`` after the last event for a key, with that
event; ``timeout`` caps the delay since the first.

The first event creates a pending run due in ``period``; each later event for
the key replaces its event and pushes its start back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from stepstone.durations import Duration
from stepstone.errors import ConfigError
from stepstone.expressions import Expression
from stepstone.flow.accumulators import accumulator_key, open_accumulator, pending
from stepstone.flow.base import Admission, Joined, Option, Placement, Rule, Verdict
from stepstone.flow.checks import key_expression, positive_duration


@dataclass(frozen=True)
class Debounce:
    """Start one run ``period`` after the last event for the key, with that event;
    ``timeout`` caps the total delay."""

    period: Duration
    key: str | None = None
    timeout: Duration | None = None

    def resolve(self) -> ResolvedDebounce:
        period = positive_duration(self.period, "debounce.period")
        timeout = None
        if self.timeout is not None:
            timeout = positive_duration(self.timeout, "debounce.timeout")
            if timeout < period:
                raise ConfigError("debounce.timeout", "must not be shorter than debounce.period")
        return ResolvedDebounce(period=period, timeout=timeout, key=key_expression(self.key, "debounce.key"))


@dataclass(frozen=True, kw_only=True)
class ResolvedDebounce(Rule):
    period: float  # seconds
    timeout: float | None
    key: Expression | None
    starts_directly: ClassVar[bool] = False  # see Rule

    def admit(self, adm: Admission, placement: Placement) -> Verdict | None:
        """Replace the pending run's event with this one and push its start back."""
        found = pending(adm, "debounce", accumulator_key(adm, "debounce", self.key))
        if found is None:
            return None
        run_id, _size, first_at = found
        adm.tx.set_run_events(run_id, [adm.last_event], replace=True)
        due = adm.now + self.period
        if self.timeout is not None:
            due = min(due, first_at + self.timeout)
        adm.tx.move_item(run_id, due, adm.sort_at(due))
        return Joined(run_id=run_id)

    def place(self, adm: Admission, placement: Placement) -> None:
        placement.due = adm.now + self.period

    def opened(self, adm: Admission) -> None:
        open_accumulator(adm, "debounce", self.key)


OPTION = Option(name="debounce", config=Debounce, excludes=("singleton",))
