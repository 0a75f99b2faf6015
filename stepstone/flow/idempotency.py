"""``idempotency=``: one run per value of a CEL key per function for 24 hours;
a later event with the same value starts nothing.

The public option is the expression string itself; :class:`Idempotency` wraps
it so that it resolves like every other option.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stepstone import limits
from stepstone.expressions import Expression, compile_expression
from stepstone.flow.base import NULL_KEY, Admission, Dropped, Option, Placement, Rule, Verdict


@dataclass(frozen=True)
class Idempotency:
    """``key``: CEL over ``event``; events whose key is null are never deduplicated."""

    key: str

    def resolve(self) -> ResolvedIdempotency:
        return ResolvedIdempotency(key=compile_expression(self.key, field="idempotency"))


@dataclass(frozen=True, kw_only=True)
class ResolvedIdempotency(Rule):
    key: Expression

    def admit(self, adm: Admission, placement: Placement) -> Verdict | None:
        value = adm.key(self.key)
        if value == NULL_KEY:
            return None
        expires_at = adm.now + limits.DEDUPE_WINDOW_SECONDS
        held = adm.tx.claim_key(f"idem:{adm.function_id}:{value}", adm.run_id, expires_at, adm.now)
        return None if held is None else Dropped()


@dataclass(frozen=True, kw_only=True)
class IdempotencyOption(Option):
    """The user's value is the expression string (stored as is)."""

    def resolve(self, value: Any) -> Rule:
        return Idempotency(value).resolve()

    def load(self, raw: Any) -> Any:
        return raw


OPTION = IdempotencyOption(name="idempotency", config=Idempotency)
