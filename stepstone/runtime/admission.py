"""Admission: how an event becomes a run of one function, with its flow control.

In the ingesting transaction: idempotency (one run per key per 24 h), rate
limit (excess runs are recorded ``skipped``), singleton, debounce (one pending
run per key whose event is replaced and whose start moves back), batch (one
pending run per key collecting events until full or timed out), and the queue
placement: partition (function + first concurrency key), concurrency keys with
their limits, throttle key, priority.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from stepstone import limits, serde
from stepstone.errors import ErrorInfo
from stepstone.function import FunctionDef
from stepstone.ids import new_id
from stepstone.registry import Registry
from stepstone.runtime.incoming import PreparedEvent
from stepstone.runtime.lifecycle import Publish, cancel_run
from stepstone.runtime.waits import build_wait, canonical
from stepstone.scheduler import gcra
from stepstone.store.base import AccumulatorKind, FlowTx, Tx, WaitsTx
from stepstone.store.rows import ENDED_STATUSES, NewRun, QueueSpec, RunStatus, WaitKind

FOREVER = 100 * 365 * 86400.0  # a claim held until released
PRIORITY_RANGE = 600.0


def queue_spec(fn: FunctionDef, variables: dict[str, Any]) -> QueueSpec:
    """The run's partition, concurrency keys and throttle key."""
    keys: list[tuple[str, int]] = []
    for config, expression in fn.flow.concurrency:
        if config.scope == "env":
            keys.append((f"env:{canonical(expression.key(variables) if expression else None)}", config.limit))
        elif expression is not None:
            keys.append((f"fn:{fn.id}:{canonical(expression.key(variables))}", config.limit))
        else:
            keys.append((f"fn:{fn.id}", config.limit))
    throttle_key = None
    if fn.flow.throttle is not None:
        expression = fn.flow.throttle[2]
        throttle_key = f"throttle:{fn.id}:{canonical(expression.key(variables) if expression else None)}"
    padded: list[tuple[str | None, int | None]] = [*keys, (None, None), (None, None)]
    (ckey1, limit1), (ckey2, limit2) = padded[:2]
    partition = fn.id if ckey1 is None else f"{fn.id}|{ckey1}"
    return QueueSpec(
        partition_key=partition,
        ckey1=ckey1,
        limit1=limit1,
        ckey2=ckey2,
        limit2=limit2,
        throttle_key=throttle_key,
    )


def priority_seconds(fn: FunctionDef, variables: dict[str, Any]) -> float:
    if fn.flow.priority is None:
        return 0.0
    value = fn.flow.priority.key(variables)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0.0
    return max(-PRIORITY_RANGE, min(PRIORITY_RANGE, float(value)))


def start_run(
    tx: Tx,
    fn: FunctionDef,
    events: Sequence[tuple[int, PreparedEvent]],
    now: float,
    registry: Registry,
    *,
    publish: Publish,
    parent: tuple[str, str] | None = None,
    available_at: float | None = None,
    run_id: str | None = None,
) -> str | None:
    """Admit ``events`` to ``fn``; returns the run id (new, skipped, or the pending
    debounce/batch run they joined), or ``None`` if an idempotency key already
    started a run. A new run gets ``run_id`` if given (fixed by the caller
    before its transaction, so that a repeated commit names the same run).
    ``publish`` ingests the system events of a singleton holder it cancels."""
    flow, variables = fn.flow, events[0][1].variables
    if flow.batch is not None:
        joined = _join_batch(tx, fn, events, now, variables)
        if joined is not None:
            return joined
    run_id = run_id or new_id(now)
    if flow.idempotency is not None:
        key = flow.idempotency.key(variables)
        if (
            key is not None
            and tx.claim_key(
                f"idem:{fn.id}:{canonical(key)}", run_id, now + limits.DEDUPE_WINDOW_SECONDS, now
            )
            is not None
        ):
            return None
    skipped = _rate_limited(tx, fn, variables, now)
    if flow.debounce is not None and not skipped:
        joined = _join_debounce(tx, fn, events, now, variables)
        if joined is not None:
            return joined
    singleton_key = None
    if not skipped:
        singleton_key, skipped = _singleton(tx, fn, run_id, variables, now, registry, publish)
    due = now if available_at is None else available_at
    if flow.debounce is not None:
        due = now + flow.debounce[1]
    if flow.batch is not None and flow.batch[0].max_size > 1:
        due = now + flow.batch[1]
    spec = queue_spec(fn, variables)
    tx.create_run(
        NewRun(
            id=run_id,
            function_id=fn.id,
            event_seqs=[seq for seq, _ in events],
            event_ids=[event.id for _, event in events],
            available_at=due,
            sort_at=due - priority_seconds(fn, variables),
            created_at=now,
            status=RunStatus.SKIPPED if skipped else RunStatus.QUEUED,
            meta=serde.dumps({"skipped": skipped}, what="meta") if skipped else None,
            parent_run_id=parent[0] if parent else None,
            parent_step_id=parent[1] if parent else None,
            start_deadline=None if flow.start_timeout is None else now + flow.start_timeout,
            finish_timeout=flow.finish_timeout,
            singleton_key=singleton_key,
            spec=spec,
        )
    )
    if not skipped:
        _open_accumulators(tx, fn, run_id, variables, now)
        _cancel_waits(tx, fn, run_id, variables, now)
    return run_id


def _rate_limited(tx: FlowTx, fn: FunctionDef, variables: dict[str, Any], now: float) -> str | None:
    if fn.flow.rate_limit is None:
        return None
    config, period, expression = fn.flow.rate_limit
    key = f"rate:{fn.id}:{canonical(expression.key(variables) if expression else None)}"
    interval = period / config.limit
    if gcra.try_consume(tx, key, interval, period - interval, now):
        return None
    return f"rate limit: more than {config.limit} run(s) per {period:g}s for this key"


def _accumulator_key(kind: str, fn: FunctionDef, expression: Any, variables: dict[str, Any]) -> str:
    return f"{kind}:{fn.id}:{canonical(expression.key(variables) if expression else None)}"


def _open(tx: FlowTx, kind: AccumulatorKind, key: str) -> tuple[str, int, float] | None:
    """The key's pending accumulator run, locked for this transaction."""
    tx.lock(key)
    found = tx.get_accumulator(kind, key)
    return found if found is not None and tx.pending_item(found[0]) else None


def _join_debounce(
    tx: FlowTx,
    fn: FunctionDef,
    events: Sequence[tuple[int, PreparedEvent]],
    now: float,
    variables: dict[str, Any],
) -> str | None:
    """Replace the pending run's event with this one and push its start back."""
    assert fn.flow.debounce is not None
    _config, period, timeout, expression = fn.flow.debounce
    found = _open(tx, "debounce", _accumulator_key("debounce", fn, expression, variables))
    if found is None:
        return None
    run_id, _size, first_at = found
    seq, event = events[-1]
    tx.set_run_events(run_id, [(seq, event.id)], replace=True)
    due = now + period if timeout is None else min(now + period, first_at + timeout)
    tx.move_item(run_id, due, due - priority_seconds(fn, variables))
    return run_id


def _join_batch(
    tx: FlowTx,
    fn: FunctionDef,
    events: Sequence[tuple[int, PreparedEvent]],
    now: float,
    variables: dict[str, Any],
) -> str | None:
    """Add the event to the key's open batch; a full batch is due at once."""
    assert fn.flow.batch is not None
    config, _timeout, expression = fn.flow.batch
    key = _accumulator_key("batch", fn, expression, variables)
    found = _open(tx, "batch", key)
    if found is None:
        return None
    run_id, size, first_at = found
    seq, event = events[-1]
    tx.set_run_events(run_id, [(seq, event.id)], replace=False)
    if size + 1 >= config.max_size:
        tx.close_batch(key)
        tx.move_item(run_id, now, now)
    else:
        tx.put_accumulator("batch", key, run_id, size + 1, first_at)
    return run_id


def _open_accumulators(
    tx: FlowTx, fn: FunctionDef, run_id: str, variables: dict[str, Any], now: float
) -> None:
    if fn.flow.debounce is not None:
        key = _accumulator_key("debounce", fn, fn.flow.debounce[3], variables)
        tx.put_accumulator("debounce", key, run_id, 1, now)
    if fn.flow.batch is not None and fn.flow.batch[0].max_size > 1:
        key = _accumulator_key("batch", fn, fn.flow.batch[2], variables)
        tx.put_accumulator("batch", key, run_id, 1, now)


def _cancel_waits(tx: WaitsTx, fn: FunctionDef, run_id: str, variables: dict[str, Any], now: float) -> None:
    for i, (cancel, _condition, timeout) in enumerate(fn.flow.cancel_on):
        tx.insert_wait(
            build_wait(
                run_id=run_id,
                step_id=f"cancel_on[{i}]",
                kind=WaitKind.CANCEL,
                event_name=cancel.event,
                condition=cancel.if_,
                run_event=variables["event"],
                now=now,
                expires_at=None if timeout is None else now + timeout,
                field=f"cancel_on[{i}].if_",
            )
        )


def _singleton(
    tx: Tx,
    fn: FunctionDef,
    run_id: str,
    variables: dict[str, Any],
    now: float,
    registry: Registry,
    publish: Publish,
) -> tuple[str | None, str | None]:
    """Claim the singleton key; returns ``(key, skip reason)``."""
    if fn.flow.singleton is None:
        return None, None
    config, expression = fn.flow.singleton
    key = f"singleton:{fn.id}:{canonical(expression.key(variables) if expression else None)}"
    holder = claim_singleton(tx, key, run_id, now)
    if holder is not None:
        if config.mode == "skip":
            return None, f"singleton: run {holder} is active for this key"
        cancel_run(
            tx,
            holder,
            now,
            registry,
            ErrorInfo("Cancelled", f"replaced by run {run_id} (singleton)"),
            publish=publish,
        )
        tx.release_key(key, holder)
        tx.claim_key(key, run_id, now + FOREVER, now)
    return key, None


def claim_singleton(tx: Tx, key: str, run_id: str, now: float) -> str | None:
    """Claim a singleton ``key`` for ``run_id`` (a new run, or a replayed or re-run
    one: every way a run becomes active goes through here). Returns the other
    active run that holds the key, claiming nothing; a claim left by an ended
    run is taken over."""
    holder = tx.claim_key(key, run_id, now + FOREVER, now)
    if not holder or holder == run_id:
        return None
    current = tx.get_run(holder)
    if current is not None and current.status not in ENDED_STATUSES:
        return holder
    tx.release_key(key, holder)
    tx.claim_key(key, run_id, now + FOREVER, now)
    return None
