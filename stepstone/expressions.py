"""CEL expressions: compiled once, cached, evaluated over plain dicts.

Expressions see ``event`` (the triggering event) and, in waits and
cancellations, ``async`` (the incoming event), each as
``{"name", "data", "id", "ts"}``.

Semantics chosen for robustness: a condition that fails to evaluate (a missing
field, a type mismatch) is false; a key that fails to evaluate is ``None``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import cel

from stepstone.errors import ConfigError, ExpressionError


@dataclass(frozen=True)
class Expression:
    source: str
    program: Any

    def evaluate(self, variables: dict[str, Any]) -> Any:
        """Evaluate; raise ``ExpressionError`` if evaluation fails."""
        try:
            return self.program.execute(variables)
        except (KeyError, TypeError, RuntimeError, ValueError, OverflowError) as exc:
            raise ExpressionError(f"{self.source!r}: {exc}") from exc

    def test(self, variables: dict[str, Any]) -> bool:
        """A condition: true only if it evaluates to ``True``."""
        try:
            return self.evaluate(variables) is True
        except ExpressionError:
            return False

    def key(self, variables: dict[str, Any]) -> Any:
        """A key: the value, or ``None`` if it cannot be evaluated."""
        try:
            return self.evaluate(variables)
        except ExpressionError:
            return None


@lru_cache(maxsize=4096)
def _compile(source: str) -> Any:
    return cel.compile(source)


def compile_expression(
    source: str, *, field: str, variables: frozenset[str] = frozenset({"event"})
) -> Expression:
    """Compile ``source``; raise ``ConfigError`` naming ``field`` if invalid."""
    if not isinstance(source, str) or not source.strip():
        raise ConfigError(field, "expected a non-empty CEL expression string")
    try:
        program = _compile(source)
    except (ValueError, RuntimeError, TypeError) as exc:
        raise ConfigError(field, f"invalid CEL expression {source!r}: {exc}") from exc
    used = set(program.references()["variables"])
    unknown = used - variables
    if unknown:
        allowed = ", ".join(sorted(variables))
        raise ConfigError(
            field, f"unknown variable(s) {', '.join(sorted(unknown))} in {source!r}; use {allowed}"
        )
    return Expression(source, program)


_EQUALITY = re.compile(
    r"^\s*(async|event)\.data\.([A-Za-z_][\w.]*)\s*==\s*(async|event)\.data\.([A-Za-z_][\w.]*)\s*$"
)


def equality_shape(source: str) -> tuple[str, str] | None:
    """For ``async.data.X == event.data.Y`` (either order) return ``("X", "Y")``."""
    match = _EQUALITY.match(source)
    if not match or match.group(1) == match.group(3):
        return None
    if match.group(1) == "async":
        return match.group(2), match.group(4)
    return match.group(4), match.group(2)


def lookup_path(data: Any, path: str) -> Any:
    """Follow a dotted path through nested dicts; ``None`` when absent."""
    for part in path.split("."):
        if not isinstance(data, dict) or part not in data:
            return None
        data = data[part]
    return data
