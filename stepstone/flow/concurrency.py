"""``concurrency=``: at most ``limit`` runs executing step work at once per key.

Admission writes the run's concurrency keys and limits into its queue spec
(the first key also names its partition); leasing counts live leases per key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from stepstone.errors import ConfigError
from stepstone.expressions import Expression
from stepstone.flow.base import Admission, ListOption, Placement, Rule
from stepstone.flow.checks import key_expression, positive_int

Scope = Literal["fn", "env"]


@dataclass(frozen=True)
class Concurrency:
    """At most ``limit`` runs executing step work at once per value of ``key``."""

    limit: int
    key: str | None = None
    scope: Scope = "fn"

    def resolve(self, field: str = "concurrency[0]") -> ResolvedConcurrency:
        limit = positive_int(self.limit, f"{field}.limit")
        if self.scope not in ("fn", "env"):
            raise ConfigError(f"{field}.scope", f"must be 'fn' or 'env', got {self.scope!r}")
        if self.scope == "env" and self.key is None:
            raise ConfigError(f"{field}.key", "an 'env'-scoped limit needs a key")
        return ResolvedConcurrency(
            limit=limit, key=key_expression(self.key, f"{field}.key"), scope=self.scope
        )


@dataclass(frozen=True, kw_only=True)
class ResolvedConcurrency:
    limit: int
    key: Expression | None
    scope: Scope

    def slot_key(self, adm: Admission) -> str:
        """The key whose live leases count against ``limit``."""
        if self.scope == "env":
            return f"env:{adm.key(self.key)}"
        if self.key is None:
            return f"fn:{adm.function_id}"
        return f"fn:{adm.function_id}:{adm.key(self.key)}"


@dataclass(frozen=True, kw_only=True)
class ConcurrencyRule(Rule):
    limits: tuple[ResolvedConcurrency, ...]
    starts_directly: ClassVar[bool] = False  # see Rule

    def place(self, adm: Admission, placement: Placement) -> None:
        placement.slots.extend((limit.slot_key(adm), limit.limit) for limit in self.limits)


def _combine(limits: tuple[ResolvedConcurrency, ...]) -> ConcurrencyRule:
    return ConcurrencyRule(limits=limits)


OPTION = ListOption(
    name="concurrency",
    config=Concurrency,
    combine=_combine,
    most=2,
    too_many="at most two concurrency limits per function",
)
