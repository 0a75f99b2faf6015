"""The maintenance roles: the registries of deployed functions and of
workers, cron schedules and run deadlines."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from stepstone.store.rows import TimedOut
from stepstone.store.viewrows import WorkerRow


class FunctionsTx(Protocol):
    """The registry of deployed functions (workers, the CLI, the server)."""

    def register_functions(
        self, app: str, configs: dict[str, str], now: float, *, retire_others: bool = False
    ) -> None:
        """Upsert the JSON descriptions of ``app``'s functions by function id
        (bringing back any that were retired). With ``retire_others`` (a worker:
        ``configs`` is the whole function set of the deployed code), the
        functions ``app`` registered before and are not in ``configs`` are
        retired; an empty ``configs`` retires nothing."""
        ...

    def load_functions(self) -> dict[str, tuple[str, str]]:
        """Every registered function, retired ones included: ``{id: (app, config_json)}``."""
        ...

    def retired_functions(self) -> dict[str, float]:
        """The retired functions: ``{id: retired_at}``."""
        ...


class CronTx(Protocol):
    """Cron schedules and run deadlines (the maintenance loops)."""

    def ensure_cron(self, function_id: str, schedule: str, next_at: float) -> None:
        """Create the schedule's row if missing (keeps an existing ``next_at``)."""
        ...

    def due_crons(self, schedules: Sequence[tuple[str, str]], now: float) -> list[tuple[str, str, float]]:
        """The rows of these ``(function id, schedule)`` pairs due by ``now``: other
        schedules of the same functions (another deploy's) are not this caller's."""
        ...

    def advance_cron(self, function_id: str, schedule: str, expected: float, next_at: float) -> bool:
        """Compare-and-set ``next_at``: ``True`` for the one caller that claims the tick."""
        ...

    def next_cron(self, schedules: Sequence[tuple[str, str]]) -> float | None:
        """The earliest ``next_at`` of these ``(function id, schedule)`` pairs."""
        ...

    def crons_of(self, function_ids: Sequence[str]) -> list[tuple[str, str, float]]:
        """Every schedule row of these functions: ``(function id, schedule, next_at)``."""
        ...

    def delete_stale_cron(self, function_id: str, schedule: str, before: float) -> bool:
        """Delete the schedule's row if its ``next_at`` is before ``before``."""
        ...

    def timed_out(self, now: float, limit: int = 100) -> list[TimedOut]:
        """Runs past their start or finish deadline."""
        ...

    def next_deadline(self) -> float | None:
        """The earliest start or finish deadline of any run, or ``None``."""
        ...

    def next_times(self, function_ids: Sequence[str]) -> tuple[float | None, float | None]:
        """``(next_due(function_ids), next_deadline())`` in one statement: what
        a worker reads at the end of every lease pass."""
        ...

    def next_times_later(
        self, function_ids: Sequence[str]
    ) -> Callable[[], tuple[float | None, float | None]]:
        """``next_times``, its value read when called, after the transaction
        (where statements are pipelined, it comes in with the ``COMMIT``: no
        round trip of its own; elsewhere it is read now)."""
        ...

    def clear_deadlines(self, run_id: str) -> None:
        """Forget a run's timeouts (it has been told to cancel)."""
        ...


class WorkersTx(Protocol):
    """The worker registry."""

    def upsert_worker(self, worker: WorkerRow) -> None:
        """Record a worker's heartbeat and description."""
        ...

    def remove_worker(self, worker_id: str) -> None:
        """Forget a worker (it stopped)."""
        ...

    def list_workers(self, alive_since: float) -> list[WorkerRow]:
        """The workers whose last heartbeat is at or after ``alive_since``."""
        ...
