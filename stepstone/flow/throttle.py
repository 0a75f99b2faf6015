"""``throttle=``: at most ``limit`` run starts per ``period`` (GCRA), ``burst`` at once.

Admission gives the run a throttle key; excess runs wait in the queue (none is
dropped): leasing asks :meth:`ResolvedThrottle.start_at` before a run's first
start.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from stepstone.durations import Duration
from stepstone.expressions import Expression
from stepstone.flow.base import Admission, Option, Placement, Rule
from stepstone.flow.checks import key_expression, positive_duration, positive_int
from stepstone.scheduler import gcra
from stepstone.store.base import GcraTx


@dataclass(frozen=True)
class Throttle:
    """At most ``limit`` run starts per ``period`` (GCRA), ``burst`` extra at once."""

    limit: int
    period: Duration
    burst: int = 1
    key: str | None = None

    def resolve(self) -> ResolvedThrottle:
        return ResolvedThrottle(
            limit=positive_int(self.limit, "throttle.limit"),
            burst=positive_int(self.burst, "throttle.burst"),
            period=positive_duration(self.period, "throttle.period"),
            key=key_expression(self.key, "throttle.key"),
        )


@dataclass(frozen=True, kw_only=True)
class ResolvedThrottle(Rule):
    limit: int
    burst: int
    period: float  # seconds
    key: Expression | None
    starts_directly: ClassVar[bool] = False  # see Rule

    def place(self, adm: Admission, placement: Placement) -> None:
        placement.throttle_key = f"throttle:{adm.function_id}:{adm.key(self.key)}"

    def start_at(self, tx: GcraTx, throttle_key: str, now: float) -> float | None:
        """When a never-started run under ``throttle_key`` may start (``None``:
        now, and the start is counted)."""
        interval = self.period / self.limit
        at = gcra.allowed_at(tx, throttle_key, (self.burst - 1) * interval, now)
        if at > now:
            return at
        gcra.consume(tx, throttle_key, interval, now)
        return None


OPTION = Option(name="throttle", config=Throttle)
