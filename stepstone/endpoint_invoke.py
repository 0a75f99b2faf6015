"""One invocation of a run inside an HTTP endpoint (``ss.serve``): the
handler replayed and executed as a worker does it (``executor.run_handler``),
but with nothing committed here, since the endpoint has no database.

The request carries the leased run (its row, events and memos, as stored:
encrypted outputs stay ciphertext, and the app's middleware opens them here).
Steps run back to back; each result is *staged* in an ``EndpointJournal``,
and the answer returns every staged memo, span and effect (``wire.py``) with
the ``Decision`` that ends the invocation, for the server to commit under its
lease's fence. The invocation ends where a worker's would (the run ends or
parks: a sleep, a wait, an invoke, a retry back-off), and also:

* when the time budget is nearly spent (``BUDGET_SHARE`` of ``max_duration``):
  no new step starts, and the run is parked to be called again at once;
* when a step needs the database mid-invocation (a wait past its timeout, a
  ``wait_for_signal`` taking a buffered signal): that operation is returned as
  ``deferred``; the server commits it with the memos and calls again.

``step.transaction`` cannot run here (its function needs the database
connection of the checkpoint): it fails with a ``NonRetriableError``.
Steps finished inside a request whose answer never reaches the server run
again on the next request (at-least-once within one request).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from stepstone.attempts import AbandonedThreads
from stepstone.catalog import rebuild
from stepstone.clock import Clock
from stepstone.effectops import BoundEffect
from stepstone.errors import ErrorInfo, NonRetriableError
from stepstone.executor import HostServices, failure_hook, run_handler
from stepstone.function import FunctionDef
from stepstone.journal import warning_span
from stepstone.middleware import Middleware
from stepstone.registry import Registry
from stepstone.runstate import DictMemos, MemoSource
from stepstone.services import Effect
from stepstone.signals import LeaseLostSignal
from stepstone.store.base import Tx
from stepstone.store.rows import LeasedRun, RunStatus, SpanRow, StepRow
from stepstone.wire import Answer, Decision, EffectRecord

if TYPE_CHECKING:
    from stepstone.interpreter import Interpreter

log = logging.getLogger("stepstone.endpoint")
BUDGET_SHARE = 0.8  # no step starts after this share of max_duration has passed
NO_TRANSACTION = (
    "step.transaction needs the Stepstone database, which an endpoint served over HTTP "
    "does not open; run this function in a worker (stepstone worker)"
)


def _record(op: Callable[[Tx], Any] | Effect) -> EffectRecord:
    if not isinstance(op, BoundEffect):  # every effect comes from HostServices.effect
        raise NonRetriableError(f"an operation an HTTP endpoint cannot send to the server: {op!r}")
    return op.record


class EndpointJournal:
    """The ``Journal`` of an endpoint: stages everything, commits nothing."""

    def __init__(self, run_id: str, clock: Clock, deadline: float) -> None:
        self.run_id = run_id
        self.clock = clock
        self.deadline = deadline  # time.monotonic() after which no step starts
        self.steps: list[StepRow] = []
        self.spans: list[SpanRow] = []
        self.effects: list[EffectRecord] = []
        self.deferred: EffectRecord | None = None
        self.lease_lost = False
        self.cancel_requested = False
        self._interp: Interpreter | None = None

    def bind(self, interp: Interpreter) -> None:
        self._interp = interp

    def _call_again(self) -> BaseException:
        assert self._interp is not None
        return self._interp._pause(self.clock.now(), RunStatus.RUNNING)

    def stage(self, step: StepRow, span: SpanRow | None, effect: Effect | None = None) -> None:
        self.steps.append(step)
        if span is not None:
            self.spans.append(span)
        if effect is not None:
            self.effects.append(_record(effect))

    def warn(self, name: str, message: str) -> None:
        self.spans.append(warning_span(self.run_id, name, message, self.clock.now()))

    async def flush(self) -> None:
        """Before a step's side effect: past the budget, end the request here."""
        if time.monotonic() >= self.deadline:
            raise self._call_again()

    async def apply(self, op: Callable[[Tx], Any]) -> Any:
        """An operation that needs the database now: the server commits it, then calls again."""
        if self.deferred is not None:  # a parallel branch deferred one already
            raise self._call_again()
        self.deferred = _record(op)
        raise self._call_again()

    async def apply_step(self, op: Callable[[Tx], Any]) -> Any:
        raise NonRetriableError(NO_TRANSACTION)


@dataclass
class EndpointEnv(HostServices):
    """The ``HandlerHost`` of an endpoint: the app's functions (an invoked
    function served elsewhere is known only by its id), no database."""

    registry: Registry
    clock: Clock
    threads: Executor
    middleware: tuple[Middleware, ...] = ()
    abandoned: AbandonedThreads = field(default_factory=AbandonedThreads)
    matcher: Callable[[], Registry] = field(init=False)

    def __post_init__(self) -> None:
        registry = self.registry
        self.matcher = lambda: registry

    def memos(self, leased: LeasedRun) -> MemoSource:
        """The request carries every recorded output."""
        return DictMemos.of(leased.steps)

    def function(self, ref: str | Callable[..., Any]) -> FunctionDef | None:
        found = super().function(ref)
        if found is None and isinstance(ref, str):
            return rebuild({"id": ref})  # the server resolves it from its catalog
        return found


async def invoke(leased: LeasedRun, request_id: str, env: EndpointEnv, max_duration: float) -> Answer:
    """Run one invocation of ``leased`` and return what the server must commit,
    as the answer to request ``request_id``."""
    journal = EndpointJournal(leased.run.id, env.clock, time.monotonic() + max_duration * BUDGET_SHARE)
    fn = env.registry.get(leased.run.function_id)
    if fn is None:
        error = ErrorInfo("UnknownFunction", f"no function {leased.run.function_id!r} at this endpoint")
        decision = Decision(status=RunStatus.FAILED, error=error)
    else:
        try:
            handled = await run_handler(fn, leased, journal, env)
        except LeaseLostSignal:  # never raised here: nothing is fenced in an endpoint
            raise RuntimeError("an endpoint's invocation lost a lease it never held") from None
        decision = handled.decision
        await failure_hook(handled, decision.status)
    return Answer(
        request_id=request_id,
        steps=tuple(journal.steps),
        spans=tuple(journal.spans),
        effects=tuple(journal.effects),
        decision=decision,
        deferred=journal.deferred,
    )
