"""The waits role: waits for events, cancellations and invoked children, and
the wake-ups they cause."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from stepstone.store.rows import EventRow, StepStatus, WaitRow


class WaitsTx(Protocol):
    """Waits for events, cancellations and invoked children, and the wake-ups they cause."""

    def insert_wait(self, wait: WaitRow) -> None:
        """Start waiting; events received after this commit can resolve it. A
        step has at most one wait: if it has one already (a repeated commit),
        nothing changes. Its ``also_match`` values are written too (rows that
        only index it)."""
        ...

    def start_wait(self, wait: WaitRow) -> Callable[[], bool]:
        """A step starts waiting: insert its wait only while the step (already
        written in this transaction) is ``waiting`` and has no wait, so that a
        repeated commit inserts nothing, even after the wait was resolved. The
        returned function says whether it inserted (on PostgreSQL, reading it
        costs a round trip; not reading costs none)."""
        ...

    def set_wait_match(self, run_id: str, step_id: str, match_value: str) -> None:
        """Point a step's wait at another value (an invoke's actual child run)."""
        ...

    def wait_keys(self, event_name: str) -> list[str]:
        """The match keys in use by waits on ``event_name`` ('' for unindexed)."""
        ...

    def wait_keys_later(self, event_name: str) -> Callable[[], list[str]]:
        """``wait_keys``, its answer read when the returned function is called:
        where statements are pipelined (PostgreSQL) the read is sent now and
        shares the round trip of the next statement whose result is read (a
        send's ``record_event``); elsewhere it runs at the call."""
        ...

    def match_waits(self, event_name: str, match_key: str, match_value: str, now: float) -> list[WaitRow]:
        """Unexpired waits on ``event_name`` whose key equals ``match_value``."""
        ...

    def wait_key_version(self, event_name: str, match_key: str) -> tuple[int, str] | None:
        """The key row's (version, born): how many waits took it, in commit
        order, and a token naming this incarnation of the row (retention may
        delete an unused key, a later wait re-create it); ``None`` if absent."""
        ...

    def unindexed_waits_after(self, event_name: str, version: int, now: float) -> list[WaitRow]:
        """Unexpired unindexed waits (``match_key`` '') on ``event_name`` that
        took the key after ``version`` (committed since it was read), oldest first."""
        ...

    def match_any_waits(
        self, event_name: str, match_key: str, match_values: Sequence[str], now: float
    ) -> list[WaitRow]:
        """Unexpired waits on ``event_name`` with one of ``match_values`` under
        ``match_key`` (in one statement), oldest first. A wait stored with
        several values (``WaitRow.also_match``) comes once per value matched."""
        ...

    def match_range_waits(
        self, event_name: str, match_key: str, low: float, high: float, now: float
    ) -> list[WaitRow]:
        """Unexpired waits on ``event_name`` under ``match_key`` whose
        ``match_number`` lies in ``[low, high]`` (infinite bounds allowed), oldest first."""
        ...

    def claim_wait(self, wait_id: int) -> bool:
        """Delete one wait; ``True`` only for the caller that deleted it."""
        ...

    def claim_step_waits(self, run_id: str, step_id: str) -> bool:
        """Delete a step's waits; ``True`` if any was still there (timeouts)."""
        ...

    def delete_run_waits(self, run_id: str) -> None:
        """Delete every wait of a run (it ended)."""
        ...

    def child_waits(self, child_run_id: str) -> list[WaitRow]:
        """Parents' ``invoke`` waits on a child run."""
        ...

    def complete_waiting_step(
        self, run_id: str, step_id: str, status: StepStatus, output: str | None, error: str | None, now: float
    ) -> bool:
        """Resolve a ``waiting`` step memo; ``False`` if it was not waiting."""
        ...

    def wake_run(self, run_id: str, now: float) -> None:
        """Make a parked run due now. While an owner is recorded, even one whose
        lease lapsed, also ask that its park make the run due at once."""
        ...

    def events_since(self, names: Sequence[str], since: float, now: float, limit: int) -> list[EventRow]:
        """At most ``limit`` events named one of ``names`` committed between
        ``since`` and ``now`` (``received_at``), oldest first."""
        ...
