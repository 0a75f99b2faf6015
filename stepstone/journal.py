"""The run journal: staged step writes, committed under the run's lease fence.

The interpreter stages a step's memo when the step ends; the journal commits
it before the next step starts (``flush``) or together with the invocation's
final write, so a three-step run costs one commit per step, the last one also
ending the run. A staged memo may carry an *effect* (insert a wait, start an
invoked run, ingest sent events) that commits in the same transaction, which
is what makes those effects happen exactly once. Every commit re-checks the
fence. A commit whose outcome is unknown (the connection died at ``COMMIT``) is
retried, so every commit is safe to repeat: effects are keyed by run and step,
and a park or end recognises its own earlier success (``commit``).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from stepstone import metrics
from stepstone.clock import Clock
from stepstone.errors import LeaseLostError, StoreUnavailableError
from stepstone.services import Effect
from stepstone.signals import CancelSignal, LeaseLostSignal
from stepstone.store import faults
from stepstone.store.base import Store, Tx
from stepstone.store.rows import Fence, SpanRow, StepKind, StepRow

if TYPE_CHECKING:
    from stepstone.interpreter import Interpreter

# Characters of outputs and errors a journal keeps for its run's end (``written``):
# past them, the end's transaction reads the run's steps back for a waiter.
KEPT_FOR_THE_END = 1 << 20


def warning_span(run_id: str, name: str, message: str, now: float) -> SpanRow:
    """A warning in a run's trace (nondeterminism, an endpoint unavailable, ...)."""
    return SpanRow(
        run_id=run_id,
        kind="warning",
        name=name,
        started_at=now,
        ended_at=now,
        status="warning",
        detail=message,
    )


class RunJournal:
    def __init__(
        self,
        store: Store,
        fence: Fence,
        clock: Clock,
        held: Callable[[], bool] = lambda: True,
        *,
        keep_written: bool = False,
    ) -> None:
        self.store = store
        self.fence = fence
        self.clock = clock
        self.held = held  # whether the lease is still known to be live
        self.steps: list[StepRow] = []
        self.spans: list[SpanRow] = []
        self.effects: list[Effect] = []
        self.cancel_requested = False
        self.lease_lost = False
        self.failure: BaseException | None = None
        self.function_id = ""  # for metrics; set by the executor
        self._commits: list[tuple[asyncio.Future[Any], Callable[[Tx], Any]]] = []
        # Every memo staged, by step id, while they may be the run's whole history
        # (``written``); ``None`` once they may not be, or if not asked for.
        self._written: dict[str, StepRow] | None = {} if keep_written else None
        self._kept = 0  # characters of output and error in ``_written``

    def bind(self, interp: Interpreter) -> None:
        """Nothing to keep: a worker's journal commits as the interpreter goes."""

    def written(self) -> list[StepRow] | None:
        """The run's steps as this invocation staged them, in order, if they are
        all it has: it had none before (``keep_written``: the executor asks only
        then, and only for a run a waiter watches as the invocation begins) and
        only ``step.run`` memos were staged, which only the run's holder writes
        (a wait's or an invoke's memo is resolved by other transactions, a
        ``step.transaction``'s written by its own operation). Once every commit
        landed, they are the stored rows. ``None`` otherwise, or past
        ``KEPT_FOR_THE_END``."""
        written = self._written
        return None if written is None else sorted(written.values(), key=_position)

    # -- Journal protocol (used by the interpreter) ---------------------------------
    def stage(self, step: StepRow, span: SpanRow | None, effect: Effect | None = None) -> None:
        self.steps.append(step)
        if self._written is not None:
            self._kept += len(step.output or "") + len(step.error or "")
            if step.kind == StepKind.RUN and self._kept <= KEPT_FOR_THE_END:
                self._written[step.step_id] = step
            else:
                self._written = None
        if step.kind == "run" and step.started_at is not None and step.ended_at is not None:
            metrics.step_finished(self.function_id, step.ended_at - step.started_at)
        if span is not None:
            self.spans.append(span)
        if effect is not None:
            self.effects.append(effect)

    def warn(self, name: str, message: str) -> None:
        self.spans.append(warning_span(self.fence.run_id, name, message, self.clock.now()))

    async def flush(self) -> None:
        """Commit what is staged (and wait for commits already under way) before
        a step's side effect. A lease no longer known to be live stops the
        invocation here: another worker may have taken the run and completed
        the step this one is about to start (a worker paused past its lease)."""
        if self.steps or self.spans or self.effects:
            op = self._staged_op(None)
            # The store's own future, not a task: a sequential step costs one
            # event-loop round trip for its commit.
            self._commits.append((self.store.submit(op), op))
        if self._commits or self.failure is not None:
            await self._settle_commits()
        if not self.held():
            self.lease_lost = True
        if self.lease_lost:
            raise LeaseLostSignal()
        if self.cancel_requested:
            raise CancelSignal()

    async def apply(self, op: Callable[[Tx], Any]) -> Any:
        """Commit staged writes and then ``op``, in one fenced transaction, now."""
        self._written = None  # (``op`` may write or resolve a memo)
        await self._settle_commits()
        if self.lease_lost:
            raise LeaseLostSignal()
        return await self.commit(self._staged_op(op))

    async def apply_step(self, op: Callable[[Tx], Any]) -> Any:
        """``apply`` for an ``op`` that writes a step's memo itself
        (``step.transaction``): as after any checkpoint, a cancel the fence
        reports stops the invocation before the next step."""
        self._written = None
        await self._settle_commits()
        if self.lease_lost:
            raise LeaseLostSignal()
        staged = self._staged_op(op)
        staged.keep_flag = True
        cancel, value = await self.commit(staged)
        if cancel():
            self.cancel_requested = True
        return value

    async def finish(self, final: Callable[[Tx], Any]) -> Any:
        """Commit staged writes and the invocation's final write in one
        transaction. ``final`` (a park or an end) is fenced itself: the staged
        memos are saved without a fence check of their own, and the whole
        transaction rolls back if ``final`` finds the lease gone."""
        await self._settle_commits()
        if self.lease_lost:
            raise LeaseLostSignal()
        staged = self._staged_op(final)
        staged.fenced_by_then = True
        return await self.commit(staged)

    # -- internals ------------------------------------------------------------------
    def _staged_op(self, then: Callable[[Tx], Any] | None) -> _Staged:
        staged = _Staged(self.fence, self.steps, self.spans, self.effects, then)
        self.steps, self.spans, self.effects = [], [], []
        return staged

    async def _settle_commits(self) -> None:
        # Several parallel steps may wait on the same commits: whoever sees a
        # commit finish first records its result; everyone reads the flags.
        while self._commits:
            pending = list(self._commits)
            if len(pending) == 1:
                try:  # (``_outcome`` inline: a step's commit, one coroutine fewer)
                    results: list[Any] = [await pending[0][0]]
                except (Exception, LeaseLostSignal) as exc:  # noqa: BLE001 - handled below
                    results = [exc]
            else:
                results = await asyncio.gather(*(f for f, _ in pending), return_exceptions=True)
            for item, result in zip(pending, results, strict=True):
                if item not in self._commits:
                    continue
                self._commits.remove(item)
                if isinstance(result, StoreUnavailableError):
                    retry = self.commit(item[1], uncertain=True)
                    result = await _outcome(asyncio.ensure_future(retry))
                if isinstance(result, LeaseLostError | LeaseLostSignal):
                    self.lease_lost = True
                elif isinstance(result, BaseException):
                    self.failure = result
                elif result():  # the checkpoint's cancel flag
                    self.cancel_requested = True
        if self.failure is not None:
            raise self.failure

    async def commit(self, op: Callable[[Tx], Any], *, uncertain: bool = False) -> Any:
        """Run a fenced write, retrying while the database is unreachable; a
        write the fence refused raises ``LeaseLostSignal`` (the store's
        ``LeaseLostError`` ends here: above the journal, a lost lease is a signal).

        A failure may be ambiguous: the connection died at ``COMMIT``, which may
        have succeeded. Repeating a checkpoint is harmless (upserts, effects
        keyed by run and step); repeating a park or an end finds the lease
        released by the first attempt. Such a retry asks the run whether the
        first attempt was its own (``runs.written_by`` holds the fence's token):
        then the write is done and returns ``None``. ``uncertain``: an earlier
        attempt already failed that way."""
        delay = 0.05
        while True:
            if uncertain and isinstance(op, _Staged):
                op.fence_first = True  # (see ``_Staged.__call__``)
            try:
                return await self.store.transact(op)
            except StoreUnavailableError:
                uncertain = True
            except LeaseLostError as lost:
                if not uncertain or self.fence.token is None:
                    raise LeaseLostSignal() from lost
                landed = await self._landed()
                if landed:
                    return None
                if landed is not None:
                    raise LeaseLostSignal() from lost
                # unreachable again: cannot tell yet; retry, then ask again
            await asyncio.sleep(delay * (1 + random.random()))
            delay = min(delay * 2, 2.0)

    async def _landed(self) -> bool | None:
        """Whether this invocation's park or end committed (``None``: cannot tell now)."""
        run_id, token = self.fence.run_id, self.fence.token
        try:
            return bool(await self.store.read(lambda tx: tx.written_by(run_id) == token))
        except StoreUnavailableError:
            return None


class _Staged:
    """One fenced commit: the checkpoint of the staged memos and spans, their
    effects, then the invocation's final write (if any)."""

    __slots__ = (
        "effects",
        "fence",
        "fence_first",
        "fenced_by_then",
        "keep_flag",
        "spans",
        "steps",
        "then",
        "user_sql",
    )

    def __init__(
        self,
        fence: Fence,
        steps: list[StepRow],
        spans: list[SpanRow],
        effects: list[Effect],
        then: Callable[[Tx], Any] | None,
    ) -> None:
        self.fence, self.steps, self.spans, self.effects, self.then = fence, steps, spans, effects, then
        self.keep_flag = False  # return (cancel flag, the final write's value)
        self.fenced_by_then = False  # ``then`` checks the fence and ends the lease (park, end)
        self.fence_first = False  # a retry of a commit that may have landed: the fence before the effects
        # Whether the commit runs a user's SQL (never pipelined on PostgreSQL; asked
        # twice a commit there: an attribute, not a property)
        self.user_sql = bool(getattr(then, "user_sql", False))

    def __call__(self, tx: Tx) -> Any:
        """The fence first, then the effects, unless ``then`` checks it (one
        check, not two, on a park or an end). Not on a retry of a commit that
        may have landed (``fence_first``): its park or end may have released
        the lease and, for a cancelled run, deleted what made its effects
        repeatable (an invoke's wait, which keeps a second start from
        inserting the child run again); the fence refuses it before they run."""
        if self.fenced_by_then and not self.fence_first:
            assert self.then is not None and not self.keep_flag
            tx.save_steps(self.steps, self.spans)
            for effect in self.effects:
                effect(tx)
            return self.then(tx)
        cancel = tx.checkpoint(self.fence, self.steps, self.spans)
        for effect in self.effects:
            effect(tx)
        if self.then is None:
            return cancel
        value = self.then(tx)
        return (cancel, value) if self.keep_flag else value

    @property
    def site(self) -> str:
        """The commit's name for fault injection (``store/faults.py``)."""
        parts = ["checkpoint", *(faults.site(f) for f in self.effects)]
        if self.then is not None:
            parts.append(faults.site(self.then))
        return f"journal({'+'.join(parts)})"


def _position(step: StepRow) -> int:
    return step.position


async def _outcome(future: asyncio.Future[Any]) -> Any:
    """The future's result, or its exception (or a lost lease) as a value."""
    try:
        return await future
    except (Exception, LeaseLostSignal) as exc:  # noqa: BLE001 - handed back as a value
        return exc
