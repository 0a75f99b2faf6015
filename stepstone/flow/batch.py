"""``batch=``: up to ``max_size`` events per run, or fewer once ``timeout`` passes.

The first event creates a pending run due in ``timeout``; later events for the
key join it, and the one that fills it makes it due at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from stepstone.durations import Duration
from stepstone.errors import ConfigError
from stepstone.expressions import Expression
from stepstone.flow.accumulators import accumulator_key, open_accumulator, pending
from stepstone.flow.base import Admission, Joined, Option, Placement, Rule, Verdict
from stepstone.flow.checks import key_expression, positive_duration, positive_int
from stepstone.triggers import CronTrigger, Trigger

MAX_SIZE = 1000


@dataclass(frozen=True)
class Batch:
    """Deliver up to ``max_size`` events per run, or fewer once ``timeout`` passes."""

    max_size: int
    timeout: Duration
    key: str | None = None

    def resolve(self) -> ResolvedBatch:
        max_size = positive_int(self.max_size, "batch.max_size")
        if max_size > MAX_SIZE:
            raise ConfigError("batch.max_size", f"must be at most {MAX_SIZE}")
        return ResolvedBatch(
            max_size=max_size,
            timeout=positive_duration(self.timeout, "batch.timeout"),
            key=key_expression(self.key, "batch.key"),
        )


@dataclass(frozen=True, kw_only=True)
class ResolvedBatch(Rule):
    max_size: int
    timeout: float  # seconds
    key: Expression | None
    starts_directly: ClassVar[bool] = False  # see Rule

    def admit(self, adm: Admission, placement: Placement) -> Verdict | None:
        """Add the event to the key's open batch; a full batch is due at once."""
        key = accumulator_key(adm, "batch", self.key)
        found = pending(adm, "batch", key)
        if found is None:
            return None
        run_id, size, first_at = found
        adm.tx.set_run_events(run_id, [adm.last_event], replace=False)
        if size + 1 >= self.max_size:
            adm.tx.close_batch(key)
            adm.tx.move_item(run_id, adm.now, adm.now)
        else:
            adm.tx.put_accumulator("batch", key, run_id, size + 1, first_at)
        return Joined(run_id=run_id)

    def place(self, adm: Admission, placement: Placement) -> None:
        if self.max_size > 1:
            placement.due = adm.now + self.timeout

    def opened(self, adm: Admission) -> None:
        if self.max_size > 1:
            open_accumulator(adm, "batch", self.key)

    def check_triggers(self, triggers: Sequence[Trigger]) -> None:
        if any(isinstance(t, CronTrigger) for t in triggers):
            raise ConfigError("batch", "cannot be combined with a cron trigger")


OPTION = Option(
    name="batch",
    config=Batch,
    excludes=("cancel_on", "debounce", "idempotency", "singleton", "rate_limit"),
)
