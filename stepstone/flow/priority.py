"""``priority=``: CEL yielding seconds (-600..600) that move a run ahead in its
queue (``sort_at = due - priority``)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

from stepstone.errors import ConfigError
from stepstone.expressions import Expression, compile_expression
from stepstone.flow.base import Admission, Option, Rule

RANGE = 600.0  # seconds either way

_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?")
_STRING = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")


@dataclass(frozen=True)
class Priority:
    """``run`` is CEL yielding seconds (-600..600) that move a run ahead in its queue."""

    run: str

    def resolve(self) -> ResolvedPriority:
        expression = compile_expression(self.run, field="priority.run")
        _check_literals(self.run)
        return ResolvedPriority(run=expression)


@dataclass(frozen=True, kw_only=True)
class ResolvedPriority(Rule):
    run: Expression
    starts_directly: ClassVar[bool] = False  # see Rule

    def priority(self, adm: Admission) -> float:
        """The expression's value clamped to the range; 0 if it is not a number."""
        value = self.run.key(adm.variables)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return 0.0
        return max(-RANGE, min(RANGE, float(value)))


def _check_literals(source: str) -> None:
    """Reject number literals outside -600..600 (strings are not numbers)."""
    for literal in _NUMBER.findall(_STRING.sub("''", source)):
        if abs(float(literal)) > RANGE:
            raise ConfigError("priority.run", f"{literal} is outside -600..600 seconds")


OPTION = Option(name="priority", config=Priority)
