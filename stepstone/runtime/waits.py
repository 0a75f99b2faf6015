"""Waiting for events: building wait rows and matching incoming events to them.

A wait's condition is indexed when one of its top-level ``&&`` operands has a
shape ``expressions.index_shape`` knows (X the incoming event's field, Y the
waiting run's); the row's ``match_key`` names the shape and X, so an incoming
event is matched with a bounded number of indexed probes per key in use for
its name, whatever the number of waiting runs:

    ==          ``X``          the index value of Y; one probe (x)
    in          ``in:X``       Y; one probe per distinct element (list) or key (map) of x
    in (run's)  ``has:X``      a row per distinct element or key of Y; one probe (x)
    startsWith  ``prefix:X``   Y; one probe per prefix of x (at most ``FANOUT``)
    (run's)     ``starts:X``   a row per prefix of Y; one probe (x)
    < <= > >=   ``range:X|lo|hi``  Y as a number; one range scan, Y in [x + lo, x + hi]

Where a wait's value would need more than ``FANOUT`` rows or probes (a long
list or string), or is no number for a comparison, that wait falls back to
the unindexed key ``''``, as does every condition with no indexed shape
(logged once per condition text): those are evaluated on every wait for the
event name.

The index only narrows the candidates; the condition, evaluated with CEL,
decides. So the index value must give CEL-equal values the same text
(``index_value``: ``1`` and ``1.0`` alike), and may give unequal ones the same
text too; a range is inclusive and widened by a few ulps (CEL decides strict
bounds and rounding). A value CEL cannot use (a missing field: an error, which
no ``&&`` can turn true) is stored as ``NEVER``, which no probe carries, and an
event lacking X probes nothing.

A wait on several names has one row per name, each indexed under its name;
the event that resolves it claims them all (``claim_step_waits``: one delete,
which decides a race between names as it does one with the timeout, and takes
the index-only rows along). ``earlier_event`` serves ``lookback``: events
already committed, matched with the same condition, oldest first.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from stepstone import serde
from stepstone.expressions import (
    Shape,
    ShapeKind,
    compile_expression,
    compile_stored,
    index_shape,
    warn_unindexed,
)
from stepstone.store.base import Tx, WaitsTx
from stepstone.store.rows import StepStatus, WaitKind, WaitRow

MATCH_VARS = frozenset({"event", "async"})
LOOKBACK_SCAN = 1000  # events a lookback examines at most, oldest first
FANOUT = 64  # index values per wait, or probes per event, at most (else unindexed)
SURVEY_AT = 64  # unindexed waits read for one event past which its name is surveyed first
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
    index, expression = LINEAR, condition
    if condition is not None:
        compile_expression(condition, field=field, variables=MATCH_VARS)
        shape = index_shape(condition)
        if shape is None:
            warn_unindexed(condition, where=f"{kind} wait condition {field}")
        else:
            index = _index(shape, _lookup((run_event or {}).get("data"), shape.waiting))
    return WaitRow(
        run_id=run_id,
        step_id=step_id,
        kind=kind,
        event_name=event_name,
        match_key=index.key,
        match_value=index.values[0],
        also_match=index.values[1:],
        match_number=index.number,
        expression=expression,
        event_json=canonical(run_event) if expression is not None else None,
        created_at=now,
        expires_at=expires_at,
    )


@dataclass(frozen=True)
class _Index:
    key: str
    values: tuple[str, ...]
    number: float | None = None


LINEAR = _Index("", ("",))
_KEYS = {
    ShapeKind.EQUALITY: "",
    ShapeKind.MEMBERSHIP: "in:",
    ShapeKind.ELEMENT: "has:",
    ShapeKind.PREFIX: "prefix:",
    ShapeKind.STARTS: "starts:",
    ShapeKind.RANGE: "range:",
}
_KINDS = {prefix[:-1]: kind for kind, prefix in _KEYS.items() if prefix}


def _key(shape: Shape) -> str:
    key = _KEYS[shape.kind] + shape.incoming
    if shape.kind != ShapeKind.RANGE:
        return key
    return "|".join([key, *("" if b is None else repr(b) for b in (shape.low, shape.high))])


def _index(shape: Shape, expected: Any) -> _Index:
    """How a wait of ``shape`` whose run holds ``expected`` (Y) is indexed."""
    key = _key(shape)
    never = _Index(key, (NEVER,))
    if expected is _MISSING:
        return never
    if shape.kind in (ShapeKind.EQUALITY, ShapeKind.MEMBERSHIP):
        return _Index(key, (index_value(expected),))
    if shape.kind == ShapeKind.RANGE:
        number = _number(expected)
        return LINEAR if number is None else _Index(key, ("",), number)
    if shape.kind == ShapeKind.ELEMENT:
        if not isinstance(expected, list | dict):
            return never  # CEL: `in` needs a list or a map
        values = tuple(sorted({index_value(item) for item in expected})) or (NEVER,)
        return _Index(key, values) if len(values) <= FANOUT else LINEAR
    if not isinstance(expected, str):
        return never  # CEL: startsWith needs strings
    if len(expected) >= FANOUT:
        return LINEAR
    if shape.kind == ShapeKind.PREFIX:
        return _Index(key, (index_value(expected),))
    return _Index(key, tuple(index_value(expected[:k]) for k in range(len(expected) + 1)))


def _number(value: Any) -> float | None:
    """A number as CEL orders it (a double, exactly or rounded: the index is
    inclusive), or ``None`` for what is no number to CEL or no double."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return None if math.isnan(number) else number


def match_event(
    tx: WaitsTx,
    name: str,
    data: dict[str, Any],
    variables: dict[str, Any],
    now: float,
    on_match: Callable[[WaitRow], None],
    surveyed: Survey | None = None,
    learn: Learn | None = None,
    keys: Sequence[str] | None = None,
) -> None:
    """Resolve every wait the event satisfies (each exactly once); its
    unindexed waits through ``surveyed`` when a survey was made. ``keys``: the
    match keys in use on ``name`` (``wait_keys``), if the caller read them."""
    for key in tx.wait_keys(name) if keys is None else keys:
        if not key:
            _match_unindexed(tx, name, variables, now, on_match, surveyed, learn)
            continue
        _resolve_holding(tx, _candidates(tx, name, key, data, now), variables, on_match)


def _resolve_holding(
    tx: WaitsTx, waits: list[WaitRow], variables: dict[str, Any], on_match: Callable[[WaitRow], None]
) -> None:
    for wait in waits:
        # A wait on several names has a row per name: claiming deletes them all.
        if _holds(wait, variables["event"]) and tx.claim_step_waits(wait.run_id, wait.step_id):
            on_match(wait)


def _match_unindexed(
    tx: WaitsTx,
    name: str,
    variables: dict[str, Any],
    now: float,
    on_match: Callable[[WaitRow], None],
    surveyed: Survey | None,
    learn: Learn | None,
) -> None:
    """The unindexed waits on ``name``: every one evaluated here, or, after a
    survey of this key row's incarnation, only those committed since it.

    Why none is missed: the survey read the key's version, then its waits, so
    it evaluated every wait committed before that version was read. A wait
    takes the key's version under the key row's lock, held to its commit (on
    SQLite every writer is serial), so versions grow in commit order and a
    wait committed after the survey's read has a larger one: this transaction
    reads it (``unindexed_waits_after``) and evaluates it here. A key row
    deleted by retention and re-created since has another ``born``: then
    everything is evaluated here. A surveyed wait is claimed by its id (that
    very row, whose condition held); one gone since is skipped."""
    current = tx.wait_key_version(name, "") if surveyed is not None else None
    if surveyed is None or current is None or current[1] != surveyed.born:
        waits = tx.match_waits(name, "", "", now)
        if learn is not None:
            learn(name, len(waits))
        _resolve_holding(tx, waits, variables, on_match)
        return
    for wait in surveyed.matched:
        if wait.id is not None and tx.claim_wait(wait.id):
            tx.claim_step_waits(wait.run_id, wait.step_id)  # its rows for other names
            on_match(wait)
    _resolve_holding(tx, tx.unindexed_waits_after(name, surveyed.version, now), variables, on_match)


@dataclass(frozen=True, kw_only=True)
class Survey:
    """An event's unindexed waits read and evaluated before its write
    transaction (``survey``): the key row's version and incarnation then, and
    the waits whose condition held."""

    version: int
    born: str
    matched: tuple[WaitRow, ...]


Learn = Callable[[str, int], None]  # (event name, unindexed waits read for one event)


def survey(tx: WaitsTx, name: str, variables: dict[str, Any], now: float, learn: Learn) -> Survey | None:
    """Read and evaluate the unindexed waits on ``name`` for one incoming event
    (``variables``), outside the write transaction; ``None`` when there are none."""
    key = tx.wait_key_version(name, "")  # first: every wait committed before it is read below
    if key is None:
        return None
    waits = tx.match_waits(name, "", "", now)
    learn(name, len(waits))
    return Survey(
        version=key[0], born=key[1], matched=tuple(w for w in waits if _holds(w, variables["event"]))
    )


class Surveyed:
    """The event names a send surveys before its write transaction: those for
    which the last match read at least ``SURVEY_AT`` unindexed waits (a send
    to any other name pays no extra read)."""

    def __init__(self) -> None:
        self._names: set[str] = set()
        self._lock = threading.Lock()

    def wanted(self, name: str) -> bool:
        return name in self._names

    def learn(self, name: str, waits: int) -> None:
        with self._lock:
            if waits >= SURVEY_AT:
                self._names.add(name)
            else:
                self._names.discard(name)


def _candidates(tx: WaitsTx, name: str, key: str, data: dict[str, Any], now: float) -> list[WaitRow]:
    """The waits under ``key`` the incoming ``data`` may satisfy: the index's
    probes (none when the event lacks the key's field), or every unindexed wait."""
    if not key:
        return tx.match_waits(name, "", "", now)
    kind, field, low, high = _parse_key(key)
    found = _lookup(data, field)
    if found is _MISSING:
        return []
    if kind == ShapeKind.RANGE:
        bounds = _range(found, low, high)
        return [] if bounds is None else tx.match_range_waits(name, key, *bounds, now)
    values = _probes(kind, found)
    return tx.match_any_waits(name, key, values, now) if values else []


def _parse_key(key: str) -> tuple[ShapeKind, str, float | None, float | None]:
    """A stored match key as (shape, X, low, high): the inverse of ``_key``."""
    prefix, colon, rest = key.partition(":")
    if not colon:
        return ShapeKind.EQUALITY, key, None, None
    kind = _KINDS[prefix]
    if kind != ShapeKind.RANGE:
        return kind, rest, None, None
    field, low, high = rest.rsplit("|", 2)
    return kind, field, float(low) if low else None, float(high) if high else None


def _range(found: Any, low: float | None, high: float | None) -> tuple[float, float] | None:
    """The inclusive range of the waiting runs' numbers an incoming ``found``
    may satisfy, widened past any rounding of CEL's or ours; ``None`` for what
    CEL compares with no number."""
    x = _number(found)
    if x is None:
        return (
            None if isinstance(found, bool) or not isinstance(found, int | float) else (-math.inf, math.inf)
        )
    lower = -math.inf if low is None else x + low
    upper = math.inf if high is None else x + high
    slack = 16 * math.ulp(max(abs(x), abs(low or 0.0), abs(high or 0.0), 1.0))
    return lower - slack, upper + slack


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


def _probes(kind: ShapeKind, found: Any) -> list[str]:
    """The index values to look up for a key of ``kind`` given the incoming
    event's value of its field: none where CEL would err (no list or map for a
    membership, no string for a prefix)."""
    if kind in (ShapeKind.EQUALITY, ShapeKind.ELEMENT, ShapeKind.STARTS):
        return [index_value(found)] if kind != ShapeKind.STARTS or isinstance(found, str) else []
    if kind == ShapeKind.MEMBERSHIP:
        return sorted({index_value(item) for item in found}) if isinstance(found, list | dict) else []
    if not isinstance(found, str):
        return []
    return [index_value(found[:k]) for k in range(min(len(found), FANOUT - 1) + 1)]
