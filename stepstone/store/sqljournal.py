"""A held run's writes under its fence, over SQL (mixed into ``SqlTx``): the
checkpoint of its memos, its park and its end (``JournalTx``).

These are the statements every run pays for, so the dialect decides how few
there are. Where fence checks fail on the server (PostgreSQL), a checkpoint
of one memo is one statement (the fence and the upsert); where the database
has data-modifying CTEs, a held run's end is one statement (the fenced delete
of its queue item, the run's row, its waits, and what the end must still
resolve), and so is its park (the fenced release of its queue item, its
partition's hint, the run's row). Elsewhere (SQLite: in-process, each statement a function call) the
same work is a few statements, each written once in ``queries.sql``.

A pipelined transaction (PostgreSQL) would still wait for the end's row
before its ``COMMIT``: what the end must resolve decides what the caller
writes next. Most ends resolve nothing (no parent waiting, no wait for
``function.finished``, no concurrency slot to hand on), so where a
function's last end here was such an end, the next is sent unread
(``end_alone``) and the server checks the guess (``EndGuesses``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from stepstone.errors import LeaseLostError
from stepstone.store.rows import CancelFlag, Fence, RunClosed, RunEnd, SpanRow, StepRow
from stepstone.store.sqlbase import SqlPlumbing

ALONE = RunClosed(invoked=False, waited=False)  # an end that resolves nothing more than itself


class EndGuesses:
    """Which functions' runs are expected to end alone (resolve nothing more
    than themselves) in this process: those whose last end read here did.
    A wrong guess costs its transaction once (``PostgresStore._write`` marks
    the function and runs it again); shared by one store's transactions (a
    set's add and discard are atomic)."""

    def __init__(self) -> None:
        self._not_alone: set[str] = set()

    def alone(self, function_id: str) -> bool:
        return function_id not in self._not_alone

    def saw(self, function_id: str, alone: bool) -> None:
        if alone:
            self._not_alone.discard(function_id)
        else:
            self._not_alone.add(function_id)


class SqlJournal(SqlPlumbing):
    """Checkpoint, park and end of a held run (mixed into ``SqlTx``)."""

    # Set where an end may be sent unread (a pipelined PostgreSQL transaction):
    # the store's guesses, and the functions guessed in this transaction.
    end_guesses: EndGuesses | None = None
    guessed: list[str] | None = None

    def _released(self, row: Any, now: float) -> None:
        raise NotImplementedError  # SqlTx's: the queue's bookkeeping when an item is released

    def _fence(self, query: str, fence: Fence, **params: Any) -> Any:
        return self._exec(
            query, {"run_id": fence.run_id, "owner": fence.owner, "epoch": fence.epoch, **params}
        )

    def checkpoint(self, fence: Fence, steps: Sequence[StepRow], spans: Sequence[SpanRow]) -> CancelFlag:
        if self.dialect.fence_raises:
            # Not read here: a pipelined transaction sends the writes after it
            # without waiting, and the flag is read once the commit is back.
            held = {"fence_run_id": fence.run_id, "owner": fence.owner, "epoch": fence.epoch}
            if len(steps) == 1 and not spans:  # a step's checkpoint: one statement
                cursor = self._exec("fenced_step", {**_step_params(steps[0]), **held})
            else:
                cursor = self._exec("fence_or_raise", held)
                self.save_steps(steps, spans)
            return lambda: bool(cursor.fetchone()["cancel_requested"])
        row = self._fence("fence_check", fence).fetchone()
        if row is None:
            raise LeaseLostError(f"run {fence.run_id}: lease lost by {fence.owner}")
        self.save_steps(steps, spans)
        cancel = bool(row["cancel_requested"])
        return lambda: cancel

    def save_steps(self, steps: Sequence[StepRow], spans: Sequence[SpanRow]) -> None:
        for step in steps:
            self._exec("upsert_step", _step_params(step))
        for span in spans:
            self._exec(
                "insert_span",
                {
                    "run_id": span.run_id,
                    "kind": span.kind,
                    "name": span.name,
                    "attempt": span.attempt,
                    "started_at": span.started_at,
                    "ended_at": span.ended_at,
                    "status": span.status,
                    "error": span.error,
                    "detail": span.detail,
                },
            )

    def reschedule(
        self, fence: Fence, status: str, available_at: float | None, attempt: int | None, now: float
    ) -> bool:
        park = {"id": fence.run_id, "status": status, "attempt": attempt, "token": fence.token}
        if self.dialect.write_ctes:
            row = self._fence("park_held_run", fence, available_at=available_at, now=now, **park).fetchone()
            if row is None:
                raise LeaseLostError(f"run {fence.run_id}: lease lost by {fence.owner}")
            self._released({**dict(row), "available_at": None}, now)  # (its hint: lowered in the statement)
            return bool(row["cancel_requested"])
        row = self._fence("fence_park_wake", fence, available_at=available_at, now=now).fetchone()
        if row is None:
            raise LeaseLostError(f"run {fence.run_id}: lease lost by {fence.owner}")
        self._released(row, now)
        if row["cancel_requested"]:
            return True  # left due now; the caller ends it
        self._exec("park_run", park)
        return False

    def finish_run(self, end: RunEnd) -> bool:
        fence = end.fence
        if fence is not None:
            row = self._fence("fence_delete", fence).fetchone()
            if row is None:
                raise LeaseLostError(f"run {end.run_id}: lease lost by {fence.owner}")
        else:
            row = self._exec("delete_queue_item", {"run_id": end.run_id}).fetchone()
        self._released(row and {**dict(row), "available_at": None}, end.now)
        return int(self._exec("finish_run", _end_params(end)).rowcount) == 1

    def close_run(self, end: RunEnd, waited_event: str) -> RunClosed | None:
        run_id, fence = end.run_id, end.fence
        probe = {"child_run_id": run_id, "event_name": waited_event}
        if fence is not None and self.dialect.write_ctes:
            if self._guessed_alone(end.function_id):  # not read: SS002 aborts a wrong guess
                self._fence("end_alone", fence, **_end_params(end), **probe)
                return ALONE
            return self._end_held(end, fence, probe)
        if not self.finish_run(end):
            return None
        self._exec("delete_run_waits", {"run_id": run_id})
        row = self._one("run_end_probe", probe)
        return RunClosed(invoked=bool(row["invoked"]), waited=bool(row["waited"]))

    def _guessed_alone(self, function_id: str) -> bool:
        """Whether this end goes unread (noted in ``guessed``: the store marks
        the functions of a transaction that a wrong guess aborted)."""
        guesses, guessed = self.end_guesses, self.guessed
        if guesses is None or guessed is None or not guesses.alone(function_id):
            return False
        guessed.append(function_id)
        return True

    def _end_held(self, end: RunEnd, fence: Fence, probe: dict[str, str]) -> RunClosed | None:
        """A held run's end in one statement, read before going on."""
        row = self._fence("end_held_run", fence, **_end_params(end), **probe).fetchone()
        if row is None:
            raise LeaseLostError(f"run {end.run_id}: lease lost by {fence.owner}")
        self._released({**dict(row), "available_at": None}, end.now)
        if not row["finished"]:  # it had ended already
            closed = None
        else:
            closed = RunClosed(invoked=bool(row["invoked"]), waited=bool(row["waited"]))
        if self.end_guesses is not None:
            alone = closed == ALONE and row["ckey1"] is None and row["ckey2"] is None
            self.end_guesses.saw(end.function_id, alone)
        return closed

    def written_by(self, run_id: str) -> str | None:
        row = self._one("written_by", {"id": run_id})
        return None if row is None else row["written_by"]


def _step_params(step: StepRow) -> dict[str, Any]:
    return {
        "run_id": step.run_id,
        "step_id": step.step_id,
        "position": step.position,
        "kind": step.kind,
        "status": step.status,
        "attempts": step.attempts,
        "output": step.output,
        "error": step.error,
        "wake_at": step.wake_at,
        "started_at": step.started_at,
        "ended_at": step.ended_at,
        "fingerprint": step.fingerprint,
    }


def _end_params(end: RunEnd) -> dict[str, Any]:
    return {
        "id": end.run_id,
        "status": end.status,
        "output": end.output,
        "error": end.error,
        "now": end.now,
        "token": None if end.fence is None else end.fence.token,
    }
