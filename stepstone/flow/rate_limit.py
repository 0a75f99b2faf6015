"""``rate_limit=``: at most ``limit`` runs per ``period`` per key (GCRA); the
excess is recorded as a ``skipped`` run, not queued."""

from __future__ import annotations

from dataclasses import dataclass

from stepstone.durations import Duration
from stepstone.expressions import Expression
from stepstone.flow.base import Admission, Option, Placement, Rule, Skipped, Verdict
from stepstone.flow.checks import key_expression, positive_duration, positive_int
from stepstone.scheduler import gcra


@dataclass(frozen=True)
class RateLimit:
    """At most ``limit`` runs per ``period`` per key; excess events are skipped."""

    limit: int
    period: Duration
    key: str | None = None

    def resolve(self) -> ResolvedRateLimit:
        return ResolvedRateLimit(
            limit=positive_int(self.limit, "rate_limit.limit"),
            period=positive_duration(self.period, "rate_limit.period"),
            key=key_expression(self.key, "rate_limit.key"),
        )


@dataclass(frozen=True, kw_only=True)
class ResolvedRateLimit(Rule):
    limit: int
    period: float  # seconds
    key: Expression | None

    def admit(self, adm: Admission, placement: Placement) -> Verdict | None:
        key = f"rate:{adm.function_id}:{adm.key(self.key)}"
        interval = self.period / self.limit
        if gcra.try_consume(adm.tx, key, interval, self.period - interval, adm.now):
            return None
        return Skipped(reason=f"rate limit: more than {self.limit} run(s) per {self.period:g}s for this key")


OPTION = Option(name="rate_limit", config=RateLimit)
