"""Waiting for events: building wait rows and matching incoming events to them.

A wait whose condition is (or contains, joined by ``&&``) the equality
``async.data.X == event.data.Y`` is indexed: its row stores ``X`` and the index
value of the waiting run's ``event.data.Y``, so an incoming event is matched
with one indexed probe per distinct ``X`` in use for its name, whatever the
number of waiting runs. So is (failing an equality) the membership
``event.data.Y in async.data.X``: its row's key is ``in:X`` and an incoming event
probes once per distinct element (list) or key (map) of its ``X``. Other
conditions are evaluated on every wait for the event name.

The index only narrows the candidates; the condition, evaluated with CEL,
decides. So the index value must give CEL-equal values the same text
(``index_value``: ``1`` and ``1.0`` alike), and may give unequal ones the same
text too. A missing field fails the equality in CEL (an error, which no ``&&``
can turn true), so a wait expecting a missing field matches nothing and an
event lacking ``X`` probes nothing, where both used to index as ``null``.

A wait on several names has one row per name, each indexed under its name;
the event that resolves it claims them all (``claim_step_waits``: one delete,
which decides a race between names as it does one with the timeout).
``earlier_event`` serves ``lookback``: events already committed, matched with
the same condition, oldest first.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from typing import Any

from stepstone import serde
from stepstone.expressions import compile_expression, compile_stored, equality_shape, membership_shape
from stepstone.store.base import Tx, WaitsTx
from stepstone.store.rows import StepStatus, WaitKind, WaitRow

MATCH_VARS = frozenset({"event", "async"})
LOOKBACK_SCAN = 1000  # events a lookback examines at most, oldest first
MEMBER = "in:"  # a match key naming a membership (field paths never contain ':')
NEVER = "!missing"  # an index value no probe carries (canonical JSON never starts with '!')
_MISSING = object()


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def index_value(value: Any) -> str:
    """Canonical JSON with every number as CEL compares it, as a double: an
    integral one written as an integer (``1.0`` and ``1`` give ``1``, ints up to
    2**53 are unchanged); bools stay bools (CEL: ``true != 1``); keys as strings."""
    return json.dumps(_numbers_as_doubles(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _numbers_as_doubles(value: Any) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float):
        try:
            number = float(value)
        except OverflowError:  # beyond any double: CEL cannot hold it either
            return "!number"
        return int(number) if math.isfinite(number) and number.is_integer() else number
    if isinstance(value, dict):
        return {str(k): _numbers_as_doubles(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_numbers_as_doubles(v) for v in value]
    return repr(value)


def _lookup(data: Any, path: str) -> Any:
    """``data`` at the dotted ``path``, or ``_MISSING`` (where CEL's select fails)."""
    for part in path.split("."):
        if not isinstance(data, dict) or part not in data:
            return _MISSING
        data = data[part]
    return data


def split_conjuncts(source: str) -> list[str]:
    """Top-level ``&&`` operands (outside parentheses, brackets and strings)."""
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
        elif source.startswith("&&", i) and depth == 0:
            parts.append(source[start:i])
            start = i + 2
            i += 1
        i += 1
    parts.append(source[start:])
    return [p.strip() for p in parts]


def build_wait(
    *,
    run_id: str,
    step_id: str,
    kind: WaitKind,
    event_name: str,
    condition: str | None,
    run_event: dict[str, Any] | None,
    now: float,
    expires_at: float | None,
    field: str,
) -> WaitRow:
    """A wait row for ``event_name`` and CEL ``condition`` (validated here)."""
    key, value, expression = "", "", condition
    if condition is not None:
        compile_expression(condition, field=field, variables=MATCH_VARS)
        indexed = _indexed_shape(split_conjuncts(condition))
        if indexed is not None:
            key = indexed[0]
            expected = _lookup((run_event or {}).get("data"), indexed[1])
            value = NEVER if expected is _MISSING else index_value(expected)
    return WaitRow(
        run_id=run_id,
        step_id=step_id,
        kind=kind,
        event_name=event_name,
        match_key=key,
        match_value=value,
        expression=expression,
        event_json=canonical(run_event) if expression is not None else None,
        created_at=now,
        expires_at=expires_at,
    )


def _indexed_shape(conjuncts: list[str]) -> tuple[str, str] | None:
    """(match key, the waiting run's field) of the first equality among
    ``conjuncts`` (one probe), else of the first membership (one per element)."""
    for conjunct in conjuncts:
        shape = equality_shape(conjunct)
        if shape is not None:
            return shape
    for conjunct in conjuncts:
        shape = membership_shape(conjunct)
        if shape is not None:
            return MEMBER + shape[0], shape[1]
    return None


def match_event(
    tx: WaitsTx,
    name: str,
    data: dict[str, Any],
    variables: dict[str, Any],
    now: float,
    on_match: Callable[[WaitRow], None],
) -> None:
    """Resolve every wait the event satisfies (each exactly once)."""
    for key in tx.wait_keys(name):
        for value in _probes(data, key):
            for wait in tx.match_waits(name, key, value, now):
                # A wait on several names has a row per name: claiming deletes them all.
                if _holds(wait, variables["event"]) and tx.claim_step_waits(wait.run_id, wait.step_id):
                    on_match(wait)


def _holds(wait: WaitRow, incoming: dict[str, Any]) -> bool:
    """Whether the wait's CEL condition holds for the incoming event (as JSON)."""
    if wait.expression is None:
        return True
    scope = {"event": json.loads(wait.event_json or "null") or {}, "async": incoming}
    condition = compile_stored(wait.expression, field="if_", variables=MATCH_VARS)
    return condition is not None and condition.test(scope)


def begin_wait(tx: Tx, waits: Sequence[WaitRow], since: float | None, now: float) -> None:
    """Start a ``wait_for_event`` step's wait, a row per name (nothing on a
    repeated commit); with a lookback (``since``), an earlier event resolves the
    step instead, in this same transaction: none committed before it is missed."""
    found = None if since is None else earlier_event(tx, waits, since, now)
    if found is None:
        for wait in waits:
            tx.start_wait(wait)
        return
    run_id, step_id, output = waits[0].run_id, waits[0].step_id, serde.dumps(found, what="event")
    if tx.complete_waiting_step(run_id, step_id, StepStatus.COMPLETED, output, None, now):
        tx.wake_run(run_id, now)


def earlier_event(tx: Tx, waits: Sequence[WaitRow], since: float, now: float) -> dict[str, Any] | None:
    """``lookback``: the oldest event of the waits' names committed between
    ``since`` and ``now`` for which their condition holds (as the JSON a wait
    resolves with), among the first ``LOOKBACK_SCAN`` events of those names."""
    names = sorted({wait.event_name for wait in waits})
    for row in tx.events_since(names, since, now, LOOKBACK_SCAN):
        incoming = {"name": row.name, "data": json.loads(row.data), "id": row.id, "ts": row.ts}
        if _holds(waits[0], incoming):
            return incoming
    return None


def _probes(data: dict[str, Any], key: str) -> list[str]:
    """The index values to look up for ``key``: none when the event lacks the
    field (the equality or membership is then an error in CEL: no wait on
    ``key`` can match), or when a membership's field is neither list nor map."""
    if not key:
        return [""]
    found = _lookup(data, key.removeprefix(MEMBER))
    if found is _MISSING:
        return []
    if not key.startswith(MEMBER):
        return [index_value(found)]
    if isinstance(found, list | dict):
        return sorted({index_value(item) for item in found})  # a map: its keys
    return []
