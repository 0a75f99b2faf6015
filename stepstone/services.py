"""The interpreter's collaborators, as protocols it is handed: the ``Journal``
where it stages memo writes (the executor's ``RunJournal`` commits them) and
the ``Services`` that orchestration steps need (the executor's ``ExecEnv``:
functions, wait rows, and the store operation of each effect record). The interpreter does no I/O
of its own; these are its only way out."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from stepstone.events import Event
from stepstone.function import FunctionDef
from stepstone.registry import Registry
from stepstone.store.base import Tx
from stepstone.store.rows import SpanRow, StepRow, WaitRow
from stepstone.wire import EffectRecord, SendEvents

Effect = Callable[[Tx], Any]


class Journal(Protocol):
    """Where the interpreter stages writes; implemented by the executor."""

    def stage(self, step: StepRow, span: SpanRow | None, effect: Effect | None = None) -> None:
        """Stage a memo; ``effect`` runs in the same transaction as the memo write."""
        ...

    async def flush(self) -> None:
        """Commit staged writes; may raise ``CancelSignal`` or ``LeaseLostSignal``."""
        ...

    async def apply(self, op: Callable[[Tx], Any]) -> Any:
        """Commit staged writes and then ``op`` in one fenced transaction, now."""
        ...

    async def apply_step(self, op: Callable[[Tx], Any]) -> Any:
        """``apply`` for an ``op`` that writes a step's memo itself; may flag a
        cancel for the next ``flush``."""
        ...

    def warn(self, name: str, message: str) -> None:
        """Record a warning in the run's trace."""
        ...


class Services(Protocol):
    """What orchestration steps need beyond memos, supplied by the executor: the
    functions a step can invoke, and the store operations of the effects a step
    commits with its memo (``wire.py``'s records: a wait, a child run, sent
    events). The interpreter stages those; it never ingests events or admits
    runs itself, so the same records can travel over HTTP (``ss.serve``)."""

    def function(self, ref: str | Callable[..., Any]) -> FunctionDef | None:
        """Resolve a function id or decorated handler."""
        ...

    def matcher(self) -> Registry:
        """Every function known to the store, for the events a step sends."""
        ...

    def wait_row(
        self,
        *,
        run_id: str,
        step_id: str,
        event_name: str,
        condition: str | None,
        run_event: dict[str, Any] | None,
        now: float,
        expires_at: float | None,
    ) -> WaitRow:
        """The wait row of ``wait_for_event``; raises ``StepstoneError`` if
        ``condition`` is not a valid CEL condition."""
        ...

    def send(self, events: Event | Sequence[Event], now: float) -> SendEvents:
        """Validate and encode ``events`` (raises ``StepstoneError`` if one is bad),
        fixing their ids now: the record of what ingests them."""
        ...

    def effect(self, record: EffectRecord) -> Effect:
        """The store operation of an effect, run in the transaction of its
        step's memo (or, for a wait's timeout or a signal, committed at once
        through ``Journal.apply``); encoding errors raise now."""
        ...
