"""The interpreter's orchestration steps: sleeps, waits for an event or a
signal, invoked functions and sent events.

Each parks the run on something outside it (a time, an event, a signal, a
child run) or acts on the world through the interpreter's ``Services``, so
each builds a memo and the *effect* written in the same transaction (a wait
row, a child run, sent events). The interpreter (``interpreter.py``) keeps the
core they share: ids, memo matching (``_reach``), replay state, retries; its
public methods dispatch here, passing itself as ``interp``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from stepstone import limits, mailbox, serde
from stepstone.errors import LimitExceededError, NonRetriableError, StepError, StepstoneError
from stepstone.events import Event
from stepstone.ids import new_id
from stepstone.registry import INVOKE_EVENT
from stepstone.signals import error_info
from stepstone.store.rows import RunStatus, StepKind, StepRow, StepStatus
from stepstone.wire import BeginWait, ExpireWait, ReceiveSignal, StartChild

if TYPE_CHECKING:
    from stepstone.interpreter import Interpreter

log = logging.getLogger("stepstone.waits")


UNTIMED_WAIT = "a wait without a timeout waits for ever if its event is lost; give every wait a timeout"
_untimed_waits: set[tuple[str, str]] = set()  # (function, step) warned of in this process


def _warn_untimed_wait(function_id: str, step_id: str) -> None:
    if (function_id, step_id) not in _untimed_waits:
        _untimed_waits.add((function_id, step_id))
        log.warning("function %r, step %r: %s", function_id, step_id, UNTIMED_WAIT)


# -- step.sleep ----------------------------------------------------------------------------
async def sleep_until(interp: Interpreter, step_id: str, wake_at: float) -> None:
    """Pause until ``wake_at`` unless that time has come; no I/O."""
    memo = interp._reach(step_id, StepKind.SLEEP)
    if memo is None and interp._unreached:  # a new step: judged before it executes
        await interp._judge(step_id)
    now = interp.clock.now()
    if memo is not None and memo.status == StepStatus.COMPLETED:
        return
    if memo is None:
        if wake_at - now > limits.MAX_SLEEP_SECONDS:
            raise LimitExceededError(f"step {step_id!r}: sleeps are limited to 366 days")
    else:
        wake_at = memo.wake_at if memo.wake_at is not None else now
    started = memo.started_at if memo and memo.started_at else now
    position = interp._position(step_id)
    if wake_at <= now:
        row = StepRow(
            run_id=interp.run_id,
            step_id=step_id,
            position=position,
            kind=StepKind.SLEEP,
            status=StepStatus.COMPLETED,
            attempts=1,
            wake_at=wake_at,
            started_at=started,
            ended_at=now,
            fingerprint=interp._fingerprint(step_id),
        )
        interp._save(row, None)
        return
    if memo is None:
        row = StepRow(
            run_id=interp.run_id,
            step_id=step_id,
            position=position,
            kind=StepKind.SLEEP,
            status=StepStatus.SLEEPING,
            wake_at=wake_at,
            started_at=started,
            fingerprint=interp._fingerprint(step_id),
        )
        interp._save(row, None)
    raise interp._pause(wake_at, RunStatus.SLEEPING)


# -- waits: events, signals and invoked functions -------------------------------------------
def _waiting(interp: Interpreter, step_id: str, kind: StepKind, now: float, expires: float | None) -> StepRow:
    """The memo of a step that starts waiting now, until ``expires`` (its timeout)."""
    return StepRow(
        run_id=interp.run_id,
        step_id=step_id,
        position=interp._position(step_id),
        kind=kind,
        status=StepStatus.WAITING,
        wake_at=expires,
        started_at=now,
        fingerprint=interp._fingerprint(step_id),
    )


async def _resolved(interp: Interpreter, memo: StepRow) -> StepRow | None:
    """A memo that no longer waits: its own, or the outcome of its timeout.
    ``None`` means: still waiting, pause."""
    if memo.status != StepStatus.WAITING:
        return memo
    if memo.wake_at is None or memo.wake_at > interp.clock.now():
        raise interp._pause(memo.wake_at, RunStatus.WAITING)
    now = interp.clock.now()
    failure = None
    if memo.kind == StepKind.INVOKE:
        failure = serde.dumps(
            {
                "type": "InvokeTimeout",
                "message": f"step {memo.step_id!r}: the invoked run did not finish in time",
            },
            what="error",
        )
    expire = ExpireWait(run_id=interp.run_id, step_id=memo.step_id, failure=failure, now=now)
    row: StepRow | None = await interp.journal.apply(interp.services.effect(expire))
    if row is not None:
        interp.keep(row)  # the event (or child output) that won the race counts as state
    return row


async def wait_for_event(
    interp: Interpreter,
    step_id: str,
    names: Sequence[str],
    condition: str | None,
    timeout: float | None,
    lookback: float | None,
) -> Event | None:
    """The first event named one of ``names`` that matches ``condition``, sent
    after the wait began (or within ``lookback`` before it); ``None`` at the timeout."""
    memo = interp._reach(step_id, StepKind.WAIT, "|".join(names))
    if memo is None and interp._unreached:  # a new step: judged before it executes
        await interp._judge(step_id)
    if memo is not None:
        resolved = await _resolved(interp, memo)
        value = await interp._outcome(resolved) if resolved else None
        return Event.from_json(value) if value else None
    if timeout is None:
        _warn_untimed_wait(interp.ctx.function_id if interp.ctx is not None else "", step_id)
    now = interp.clock.now()
    expires = _expiry(step_id, now, timeout)
    since = None if lookback is None else now - _bounded(step_id, lookback)
    try:
        waits = [
            interp.services.wait_row(
                run_id=interp.run_id,
                step_id=step_id,
                event_name=name,
                condition=condition,
                run_event=interp.run_event,
                now=now,
                expires_at=expires,
            )
            for name in names
        ]
    except StepstoneError as exc:
        raise NonRetriableError(f"step {step_id!r}: {exc}") from exc
    insert_wait = interp.services.effect(BeginWait(waits=tuple(waits), since=since, now=now))
    interp._save(_waiting(interp, step_id, StepKind.WAIT, now, expires), None, insert_wait)
    raise interp._pause(expires, RunStatus.WAITING)


async def wait_for_signal(interp: Interpreter, step_id: str, name: str, timeout: float | None) -> Any:
    """The data of the run's oldest unconsumed signal ``name`` (``mailbox``),
    received at once if buffered, else when one is sent; ``None`` at the timeout."""
    memo = interp._reach(step_id, StepKind.SIGNAL, name)
    if memo is None and interp._unreached:  # a new step: judged before it executes
        await interp._judge(step_id)
    if memo is not None:
        resolved = await _resolved(interp, memo)
        return await interp._outcome(resolved) if resolved else None
    now = interp.clock.now()
    expires = _expiry(step_id, now, timeout)
    row = _waiting(interp, step_id, StepKind.SIGNAL, now, expires)
    interp._save(row, None)
    # Committed now with the memo (one transaction): a buffered signal is
    # received without parking; otherwise the wait is in place before the park.
    wait = mailbox.wait_row(interp.run_id, step_id, name, now, expires)
    output: str | None = await interp.journal.apply(interp.services.effect(ReceiveSignal(wait=wait)))
    if output is None:
        raise interp._pause(expires, RunStatus.WAITING)
    done = StepStatus.COMPLETED
    interp.keep(dataclasses.replace(row, status=done, output=output, ended_at=now))
    value = serde.loads(output)
    if interp.hooks.has("transform_input"):  # as a memo's value reaches a replay (decrypted)
        value = (await interp.hooks.transform_input(interp.ctx, {step_id: value}))[step_id]
    return value


def _expiry(step_id: str, now: float, timeout: float | None) -> float | None:
    return None if timeout is None else now + _bounded(step_id, timeout)


def _bounded(step_id: str, seconds: float) -> float:
    if seconds > limits.MAX_SLEEP_SECONDS:
        raise LimitExceededError(f"step {step_id!r}: timeouts and lookbacks are limited to 366 days")
    return seconds


async def invoke(
    interp: Interpreter,
    step_id: str,
    function: str | Callable[..., Any],
    data: dict[str, Any],
    timeout: float | None,
) -> Any:
    """The output of a child run of ``function`` started with ``data`` (its
    failure raised as a ``StepError``); ``None`` at the timeout."""
    target_id = function if isinstance(function, str) else getattr(function, "__stepstone_id__", None)
    memo = interp._reach(step_id, StepKind.INVOKE, target_id)
    if memo is None and interp._unreached:  # a new step: judged before it executes
        await interp._judge(step_id)
    if memo is not None:
        resolved = await _resolved(interp, memo)
        return await interp._outcome(resolved) if resolved else None
    target = interp.services.function(function)
    if target is None:
        raise NonRetriableError(f"step {step_id!r}: no function {function!r} to invoke")
    now = interp.clock.now()
    expires = _expiry(step_id, now, timeout)
    [invoked] = await _outgoing(interp, [Event(INVOKE_EVENT, data)])  # encrypted like any sent event
    record = StartChild(
        run_id=interp.run_id,
        step_id=step_id,
        function_id=target.id,
        data=invoked.data,
        now=now,
        expires_at=expires,
        child_id=new_id(now),
    )
    start_child = interp.services.effect(record)  # the data's size is checked here
    interp._save(_waiting(interp, step_id, StepKind.INVOKE, now, expires), None, start_child)
    raise interp._pause(expires, RunStatus.WAITING)


# -- send_event ----------------------------------------------------------------------------
async def _outgoing(interp: Interpreter, events: list[Event]) -> list[Event]:
    """Events the engine writes on the handler's behalf (sent, or an invoke's
    data) as middleware's ``before_send_events`` leaves them (encryption)."""
    if not interp.hooks.active:
        return events
    await interp.hooks.before_execution(interp.ctx)
    return await interp.hooks.before_send_events(interp.ctx, events)


def _sent(
    interp: Interpreter, step_id: str, now: float, *, output: str | None = None, error: str | None = None
) -> StepRow:
    """The memo of a ``send_event`` step: completed with the event ids (``output``)
    or failed (``error``)."""
    return StepRow(
        run_id=interp.run_id,
        step_id=step_id,
        position=interp._position(step_id),
        kind=StepKind.SEND,
        status=StepStatus.FAILED if error is not None else StepStatus.COMPLETED,
        attempts=1,
        output=output,
        error=error,
        started_at=now,
        ended_at=now,
        fingerprint=interp._fingerprint(step_id),
    )


async def send_event(interp: Interpreter, step_id: str, events: Event | Sequence[Event]) -> list[str]:
    """Ingest ``events`` in the same transaction as the step's memo: exactly once."""
    memo = interp._reach(step_id, StepKind.SEND)
    if memo is None and interp._unreached:  # a new step: judged before it executes
        await interp._judge(step_id)
    if memo is not None and memo.status in (StepStatus.COMPLETED, StepStatus.FAILED):
        return list(await interp._outcome(memo))
    now = interp.clock.now()
    await interp.journal.flush()
    try:
        events = await _outgoing(interp, [events] if isinstance(events, Event) else list(events))
        sent = interp.services.send(events, now)
    except StepstoneError as exc:
        info = error_info(exc)
        interp._save(_sent(interp, step_id, now, error=serde.dumps(info.to_json(), what="error")), None)
        raise StepError(step_id, info.type, info.message) from exc
    ids = sent.ids
    row = _sent(interp, step_id, now, output=serde.dumps(ids, what="event ids"))
    interp._save(row, None, interp.services.effect(sent))  # ids fixed: a repeated commit dedupes
    await interp.journal.flush()
    if interp.hooks.active:
        await interp.hooks.after_send_events(interp.ctx, ids)
    return ids
