"""The interpreter's collaborators, as protocols it is handed: the ``Journal``
where it stages memo writes (the executor's ``RunJournal`` commits them) and
the ``Services`` that orchestration steps need (the executor's ``ExecEnv``:
functions, wait rows, child runs, sent events). The interpreter does no I/O
of its own; these are its only way out."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from stepstone.events import Event
from stepstone.function import FunctionDef
from stepstone.registry import Registry
from stepstone.store.base import Tx
from stepstone.store.rows import SpanRow, StepRow, WaitRow

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


# Inside a transaction, with the functions that events may trigger.
Ingest = Callable[[Tx, Registry], object]
# ... and the child's run id; returns the run id (or the pending debounce or
# batch run the child joined), or ``None`` when an idempotency key started none.
StartChild = Callable[[Tx, Registry, str], str | None]


class Services(Protocol):
    """What orchestration steps need beyond memos, supplied by the executor: the
    functions a step can invoke, and the parts of the effects a step commits
    with its memo (a wait row, a child run, sent events). The interpreter stages
    those effects; it never ingests events or admits runs itself."""

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

    def begin_wait(self, tx: Tx, waits: Sequence[WaitRow], since: float | None, now: float) -> None:
        """In the transaction of its memo, start a ``wait_for_event`` step's wait
        (a row per name), or resolve the step at once with the oldest event of
        its names and condition committed since ``since`` (``lookback``)."""
        ...

    def send(self, events: Event | Sequence[Event], now: float) -> tuple[list[str], Ingest]:
        """Validate and encode ``events`` (raises ``StepstoneError`` if one is bad);
        returns their ids, fixed now, and what ingests them inside a transaction."""
        ...

    def start_child(
        self, target: FunctionDef, data: dict[str, Any], now: float, parent: tuple[str, str]
    ) -> StartChild:
        """Encode the invoke event of ``parent`` (run id, step id) now (raises
        ``LimitExceededError`` when its data is too large); returns what, inside a
        transaction, records it and starts ``target``'s run with the given id."""
        ...
