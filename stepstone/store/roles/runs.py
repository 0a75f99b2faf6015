"""The runs role: events and runs, and the records of a run every reader reads."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from stepstone.store.rows import (
    EventRow,
    LeaseTerms,
    NewEvent,
    NewRun,
    Recorded,
    RunFilter,
    RunRead,
    RunRow,
    SpanRow,
    StepRow,
)


class RunsTx(Protocol):
    """Events, runs and a run's records: what ingestion writes and every reader reads."""

    def insert_event(self, event: NewEvent) -> int:
        """Append ``event`` to the log; returns its sequence number."""
        ...

    def record_event(self, event: NewEvent, dedupe_until: float) -> int | None:
        """``insert_event`` if the event's id can be claimed (``FlowTx.claim_key``
        of ``event:<id>``) until ``dedupe_until``; ``None``, writing nothing, if
        a live claim holds it (the same event id seen before). PostgreSQL: one
        statement."""
        ...

    def create_run(self, run: NewRun) -> None:
        """Insert a run, its links to events and (unless it ended) its queue item."""
        ...

    def record_event_starting(
        self, event: NewEvent, dedupe_until: float, run: NewRun, lease: LeaseTerms | None = None
    ) -> Callable[[], Recorded]:
        """A send's one event and the one queued run it starts (``run``: its only
        event is ``event``, whose seq it does not know: ``event_seqs`` empty):
        ``record_event``, then ``create_run`` if the event was written; but
        nothing at all if a wait is on the event's name (a ``wait_keys`` row:
        the waits it may resolve are read and claimed by ``ingest``, so the
        caller sends it again the usual way). Given when called: the event's
        seq (``None``: not written), whether it was awaited, and the run if it
        was written taken. PostgreSQL: nothing is read before the ``COMMIT``
        (the event and the run's row in one statement, the run's queue item
        written only if the row was).

        ``lease`` (a send's direct start: ``run`` starts at once on a local
        worker, ``leasing.starts_now``): unless a due item of its partition
        waits (``QueueTx.due_ahead``), the run is written already taken on
        those terms, as ``QueueTx.take_in_order_later`` with its settle would
        leave it (the run's status, start time, version and epoch; its item's
        owner, lease, epoch and clocks; its partition's hint), nothing updated
        after; else queued, as without ``lease``. PostgreSQL: one statement,
        its queue item in it."""
        ...

    def get_run(self, run_id: str) -> RunRow | None:
        """The run, or ``None`` if there is no such run."""
        ...

    def lock_run(self, run_id: str) -> RunRow | None:
        """``get_run``, its row locked until the transaction ends (PostgreSQL: a
        writer that read it first, such as a prune deleting it, is waited for):
        what an operator's action reads before it writes."""
        ...

    def get_steps(self, run_id: str) -> list[StepRow]:
        """The run's step memos, in the order they were first recorded."""
        ...

    def runs_page(self, where: RunFilter) -> tuple[list[RunRow], dict[str, list[StepRow]]]:
        """``list_runs`` and ``steps_of_runs`` of its runs, read in one snapshot;
        on PostgreSQL, for a list by event, the two reads go out together: one
        round trip."""
        ...

    def ended_run(self, run_id: str) -> tuple[RunRow | None, list[StepRow] | None]:
        """The run and, once it has ended (``ENDED_STATUSES``), its steps; while
        it has not, ``None`` for them (not read). On PostgreSQL the two reads
        go out together: one round trip (what ``runs.wait`` polls)."""
        ...

    def ended_run_later(self, run_id: str) -> Callable[[], RunRead]:
        """``ended_run``, sent now and read when the returned function is called:
        on PostgreSQL, after the transaction's ``COMMIT`` (no round trip of its
        own). A run's end reads itself back this way for a waiter in its
        process (``runs.wait``), which then reads nothing, unless what the end
        wrote is the whole run (``executor._finish``)."""
        ...

    def steps_of_runs(self, run_ids: Sequence[str]) -> dict[str, list[StepRow]]:
        """``get_steps`` of several runs at once (every id is a key)."""
        ...

    def get_step(self, run_id: str, step_id: str) -> StepRow | None:
        """One step memo of the run, or ``None``."""
        ...

    def step_outputs(self, run_id: str, first: int, last: int) -> dict[str, str | None]:
        """The outputs of the run's completed steps at positions ``first`` to
        ``last`` (inclusive), by step id: one page of a lazy replay."""
        ...

    def get_events(self, run_id: str) -> list[EventRow]:
        """The events that started the run, in order."""
        ...

    def list_runs(self, where: RunFilter) -> list[RunRow]:
        """Newest first; ``before_id`` continues a previous page."""
        ...

    def get_spans(self, run_id: str) -> list[SpanRow]:
        """The run's trace spans, oldest first."""
        ...
