"""``cancel_on=``: cancel a run when a matching event arrives within ``timeout``
of its start: admission writes one cancel wait per entry next to the new run."""

from __future__ import annotations

from dataclasses import dataclass

from stepstone.durations import Duration, optional_duration
from stepstone.errors import ConfigError
from stepstone.expressions import index_shape, warn_unindexed
from stepstone.flow.base import Admission, ListOption, Rule
from stepstone.flow.checks import MATCH_VARS, key_expression


@dataclass(frozen=True)
class CancelOn:
    """Cancel the run when ``event`` arrives and ``if_`` (CEL over ``event`` and
    ``async``) holds, within ``timeout`` of the run's start."""

    event: str
    if_: str | None = None
    timeout: Duration | None = None

    def resolve(self, field: str = "cancel_on[0]") -> ResolvedCancelOn:
        if not isinstance(self.event, str) or not self.event.strip():
            raise ConfigError(f"{field}.event", "expected a non-empty event name")
        key_expression(self.if_, f"{field}.if_", MATCH_VARS)  # validated here, compiled per wait
        if self.if_ is not None and index_shape(self.if_) is None:
            warn_unindexed(self.if_, where=f"{field}.if_")
        return ResolvedCancelOn(
            field=field,
            event=self.event,
            if_=self.if_,
            timeout=optional_duration(self.timeout, field=f"{field}.timeout"),
        )


@dataclass(frozen=True, kw_only=True)
class ResolvedCancelOn:
    field: str  # cancel_on[i]: also the cancel wait's step id
    event: str
    if_: str | None
    timeout: float | None


@dataclass(frozen=True, kw_only=True)
class CancelOnRule(Rule):
    cancels: tuple[ResolvedCancelOn, ...]

    def opened(self, adm: Admission) -> None:
        for cancel in self.cancels:
            adm.add_cancel_wait(
                step_id=cancel.field,
                event_name=cancel.event,
                condition=cancel.if_,
                expires_at=None if cancel.timeout is None else adm.now + cancel.timeout,
                field=f"{cancel.field}.if_",
            )


def _combine(cancels: tuple[ResolvedCancelOn, ...]) -> CancelOnRule:
    return CancelOnRule(cancels=cancels)


OPTION = ListOption(name="cancel_on", config=CancelOn, combine=_combine)
