"""CEL expressions: compiled once, cached, evaluated over plain dicts.

Expressions see ``event`` (the triggering event) and, in waits and
cancellations, ``async`` (the incoming event), each as
``{"name", "data", "id", "ts"}``.

Semantics chosen for robustness: user data must never break ingestion, so a
condition that fails to evaluate (a missing field, a type mismatch, a division by
zero, an index out of range, an overflow) is false and a key that fails (or whose
value is not JSON: bytes, a timestamp) is ``None``. ``Expression.test`` and
``Expression.key`` are the only ways the engine evaluates user expressions over
user data; each failure is logged, at most once a minute per expression.
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import cel

from stepstone.errors import ConfigError, ExpressionError

log = logging.getLogger("stepstone.expressions")
LOG_EVERY_SECONDS = 60.0
_last_logged: dict[str, float] = {}


def _log_failure(source: str, what: str, exc: BaseException) -> None:
    """Log a failed evaluation, at most once per ``LOG_EVERY_SECONDS`` per expression."""
    now = time.monotonic()
    last = _last_logged.get(source)
    if last is not None and now - last < LOG_EVERY_SECONDS:
        return
    if len(_last_logged) >= 1024:
        _last_logged.clear()
    _last_logged[source] = now
    log.warning(
        "CEL %s %r failed (treated as %s): %s", what, source, "false" if what == "condition" else "null", exc
    )


def _is_evaluation_error(exc: BaseException) -> bool:
    """Whatever the CEL runtime raises over bad data (a Rust panic surfaces as
    pyo3's ``PanicException``, a ``BaseException``); not interrupts or exits."""
    return isinstance(exc, Exception) or type(exc).__name__ == "PanicException"


@dataclass(frozen=True)
class Expression:
    source: str
    program: Any

    def evaluate(self, variables: dict[str, Any]) -> Any:
        """Evaluate; raise ``ExpressionError`` if evaluation fails."""
        try:
            return self.program.execute(variables)
        except BaseException as exc:
            if not _is_evaluation_error(exc):
                raise
            raise ExpressionError(f"{self.source!r}: {exc}") from exc

    def test(self, variables: dict[str, Any]) -> bool:
        """A condition: true only if it evaluates to ``True``; never raises over data."""
        try:
            return self.evaluate(variables) is True
        except ExpressionError as exc:
            _log_failure(self.source, "condition", exc)
            return False

    def key(self, variables: dict[str, Any]) -> Any:
        """A key: the value if it is JSON, else ``None``; never raises over data."""
        try:
            value = self.evaluate(variables)
            json.dumps(value, sort_keys=True, allow_nan=True)
        except (ExpressionError, TypeError, ValueError, RecursionError) as exc:
            _log_failure(self.source, "key", exc)
            return None
        return value


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


@lru_cache(maxsize=4096)
def compile_stored(source: str, *, field: str, variables: frozenset[str]) -> Expression | None:
    """Compile an expression read back from the store (a wait's condition), once per
    source; ``None``, logged, if this version cannot compile it: one stored row must
    not fail the ingestion of every event that reaches it."""
    try:
        return compile_expression(source, field=field, variables=variables)
    except ConfigError as exc:
        _log_failure(source, "condition", exc)
        return None


_EQUALITY = re.compile(
    r"^\s*(async|event)\.data\.([A-Za-z_][\w.]*)\s*==\s*(async|event)\.data\.([A-Za-z_][\w.]*)\s*$"
)


_MEMBERSHIP = re.compile(r"^\s*event\.data\.([A-Za-z_][\w.]*)\s+in\s+async\.data\.([A-Za-z_][\w.]*)\s*$")


def membership_shape(source: str) -> tuple[str, str] | None:
    """For ``event.data.Y in async.data.X`` (the waiting run's value among the
    incoming event's list elements or map keys) return ``("X", "Y")``."""
    match = _MEMBERSHIP.match(source)
    return None if match is None else (match.group(2), match.group(1))


def equality_shape(source: str) -> tuple[str, str] | None:
    """For ``async.data.X == event.data.Y`` (either order) return ``("X", "Y")``."""
    match = _EQUALITY.match(source)
    if not match or match.group(1) == match.group(3):
        return None
    if match.group(1) == "async":
        return match.group(2), match.group(4)
    return match.group(4), match.group(2)
