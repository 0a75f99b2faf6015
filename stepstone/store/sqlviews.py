"""The read-mostly side of ``Tx`` over SQL: the worker registry, the apps
served over HTTP, operator views (metrics, dashboard) and background jobs."""

from __future__ import annotations

import json
from collections.abc import Sequence

from stepstone.store.rows import EventRow
from stepstone.store.sqlbase import SqlPlumbing
from stepstone.store.viewrows import (
    AppRow,
    BacklogRow,
    EventRunRow,
    JobRow,
    KeyBacklogRow,
    RunCountRow,
    TimelineRow,
    WorkerRow,
)


class SqlViews(SqlPlumbing):
    """Workers, apps, operator views and jobs (mixed into ``SqlTx``)."""

    # -- apps served over HTTP ----------------------------------------------------------------
    def upsert_app(self, row: AppRow) -> None:
        self._exec(
            "upsert_app",
            {
                "url": row.url,
                "app": row.app,
                "app_version": row.app_version,
                "max_duration": row.max_duration,
                "function_ids": json.dumps(sorted(row.function_ids)),
                "created_at": row.created_at,
                "synced_at": row.synced_at,
            },
        )

    def record_app_error(self, url: str, error: str, now: float) -> bool:
        return self._one("record_app_error", {"url": url, "error": error, "now": now}) is not None

    def get_app(self, url: str) -> AppRow | None:
        row = self._one("get_app", {"url": url})
        return None if row is None else AppRow.from_row(row)

    def list_apps(self) -> list[AppRow]:
        return [AppRow.from_row(row) for row in self._all("list_apps")]

    def delete_app(self, url: str) -> bool:
        return self._one("delete_app", {"url": url}) is not None

    def retire_app_functions(self, app: str, now: float) -> int:
        return len(self._all("retire_app_functions", {"app": app, "now": now}))

    # -- workers ------------------------------------------------------------------------------
    def upsert_worker(self, worker: WorkerRow) -> None:
        self._exec(
            "upsert_worker",
            {
                "id": worker.id,
                "app": worker.app,
                "app_version": worker.app_version,
                "concurrency": worker.concurrency,
                "started_at": worker.started_at,
                "heartbeat_at": worker.heartbeat_at,
                "functions": json.dumps(worker.functions),
            },
        )

    def remove_worker(self, worker_id: str) -> None:
        self._exec("remove_worker", {"id": worker_id})

    def list_workers(self, alive_since: float) -> list[WorkerRow]:
        return [WorkerRow.from_row(r) for r in self._all("list_workers", {"alive_since": alive_since})]

    # -- operator views ----------------------------------------------------------------------
    def run_backlog(self, now: float) -> list[BacklogRow]:
        return [BacklogRow.from_row(r) for r in self._all("run_backlog", {"now": now})]

    def count_active_runs(self) -> list[RunCountRow]:
        return [RunCountRow.from_row(r) for r in self._all("count_active_runs")]

    # -- operator views (dashboard) ----------------------------------------------------------
    def count_runs(
        self, function_id: str | None, since: float | None, until: float | None
    ) -> list[RunCountRow]:
        params = {"function_id": function_id, "since": since, "until": until}
        return [RunCountRow.from_row(r) for r in self._all("count_runs", params)]

    def key_backlog(self, now: float, limit: int) -> list[KeyBacklogRow]:
        return [KeyBacklogRow.from_row(r) for r in self._all("key_backlog", {"now": now, "limit": limit})]

    def run_timeline(
        self, function_id: str | None, origin: int, until: float, width: int
    ) -> list[TimelineRow]:
        params = {"function_id": function_id, "origin": origin, "until": until, "width": width}
        return [TimelineRow.from_row(r) for r in self._all("run_timeline", params)]

    def list_events(
        self, name: str | None, event_id: str | None, before_seq: int | None, limit: int
    ) -> list[EventRow]:
        params = {"name": name, "event_id": event_id, "before_seq": before_seq, "limit": limit}
        return [EventRow.from_row(r) for r in self._all("list_events", params)]

    def event_runs(self, seqs: Sequence[int]) -> list[EventRunRow]:
        if not seqs:
            return []
        return [EventRunRow.from_row(r) for r in self._all("event_runs", {}, {"seqs": seqs})]

    # -- background jobs ----------------------------------------------------------------------
    def create_job(self, job: JobRow) -> None:
        self._exec(
            "insert_job",
            {
                "id": job.id,
                "kind": job.kind,
                "status": job.status,
                "params": job.params,
                "done": job.done,
                "examined": job.examined,
                "error": job.error,
                "owner": job.owner,
                "created_at": job.created_at,
                "updated_at": job.updated_at,
                "finished_at": job.finished_at,
            },
        )

    def get_job(self, job_id: str) -> JobRow | None:
        row = self._one("get_job", {"id": job_id})
        return None if row is None else JobRow.from_row(row)

    def list_jobs(self, limit: int) -> list[JobRow]:
        return [JobRow.from_row(r) for r in self._all("list_jobs", {"limit": limit})]

    def update_job(
        self,
        job_id: str,
        *,
        status: str,
        done: int,
        examined: int,
        error: str | None,
        now: float,
        finished_at: float | None,
    ) -> bool:
        params = {
            "id": job_id,
            "status": status,
            "done": done,
            "examined": examined,
            "error": error,
            "now": now,
            "finished_at": finished_at,
        }
        return int(self._exec("update_job", params).rowcount) == 1

    def interrupt_stale_jobs(self, stale_before: float, now: float, reason: str) -> int:
        params = {"stale_before": stale_before, "now": now, "error": reason}
        return int(self._exec("interrupt_stale_jobs", params).rowcount)
