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
import threading
import time
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from typing import Any

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
    # Imported here, not at the top: the ``cel`` package imports its command line
    # (prompt_toolkit, ~0.1-0.2 s) with it, which a process whose functions have no
    # expression (a serverless host's every cold start) should not pay.
    import cel

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


# -- the shape of a wait's condition: which index can narrow its candidates --------------------

_PATH = r"([A-Za-z_][\w.]*)"
_NUMBER = r"(\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)"
_SIDE = rf"(async|event)\.data\.{_PATH}(?:\s*([+-])\s*{_NUMBER})?"
_EQUALITY = re.compile(rf"^\s*(async|event)\.data\.{_PATH}\s*==\s*(async|event)\.data\.{_PATH}\s*$")
_MEMBERSHIP = re.compile(rf"^\s*event\.data\.{_PATH}\s+in\s+async\.data\.{_PATH}\s*$")
_ELEMENT = re.compile(rf"^\s*async\.data\.{_PATH}\s+in\s+event\.data\.{_PATH}\s*$")
_PREFIX = re.compile(rf"^\s*async\.data\.{_PATH}\.startsWith\(\s*event\.data\.{_PATH}\s*\)\s*$")
_STARTS = re.compile(rf"^\s*event\.data\.{_PATH}\.startsWith\(\s*async\.data\.{_PATH}\s*\)\s*$")
_COMPARISON = re.compile(rf"^\s*{_SIDE}\s*(<=|>=|<|>)\s*{_SIDE}\s*$")
_FLIPPED = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}


class ShapeKind(StrEnum):
    """The indexed shapes of a condition's conjunct, with X the incoming event's
    field (``async.data.X``) and Y the waiting run's (``event.data.Y``)."""

    EQUALITY = "equality"  #: async.data.X == event.data.Y (either order)
    MEMBERSHIP = "membership"  #: event.data.Y in async.data.X (the incoming list or map)
    ELEMENT = "element"  #: async.data.X in event.data.Y (the waiting run's list or map)
    PREFIX = "prefix"  #: async.data.X.startsWith(event.data.Y)
    STARTS = "starts"  #: event.data.Y.startsWith(async.data.X)
    RANGE = "range"  #: event.data.Y (+ c) <, <=, >, >= async.data.X (+ c), either order


PREFERRED = tuple(ShapeKind)  # fewest candidates first: an equality is one probe


@dataclass(frozen=True, kw_only=True)
class Shape:
    """An indexed conjunct: ``incoming`` is X, ``waiting`` Y; a range says
    ``x + low <= Y <= x + high`` (a bound is ``None`` when open)."""

    kind: ShapeKind
    incoming: str
    waiting: str
    low: float | None = None
    high: float | None = None


def split_conjuncts(source: str) -> list[str]:
    """Top-level ``&&`` operands (outside parentheses, brackets and strings); the
    whole source when a top-level ``||`` or ``?:`` binds looser than ``&&``."""
    parts, depth, quote, start, i = [], 0, "", 0, 0
    while i < len(source):
        char = source[i]
        if quote:
            if char == "\\":
                i += 1
            elif char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif depth == 0 and (source.startswith("||", i) or char == "?"):
            return [source.strip()]
        elif source.startswith("&&", i) and depth == 0:
            parts.append(source[start:i])
            start = i + 2
            i += 1
        i += 1
    parts.append(source[start:])
    return [p.strip() for p in parts]


def index_shape(source: str) -> Shape | None:
    """The conjunct of ``source`` whose index narrows best (``PREFERRED``
    order), or ``None``: the condition is then evaluated on every waiting run."""
    shapes = [shape for conjunct in split_conjuncts(source) if (shape := conjunct_shape(conjunct))]
    if not shapes:
        return None
    best = min(shapes, key=lambda shape: PREFERRED.index(shape.kind))
    if best.kind != ShapeKind.RANGE:
        return best
    same = [s for s in shapes if (s.kind, s.incoming, s.waiting) == (best.kind, best.incoming, best.waiting)]
    lows = [s.low for s in same if s.low is not None]
    highs = [s.high for s in same if s.high is not None]
    return Shape(
        kind=best.kind,
        incoming=best.incoming,
        waiting=best.waiting,
        low=max(lows) if lows else None,
        high=min(highs) if highs else None,
    )


def conjunct_shape(source: str) -> Shape | None:
    """The indexed shape of one conjunct, or ``None``."""
    if (pair := equality_shape(source)) is not None:
        return Shape(kind=ShapeKind.EQUALITY, incoming=pair[0], waiting=pair[1])
    for kind, pattern, incoming_first in (
        (ShapeKind.MEMBERSHIP, _MEMBERSHIP, False),
        (ShapeKind.ELEMENT, _ELEMENT, True),
        (ShapeKind.PREFIX, _PREFIX, True),
        (ShapeKind.STARTS, _STARTS, False),
    ):
        if match := pattern.match(source):
            incoming, waiting = match.group(1, 2) if incoming_first else match.group(2, 1)
            return Shape(kind=kind, incoming=incoming, waiting=waiting)
    return _comparison_shape(source)


def _comparison_shape(source: str) -> Shape | None:
    """``Y (+a) op X (+b)`` as a bound on Y: ``Y op x + (b - a)`` (async on the
    left flips ``op``); ``<`` and ``<=`` alike give an upper bound, the index
    being inclusive (CEL decides the strict ones)."""
    match = _COMPARISON.match(source)
    if match is None or match.group(1) == match.group(6):
        return None
    left = (match.group(2), _offset(match.group(3), match.group(4)))
    right = (match.group(7), _offset(match.group(8), match.group(9)))
    op = match.group(5)
    if match.group(1) == "async":
        (incoming, b), (waiting, a), op = left, right, _FLIPPED[op]
    else:
        (waiting, a), (incoming, b) = left, right
    bound = b - a
    if op in ("<", "<="):
        return Shape(kind=ShapeKind.RANGE, incoming=incoming, waiting=waiting, high=bound)
    return Shape(kind=ShapeKind.RANGE, incoming=incoming, waiting=waiting, low=bound)


def _offset(sign: str | None, number: str | None) -> float:
    return 0.0 if number is None else (-1.0 if sign == "-" else 1.0) * float(number)


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


shape_log = logging.getLogger("stepstone.waits")  # unindexed conditions: a cost, not a failure
_warned: set[str] = set()
_warned_lock = threading.Lock()


def warn_unindexed(source: str, *, where: str) -> None:
    """Log, once per condition text, that ``source`` (which ``index_shape``
    found no index for) is evaluated with CEL on every waiting run of its event
    name: matching an event costs time linear in the number of waits."""
    with _warned_lock:
        if source in _warned:
            return
        if len(_warned) >= 4096:
            _warned.clear()
        _warned.add(source)
    shape_log.warning(
        "%s %r has no indexed shape: every event of its name evaluates it on every waiting run "
        "(cost linear in waits; indexed: ==, in, startsWith and <, <=, >, >= between an "
        "async.data and an event.data field, joined by &&)",
        where,
        source,
    )
