"""``app.check``: replay in-flight runs against the code loaded now, before a deploy.

Each run's handler is replayed through the same ``Interpreter`` a worker uses,
with a ``_Replay`` that stops a branch at its frontier (the first step the
history holds no result for) instead of executing it. Nothing is executed,
slept or written: the journal and the services handed to the interpreter
refuse every write, so a step that would run, a wait that would be inserted or
an event that would be sent is a bug here, not a silent side effect. The
handler's own code between steps does run, on the recorded data: it is the
user's deterministic code, and a crash there is what ``error`` reports.

Runs are read a page at a time (three statements per page: runs, their events,
their steps) and replayed in-process; ``divergence.classify`` decides.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from stepstone.clock import Clock
from stepstone.divergence import Divergence, ReplayOutcome, classify
from stepstone.events import Event
from stepstone.executor import _call_handler, _context, _events
from stepstone.function import FunctionDef
from stepstone.interpreter import Interpreter
from stepstone.memos import mismatch
from stepstone.middleware import Hooks, Middleware
from stepstone.registry import Registry
from stepstone.services import Effect
from stepstone.store.base import Store, Tx
from stepstone.store.rows import (
    ACTIVE_STATUSES,
    DivergenceReason,
    LeasedRun,
    RunHistory,
    SpanRow,
    StepKind,
    StepRow,
    StepStatus,
    WaitRow,
)
from stepstone.wire import EffectRecord, SendEvents

PAGE = 500  # runs per read: three statements each, whatever the page holds
# The statuses of an in-flight run: a status added to ACTIVE_STATUSES is checked too.
CHECKED_STATUSES = ACTIVE_STATUSES
_SETTLED = (StepStatus.COMPLETED, StepStatus.FAILED)


@dataclass(frozen=True, kw_only=True)
class CheckReport:
    """What ``app.check`` found (``ss.CheckReport``)."""

    runs_checked: int
    incompatible: list[Divergence] = field(default_factory=list)
    functions: dict[str, int] = field(default_factory=dict)  #: runs checked per function id

    @property
    def ok(self) -> bool:
        return not self.incompatible

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "runs_checked": self.runs_checked,
            "functions": dict(self.functions),
            "incompatible": [d.to_json() for d in self.incompatible],
        }


class _Frontier(BaseException):
    """A branch of the replay reached a step its history holds no result for."""


class _Refused(RuntimeError):
    def __init__(self, what: str) -> None:
        super().__init__(f"app.check must not {what}")


class _ReadOnlyJournal:
    """The ``Journal`` of a check: a replay that stops at its frontier stages nothing."""

    def stage(self, step: StepRow, span: SpanRow | None, effect: Effect | None = None) -> None:
        raise _Refused("record a step")

    async def flush(self) -> None:
        raise _Refused("commit")

    async def apply(self, op: Callable[[Tx], Any]) -> Any:
        raise _Refused("commit")

    async def apply_step(self, op: Callable[[Tx], Any]) -> Any:
        raise _Refused("commit a step")  # step.transaction (issue 15), once merged

    def warn(self, name: str, message: str) -> None:
        """The interpreter's own nondeterminism warning: the report says it better."""


class _NoServices:
    """The ``Services`` of a check: orchestration steps stop at the frontier first."""

    def function(self, ref: str | Callable[..., Any]) -> FunctionDef | None:
        raise _Refused("invoke a function")

    def matcher(self) -> Registry:
        raise _Refused("send events")

    def wait_row(self, **_: Any) -> WaitRow:
        raise _Refused("start a wait")

    def send(self, events: Event | Sequence[Event], now: float) -> SendEvents:
        raise _Refused("send events")

    def effect(self, record: EffectRecord) -> Effect:
        raise _Refused("write an effect")


class _Replay(Interpreter):
    """The interpreter, stopping each branch at its frontier and noting why."""

    def __init__(self, *, sync: bool, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.frontier: list[str] = []  # the unrecorded steps branches reached
        self.changed: tuple[str, str] | None = None
        self.late: tuple[str, str] | None = None
        self._sync = sync
        # step id -> the thread that called it (def handlers): the Thread object, as a
        # finished thread's identifier is handed to the next thread started
        self._claimed_in: dict[str, threading.Thread] = {}
        self._last: dict[object, StepRow] = {}  # branch -> the latest recorded step it reached

    def claim_id(self, base: str) -> str:
        step_id = super().claim_id(base)
        if self._sync:  # a plain def handler's steps are called from its threads
            self._claimed_in[step_id] = threading.current_thread()
        return step_id

    def _reach(self, step_id: str, kind: StepKind, fingerprint: str | None = None) -> StepRow | None:
        recorded = self.memo.get(step_id)
        why = None if recorded is None else mismatch(recorded, kind, fingerprint)
        if why is not None:
            self.changed = self.changed or (step_id, why)
            raise _Frontier()
        memo = super()._reach(step_id, kind, fingerprint)
        if memo is None:
            self.frontier.append(step_id)
        else:
            self._in_order(memo)
        if memo is None or memo.status not in _SETTLED:
            raise _Frontier()  # a new step, or a recorded one still unfinished
        return memo

    def _in_order(self, memo: StepRow) -> None:
        """Note a recorded step reached before one recorded earlier in its branch."""
        branch = self._claimed_in.get(memo.step_id) if self._sync else asyncio.current_task()
        last = self._last.get(branch)
        if last is not None and memo.position < last.position:
            self.late = self.late or (memo.step_id, last.step_id)
        elif last is None or memo.position > last.position:
            self._last[branch] = memo

    def outcome(self, history: RunHistory, error: BaseException | None) -> ReplayOutcome:
        return ReplayOutcome(
            run_id=history.run.id,
            function_id=history.run.function_id,
            unreached=dict(self._unreached),
            frontier=tuple(self.frontier),
            changed=self.changed,
            late=self.late,
            error=error,
        )


@dataclass(frozen=True)
class Checker:
    """Replays histories against the functions of one app."""

    registry: Registry
    middleware: tuple[Middleware, ...]
    clock: Clock
    threads: Executor

    async def replay(self, history: RunHistory) -> Divergence | None:
        """The divergence of one run's history from the code, or ``None``."""
        fn = self.registry.get(history.run.function_id)
        if fn is None:
            return _unknown(history)
        leased = LeasedRun(run=history.run, epoch=0, events=history.events, steps=history.steps)
        interp = _Replay(
            run_id=history.run.id,
            steps=history.steps,
            journal=_ReadOnlyJournal(),
            clock=self.clock,
            retries=fn.retries,
            backoff=fn.backoff,
            threads=self.threads,
            services=_NoServices(),
            sync=not fn.is_async,
        )
        ctx = _context(fn, leased, _events(leased), interp)
        error: BaseException | None = None
        try:
            await self._reveal(fn, ctx, interp)
            await _call_handler(fn, ctx, interp, self.threads)
        except _Frontier:
            pass
        except Exception as exc:  # noqa: BLE001 - the new code crashed on the recorded data
            error = exc
        await interp.settle()
        return classify(interp.outcome(history, error))

    async def _reveal(self, fn: FunctionDef, ctx: Any, interp: Interpreter) -> None:
        """Recorded outputs as the handler sees them (decrypted by middleware)."""
        hooks = Hooks((*self.middleware, *fn.middleware))
        if hooks.has("transform_input"):
            interp.memo_values = await hooks.transform_input(ctx, await interp.recorded_values())

    async def check(self, histories: AsyncIterator[RunHistory], function_ids: Sequence[str]) -> CheckReport:
        """Replay each history of ``function_ids``; runs never started are not counted."""
        functions = dict.fromkeys(function_ids, 0)
        incompatible: list[Divergence] = []
        async for history in histories:
            if not history.steps or history.run.function_id not in functions:
                continue  # never started: it will simply run the new code
            functions[history.run.function_id] += 1
            found = await self.replay(history)
            if found is not None:
                incompatible.append(found)
        return CheckReport(
            runs_checked=sum(functions.values()), incompatible=incompatible, functions=functions
        )


async def _listed(histories: Sequence[RunHistory]) -> AsyncIterator[RunHistory]:
    for history in histories:
        yield history


async def _stored(store: Store, function_ids: Sequence[str]) -> AsyncIterator[RunHistory]:
    """The in-flight runs of ``function_ids``, a page (three statements) at a time."""
    after: str | None = None
    while True:
        page = await store.read(_page_op(function_ids, after))
        for history in page:
            yield history
        if len(page) < PAGE:
            return
        after = page[-1].run.id


def _page_op(function_ids: Sequence[str], after: str | None) -> Callable[[Tx], list[RunHistory]]:
    def op(tx: Tx) -> list[RunHistory]:
        return tx.run_histories(function_ids, CHECKED_STATUSES, after, PAGE)

    return op


def _unknown(history: RunHistory) -> Divergence:
    return Divergence(
        run_id=history.run.id,
        function_id=history.run.function_id,
        reason=DivergenceReason.ERROR,
        missing=[s.step_id for s in history.steps if s.kind != StepKind.PATCH],
        message=f"this app has no function {history.run.function_id!r}",
    )


async def check_app(
    registry: Registry,
    middleware: tuple[Middleware, ...],
    clock: Clock,
    store: Callable[[], Store],
    function_ids: Sequence[str],
    histories: Sequence[RunHistory] | None,
) -> CheckReport:
    """``app.check``'s body: exported ``histories`` if given, else the store's runs.
    A history of a function this app does not define is reported as ``error``."""
    with ThreadPoolExecutor(max_workers=4, thread_name_prefix="stepstone-check") as threads:
        checker = Checker(registry, middleware, clock, threads)
        if histories is None:
            return await checker.check(_stored(store(), function_ids), function_ids)
        ids = [
            *function_ids,
            *(h.run.function_id for h in histories if registry.get(h.run.function_id) is None),
        ]
        return await checker.check(_listed(histories), list(dict.fromkeys(ids)))
