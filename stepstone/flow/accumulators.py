"""The pending run per key that debounce and batch gather events into."""

from __future__ import annotations

from stepstone.expressions import Expression
from stepstone.flow.base import Admission
from stepstone.store.base import AccumulatorKind


def accumulator_key(adm: Admission, kind: str, expression: Expression | None) -> str:
    return f"{kind}:{adm.function_id}:{adm.key(expression)}"


def pending(adm: Admission, kind: AccumulatorKind, key: str) -> tuple[str, int, float] | None:
    """The key's pending run ``(run id, events so far, first event at)``, locked
    for this transaction; ``None`` if there is none or it has started."""
    adm.tx.lock(key)
    found = adm.tx.get_accumulator(kind, key)
    return found if found is not None and adm.tx.pending_item(found[0]) else None


def open_accumulator(adm: Admission, kind: AccumulatorKind, expression: Expression | None) -> None:
    """Make the new run the key's pending run, holding one event."""
    adm.tx.put_accumulator(kind, accumulator_key(adm, kind, expression), adm.run_id, 1, adm.now)
