"""``timeouts=``: a run queued longer than ``start`` or running longer than
``finish`` is cancelled; admission writes the deadlines, maintenance enforces them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from stepstone.durations import Duration
from stepstone.flow.base import Admission, Option, Placement, Rule
from stepstone.flow.checks import positive_duration


@dataclass(frozen=True)
class Timeouts:
    """Cancel a run queued longer than ``start`` or running longer than ``finish``."""

    start: Duration | None = None
    finish: Duration | None = None

    def resolve(self) -> ResolvedTimeouts:
        return ResolvedTimeouts(
            start=None if self.start is None else positive_duration(self.start, "timeouts.start"),
            finish=None if self.finish is None else positive_duration(self.finish, "timeouts.finish"),
        )


@dataclass(frozen=True, kw_only=True)
class ResolvedTimeouts(Rule):
    start: float | None  # seconds
    finish: float | None
    starts_directly: ClassVar[bool] = False  # see Rule: a worker learns deadlines in its lease pass

    def place(self, adm: Admission, placement: Placement) -> None:
        placement.start_deadline = None if self.start is None else adm.now + self.start
        placement.finish_timeout = self.finish


OPTION = Option(name="timeouts", config=Timeouts)
