"""The mailbox role: signals sent to a run (``app.runs.signal``), buffered
until a ``step.wait_for_signal`` receives each once, in the order sent."""

from __future__ import annotations

from typing import Protocol

from stepstone.store.rows import SignalRow, WaitRow


class MailboxTx(Protocol):
    """Signals sent to a run, buffered and received once each, in order."""

    def insert_signal(self, signal: SignalRow) -> None:
        """Record a signal sent to a run: buffered, or (``consumed_by`` set)
        delivered at once to the wait that claimed it in this transaction."""
        ...

    def take_signal(self, run_id: str, name: str, step_id: str, now: float) -> SignalRow | None:
        """Consume the run's oldest unconsumed signal of ``name`` for ``step_id``,
        only while that step (written in this transaction) is ``waiting``: a
        repeated commit of a step already completed takes none."""
        ...

    def signal_waits(self, run_id: str, name: str, now: float) -> list[WaitRow]:
        """The run's unexpired waits for a signal of ``name``, oldest first."""
        ...

    def run_signals(self, run_id: str) -> list[SignalRow]:
        """Every signal sent to the run, in the order sent."""
        ...
