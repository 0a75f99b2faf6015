"""One attempt of a ``step.transaction``, as the write its journal commits.

``step.run`` executes its function, then commits the memo: a crash between
the two repeats the side effect. A transaction step closes that gap for writes
to the Stepstone database itself: the user's function runs *inside* the
fenced transaction that writes the step's memo (``RunJournal.apply_step``), in
a savepoint (``store/usertx.py``), so the user's rows and the completed memo
commit together or not at all. If the fence fails, nothing of it commits.

Everything that decides the memo's value happens inside that transaction:
the function's result is JSON-encoded and passed through ``transform_output``
middleware (which must therefore be synchronous: encryption is) before the
savepoint is released, so a result that cannot be stored rolls the user's
writes back too. A failure is returned, not raised, so that the rest of the
commit (earlier staged memos, the fence) still lands; the interpreter then
records the failed attempt as for ``step.run``.

A commit whose answer was lost (the connection died at ``COMMIT``) is retried
by the journal; the retry first looks for the memo this attempt wrote, so the
function never runs again once its transaction committed.
"""

from __future__ import annotations

import contextvars
import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from stepstone import limits, serde
from stepstone.clock import Clock
from stepstone.middleware import Hooks
from stepstone.store.base import Tx
from stepstone.store.rows import StepRow, StepStatus

if TYPE_CHECKING:
    from stepstone.runstate import StateBudget  # a layer above: handed in by the interpreter


class TransactionCommit:
    """The journal's final write for one attempt: returns the completed memo,
    or the exception that rolled the function's writes back."""

    site = "transaction"  # its fault-injection name (store/faults.py)
    user_sql = True  # never pipelined (store/postgres.py)

    def __init__(
        self,
        *,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        row: StepRow,
        clock: Clock,
        hooks: Hooks,
        ctx: Any,
        budget: StateBudget | None = None,
    ) -> None:
        self.fn, self.args, self.row = fn, args, row
        self.context = contextvars.copy_context()  # the step's scope, for the writer's thread
        self.clock, self.hooks, self.ctx = clock, hooks, ctx
        self.budget = budget  # the run's max_state: an output past it rolls the writes back
        self.charged = 0  # bytes this attempt counted in ``budget`` (taken back if not recorded)
        self.encoded = "null"  # the result as JSON, before transform_output
        self._attempted = False

    def __call__(self, tx: Tx) -> StepRow | Exception:
        if self._attempted:  # a repeat: the first one may have committed
            landed = tx.get_step(self.row.run_id, self.row.step_id)
            if landed is not None and self._is_mine(landed):
                return landed
        self._attempted = True
        self.refund()  # a repeat whose first try did not land
        try:
            stored = tx.user_sql(self._execute, limits.MAX_TRANSACTION_SECONDS)
        except Exception as exc:  # noqa: BLE001 - the attempt's failure, recorded by the interpreter
            self.refund()
            return exc
        row = dataclasses.replace(self.row, output=stored, ended_at=self.clock.now())
        tx.save_steps([row], [])
        return row

    def _is_mine(self, memo: StepRow) -> bool:
        return memo.status == StepStatus.COMPLETED and memo.attempts == self.row.attempts

    def _execute(self, conn: Any) -> str:
        """The function's result, as stored (inside the savepoint: a result
        that cannot be stored rolls the writes back)."""
        what = f"step {self.row.step_id!r} output"
        result = self.context.run(self.fn, conn, *self.args)
        self.encoded = stored = serde.dumps(result, what=what, limit=limits.MAX_STEP_OUTPUT_BYTES)
        if self.hooks.has("transform_output"):
            kept = self.hooks.transform_output_now(self.ctx, serde.loads(self.encoded), self.row.step_id)
            stored = serde.dumps(kept, what=what, limit=limits.MAX_STEP_OUTPUT_BYTES)
        if self.budget is not None:  # counted now: a parallel step checks against it at once
            self.charged = self.budget.charge(self.row.step_id, stored)
        return stored

    def refund(self) -> None:
        """Take back this attempt's charge: its output was not recorded."""
        if self.budget is not None and self.charged:
            self.budget.refund(self.charged)
        self.charged = 0
