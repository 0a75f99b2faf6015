"""The operator roles: read-only views (metrics, dashboard) and background
jobs (bulk actions)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from stepstone.store.rows import EventRow, RunHistory, RunStatus
from stepstone.store.viewrows import (
    BacklogRow,
    EventRunRow,
    JobRow,
    JobStatus,
    KeyBacklogRow,
    RunCountRow,
    TimelineRow,
)


class ViewsTx(Protocol):
    """Read-only operator views: metrics and the dashboard."""

    def run_backlog(self, now: float) -> list[BacklogRow]:
        """Per function: queue items due by ``now`` that no live lease holds."""
        ...

    def count_active_runs(self) -> list[RunCountRow]:
        """Runs not yet ended, counted per function and status."""
        ...

    def count_runs(
        self, function_id: str | None, since: float | None, until: float | None
    ) -> list[RunCountRow]:
        """Runs created in [since, until) (of one function, or all), per function
        and status."""
        ...

    def key_backlog(self, now: float, limit: int) -> list[KeyBacklogRow]:
        """Queue items per function and concurrency key values, largest first
        within each function."""
        ...

    def run_timeline(
        self, function_id: str | None, origin: int, until: float, width: int
    ) -> list[TimelineRow]:
        """Runs created in [origin, until), grouped by status and by bucket
        ``(created_at - origin) // width`` (whole seconds; a run's creation time is
        rounded to a whole second first, up or down depending on the database)."""
        ...

    def list_events(
        self, name: str | None, event_id: str | None, before_seq: int | None, limit: int
    ) -> list[EventRow]:
        """The event log, newest first; ``before_seq`` continues a previous page."""
        ...

    def event_runs(self, seqs: Sequence[int]) -> list[EventRunRow]:
        """The runs linked to the given events."""
        ...

    def run_histories(
        self,
        function_ids: Sequence[str],
        statuses: Sequence[RunStatus],
        after_id: str | None,
        limit: int,
    ) -> list[RunHistory]:
        """Up to ``limit`` runs of ``function_ids`` in ``statuses`` with an id
        after ``after_id`` (ascending, for paging), each with its events and
        steps: three statements per page, whatever its size."""
        ...


class JobsTx(Protocol):
    """Background operator jobs (bulk actions)."""

    def create_job(self, job: JobRow) -> None:
        """Insert a background operator job."""
        ...

    def get_job(self, job_id: str) -> JobRow | None:
        """The job, or ``None`` if there is no such job."""
        ...

    def list_jobs(self, limit: int) -> list[JobRow]:
        """Newest first."""
        ...

    def update_job(
        self,
        job_id: str,
        *,
        status: JobStatus,
        done: int,
        examined: int,
        error: str | None,
        now: float,
        finished_at: float | None,
    ) -> bool:
        """Record progress (and refresh the heartbeat) of an active job; returns
        ``False`` if the job is no longer active."""
        ...

    def interrupt_stale_jobs(self, stale_before: float, now: float, reason: str) -> int:
        """Mark active jobs not refreshed since ``stale_before`` as ``interrupted``."""
        ...
