"""The journal role: a leased run's writes under its fence (checkpoint, park,
end); and the operator actions on one run (replay, cancel)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from stepstone.store.rows import CancelFlag, Fence, QueueSpec, RunClosed, RunEnd, RunStatus, SpanRow, StepRow

T = TypeVar("T")


class JournalTx(Protocol):
    """Writes of a leased run under its fence: checkpoints, park and end (the
    executor's journal and the run lifecycle)."""

    def checkpoint(self, fence: Fence, steps: Sequence[StepRow], spans: Sequence[SpanRow]) -> CancelFlag:
        """Save step memos and trace spans. Raises ``LeaseLostError`` if the
        fence no longer holds (heartbeats extend leases, not checkpoints; on
        PostgreSQL the error may come when the transaction commits). Returns
        a function telling, once committed, whether the run's cancellation
        was requested."""
        ...

    def save_steps(self, steps: Sequence[StepRow], spans: Sequence[SpanRow]) -> None:
        """Upsert step memos and append spans (unfenced: operator actions)."""
        ...

    def reschedule(
        self,
        fence: Fence,
        status: RunStatus,
        available_at: float | None,
        attempt: int | None,
        now: float,
    ) -> bool:
        """Release the lease and park the run until ``available_at`` (``None``: until
        something wakes it) with the given status; if a wake-up was requested
        while the run was leased, it is due ``now`` instead. Records
        ``fence.token`` as the run's ``written_by``. Returns ``True`` when a
        cancel was requested while the run was leased: the run is then left
        due now, not parked, and the caller must end it cancelled in the same
        transaction (``lifecycle.park_run``)."""
        ...

    def finish_run(self, end: RunEnd) -> bool:
        """End the run and drop its queue item; returns ``False`` if it had ended.
        Records ``end.fence.token`` as the run's ``written_by``."""
        ...

    def close_run(self, end: RunEnd, waited_event: str) -> RunClosed | None:
        """``finish_run``, then drop the run's own waits; returns ``None`` if it
        had ended (its waits are then left alone), else whether a parent waits
        on it and whether a wait listens for ``waited_event``. As few
        statements as the dialect allows: one for a held run on PostgreSQL."""
        ...

    def written_by(self, run_id: str) -> str | None:
        """The token of the fence whose park or end last wrote the run."""
        ...

    def user_sql(self, fn: Callable[[Any], T], seconds: float) -> T:
        """``fn(connection)`` in a savepoint of this transaction, bounded to
        ``seconds`` (``store/usertx.py``): if it raises or runs too long, its
        writes are rolled back and the error is raised; else they commit with
        the transaction."""
        ...


class ActionsTx(Protocol):
    """Operator actions on a run: replay, cancel."""

    def requeue_run(self, run_id: str, now: float, reset_steps: Sequence[str] | None) -> None:
        """Put an ended run back in the queue (replay). ``reset_steps`` lists step
        ids to forget (failed ones, or every step from a rerun point)."""
        ...

    def queue_spec(self, run_id: str) -> QueueSpec | None:
        """Where the run was placed in the queue when it was created (partition,
        concurrency keys, throttle key); ``None`` if not recorded."""
        ...

    def lock_lease(self, run_id: str, now: float) -> bool:
        """Whether a worker holds a live lease on the run at ``now``, for a writer
        about to act on the answer: the queue item stays locked until the
        transaction ends, and one a lease pass holds is waited for, so the
        answer cannot change before the caller acts on it."""
        ...

    def flag_cancel(self, run_id: str, now: float, reason: str | None = None) -> bool:
        """If a worker holds a live lease on the run at ``now``, ask it to cancel
        the run at its next step boundary or park, for ``reason`` (an ErrorInfo
        as JSON; the first reason given stays), and return ``True``. Otherwise
        flag nothing and return ``False``: the caller ends the run itself."""
        ...

    def cancel_reason(self, run_id: str) -> str | None:
        """The reason a pending cancel was flagged with (JSON), if any."""
        ...
