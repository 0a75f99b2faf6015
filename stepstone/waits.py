"""Waiting for events: building wait rows and matching incoming events to them.

A wait whose condition is (or contains, joined by ``&&``) the equality
``async.data.X == event.data.Y`` is indexed: its row stores ``X`` and the
canonical JSON of the waiting run's ``event.data.Y``, so an incoming event is
matched with one indexed probe per distinct ``X`` in use for its name,
whatever the number of waiting runs. Other conditions are evaluated on every
wait for the event name.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from stepstone.expressions import compile_expression, equality_shape, lookup_path
from stepstone.store.base import Tx
from stepstone.store.rows import WaitRow

MATCH_VARS = frozenset({"event", "async"})


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


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
    *, run_id: str, step_id: str, kind: str, event_name: str, condition: str | None,
    run_event: dict[str, Any] | None, now: float, expires_at: float | None, field: str,
) -> WaitRow:
    """A wait row for ``event_name`` and CEL ``condition`` (validated here)."""
    key, value, expression = "", "", condition
    if condition is not None:
        compile_expression(condition, field=field, variables=MATCH_VARS)
        conjuncts = split_conjuncts(condition)
        for conjunct in conjuncts:
            shape = equality_shape(conjunct)
            if shape is not None:
                key = shape[0]
                expected = lookup_path((run_event or {}).get("data"), shape[1])
                value = canonical(expected)
                if len(conjuncts) == 1:
                    expression = None  # the index lookup is the whole test
                break
    return WaitRow(
        run_id=run_id, step_id=step_id, kind=kind, event_name=event_name, match_key=key,
        match_value=value, expression=expression,
        event_json=canonical(run_event) if expression is not None else None,
        created_at=now, expires_at=expires_at,
    )


def match_event(tx: Tx, name: str, data: dict[str, Any], variables: dict[str, Any], now: float,
                on_match: Callable[[WaitRow], None]) -> None:
    """Resolve every wait the event satisfies (each exactly once)."""
    for key in tx.wait_keys(name):
        value = canonical(lookup_path(data, key)) if key else ""
        for wait in tx.match_waits(name, key, value, now):
            if wait.expression is not None:
                scope = {"event": json.loads(wait.event_json or "null") or {},
                         "async": variables["event"]}
                condition = compile_expression(wait.expression, field="if_", variables=MATCH_VARS)
                if not condition.test(scope):
                    continue
            if wait.id is not None and tx.claim_wait(wait.id):
                on_match(wait)
