"""The domain operations of ``Tx``, written once over SQL for every dialect.

Queries live in ``queries.sql``; a ``Dialect`` adapts parameter style, lists
and row locking. Both stores hand this class a DB-API connection already
inside a transaction.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

from stepstone.errors import LeaseLostError
from stepstone.store.base import (
    ACTIVE_STATUSES,
    CANCELLED,
    ENDED_STATUSES,
    BacklogRow,
    EventRow,
    Fence,
    JobRow,
    LeasedRun,
    NewRun,
    RunCountRow,
    RunFilter,
    RunRow,
    SpanRow,
    StepRow,
    WorkerRow,
)

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.M)
_PARAM = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")


@cache
def _raw_queries() -> dict[str, str]:
    text = resources.files("stepstone.store").joinpath("queries.sql").read_text()
    parts = _NAME.split(text)
    return {parts[i]: parts[i + 1].strip().rstrip(";") for i in range(1, len(parts), 2)}


@dataclass(frozen=True)
class Dialect:
    """What differs between databases, kept small."""

    name: str
    lock: str = ""
    pyformat: bool = False
    _cache: dict[tuple[str, tuple[tuple[str, int], ...]], str] = field(
        default_factory=dict, compare=False, repr=False
    )

    def sql(self, name: str, lists: Mapping[str, int] = {}) -> str:
        key = (name, tuple(sorted(lists.items())))
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        text = _raw_queries()[name]
        expansions = {k: ", ".join(f":{k}_{i}" for i in range(n)) or "NULL" for k, n in lists.items()}
        text = text.replace("{lock}", self.lock)
        for k, v in expansions.items():
            text = text.replace("{" + k + "}", v)
        if self.pyformat:
            text = _PARAM.sub(r"%(\1)s", text)
        self._cache[key] = text
        return text


def _run_row(row: Mapping[str, Any]) -> RunRow:
    return RunRow(
        id=row["id"],
        function_id=row["function_id"],
        status=row["status"],
        event_ids=json.loads(row["event_ids"]),
        output=row["output"],
        error=row["error"],
        created_at=row["created_at"],
        started_at=row["started_at"],
        ended_at=row["ended_at"],
        attempt=row["attempt"],
        app_version=row["app_version"],
        parent_run_id=row["parent_run_id"],
        parent_step_id=row["parent_step_id"],
        meta=row["meta"],
    )


def _step_row(row: Mapping[str, Any]) -> StepRow:
    return StepRow(
        run_id=row["run_id"], step_id=row["step_id"], position=row["position"], kind=row["kind"],
        status=row["status"], attempts=row["attempts"], output=row["output"], error=row["error"],
        wake_at=row["wake_at"], started_at=row["started_at"], ended_at=row["ended_at"],
    )


def _job_row(row: Mapping[str, Any]) -> JobRow:
    return JobRow(
        id=row["id"], kind=row["kind"], status=row["status"], params=row["params"],
        created_at=row["created_at"], updated_at=row["updated_at"], done=row["done"],
        examined=row["examined"], error=row["error"], owner=row["owner"],
        finished_at=row["finished_at"],
    )


def _event_row(row: Mapping[str, Any]) -> EventRow:
    return EventRow(row["seq"], row["id"], row["name"], row["data"], row["ts"], row["received_at"])


class SqlTx:
    """Implements ``stepstone.store.base.Tx`` on one open transaction."""

    def __init__(self, conn: Any, dialect: Dialect) -> None:
        self.conn = conn
        self.dialect = dialect

    # -- plumbing ---------------------------------------------------------------
    def _exec(self, name: str, params: Mapping[str, Any] | None = None,
              lists: Mapping[str, Sequence[Any]] | None = None) -> Any:
        args = dict(params or {})
        sizes: dict[str, int] = {}
        for key, values in (lists or {}).items():
            sizes[key] = len(values)
            for i, value in enumerate(values):
                args[f"{key}_{i}"] = value
        return self.conn.execute(self.dialect.sql(name, sizes), args)

    def _all(self, name: str, params: Mapping[str, Any] | None = None,
             lists: Mapping[str, Sequence[Any]] | None = None) -> list[Any]:
        return list(self._exec(name, params, lists).fetchall())

    def _one(self, name: str, params: Mapping[str, Any] | None = None) -> Any:
        return self._exec(name, params).fetchone()

    # -- functions ----------------------------------------------------------------
    def register_functions(self, app: str, configs: dict[str, str], now: float) -> None:
        for function_id, config in configs.items():
            self._exec("upsert_function", {"id": function_id, "app": app, "config": config, "now": now})

    def load_functions(self) -> dict[str, tuple[str, str]]:
        return {row["id"]: (row["app"], row["config"]) for row in self._all("load_functions")}

    # -- dedupe ---------------------------------------------------------------------
    def claim_key(self, key: str, ref: str, expires_at: float, now: float) -> str | None:
        won = self._one("claim_key", {"key": key, "ref": ref, "expires_at": expires_at, "now": now})
        if won is not None:
            return None
        held = self._one("get_key", {"key": key, "now": now})
        return str(held["ref"]) if held is not None else ""

    def release_key(self, key: str, ref: str) -> None:
        self._exec("release_key", {"key": key, "ref": ref})

    def prune_keys(self, now: float) -> None:
        self._exec("prune_keys", {"now": now})

    # -- events and runs -------------------------------------------------------------
    def insert_event(self, event_id: str, name: str, data: str, ts: int, now: float) -> int:
        row = self._one("insert_event", {"id": event_id, "name": name, "data": data, "ts": ts, "now": now})
        return int(row["seq"])

    def create_run(self, run: NewRun) -> None:
        ended = run.status not in ACTIVE_STATUSES
        self._exec("insert_run", {
            "id": run.id, "function_id": run.function_id, "status": run.status,
            "event_ids": json.dumps(list(run.event_ids)), "created_at": run.created_at,
            "error": run.error, "parent_run_id": run.parent_run_id,
            "parent_step_id": run.parent_step_id, "idempotency_key": run.idempotency_key,
            "meta": run.meta, "ended_at": run.created_at if ended else None,
        })
        for position, seq in enumerate(run.event_seqs):
            self._exec("insert_run_event", {"run_id": run.id, "position": position, "event_seq": seq})
        if not ended:
            self._exec("insert_queue_item", {
                "run_id": run.id, "function_id": run.function_id, "partition_key": run.partition,
                "available_at": run.available_at,
                "sort_at": run.available_at if run.sort_at is None else run.sort_at,
                "start_deadline": run.start_deadline,
            })

    def get_run(self, run_id: str) -> RunRow | None:
        row = self._one("get_run", {"id": run_id})
        return None if row is None else _run_row(row)

    def get_steps(self, run_id: str) -> list[StepRow]:
        return [_step_row(r) for r in self._all("get_steps", {"run_id": run_id})]

    def get_events(self, run_id: str) -> list[EventRow]:
        return [_event_row(r) for r in self._all("get_events", {"run_id": run_id})]

    def get_spans(self, run_id: str) -> list[SpanRow]:
        return [
            SpanRow(r["run_id"], r["kind"], r["name"], r["started_at"], r["ended_at"], r["status"],
                    r["attempt"], r["error"], r["detail"])
            for r in self._all("get_spans", {"run_id": run_id})
        ]

    def list_runs(self, where: RunFilter) -> list[RunRow]:
        params = {
            "function_id": where.function_id, "any_status": 0 if where.statuses else 1,
            "since": where.since, "until": where.until, "before_id": where.before_id,
            "event_id": where.event_id, "limit": where.limit,
        }
        return [_run_row(r) for r in self._all("list_runs", params, {"statuses": where.statuses})]

    # -- queue and leases ---------------------------------------------------------------
    def lease(self, owner: str, function_ids: Sequence[str], limit: int, now: float,
              until: float) -> list[LeasedRun]:
        if not function_ids or limit <= 0:
            return []
        taken = self._all(
            "lease_queue", {"owner": owner, "until": until, "now": now, "limit": limit},
            {"function_ids": function_ids},
        )
        leased = []
        for item in taken:
            run = self._one("mark_running", {"id": item["run_id"], "now": now, "epoch": item["epoch"]})
            leased.append(LeasedRun(
                run=_run_row(run), epoch=item["epoch"], events=self.get_events(item["run_id"]),
                steps=self.get_steps(item["run_id"]), cancel_requested=bool(item["cancel_requested"]),
            ))
        leased.sort(key=lambda lr: lr.run.id)
        return leased

    def next_due(self, function_ids: Sequence[str]) -> float | None:
        if not function_ids:
            return None
        row = self._exec("next_due", {}, {"function_ids": function_ids}).fetchone()
        return None if row is None or row["due"] is None else float(row["due"])

    def extend_leases(self, owner: str, run_ids: Sequence[str], until: float) -> list[str]:
        if not run_ids:
            return []
        rows = self._all("extend_leases", {"owner": owner, "until": until}, {"run_ids": run_ids})
        return [r["run_id"] for r in rows]

    def release_leases(self, owner: str, now: float) -> int:
        return int(self._exec("release_leases", {"owner": owner, "now": now}).rowcount)

    # -- checkpoints ---------------------------------------------------------------------
    def _fence(self, query: str, fence: Fence, **params: Any) -> Any:
        cursor = self._exec(query, {"run_id": fence.run_id, "owner": fence.owner,
                                    "epoch": fence.epoch, **params})
        return cursor

    def checkpoint(self, fence: Fence, steps: Sequence[StepRow], spans: Sequence[SpanRow]) -> bool:
        row = self._fence("fence_check", fence).fetchone()
        if row is None:
            raise LeaseLostError(f"run {fence.run_id}: lease lost by {fence.owner}")
        self.save_steps(steps, spans)
        return bool(row["cancel_requested"])

    def save_steps(self, steps: Sequence[StepRow], spans: Sequence[SpanRow]) -> None:
        for step in steps:
            self._exec("upsert_step", {
                "run_id": step.run_id, "step_id": step.step_id, "position": step.position,
                "kind": step.kind, "status": step.status, "attempts": step.attempts,
                "output": step.output, "error": step.error, "wake_at": step.wake_at,
                "started_at": step.started_at, "ended_at": step.ended_at,
            })
        for span in spans:
            self._exec("insert_span", {
                "run_id": span.run_id, "kind": span.kind, "name": span.name,
                "attempt": span.attempt, "started_at": span.started_at, "ended_at": span.ended_at,
                "status": span.status, "error": span.error, "detail": span.detail,
            })

    def reschedule(self, fence: Fence, status: str, available_at: float | None,
                   attempt: int | None) -> None:
        if self._fence("fence_park", fence, available_at=available_at).rowcount != 1:
            raise LeaseLostError(f"run {fence.run_id}: lease lost by {fence.owner}")
        self._exec("park_run", {"id": fence.run_id, "status": status, "attempt": attempt})

    def finish_run(self, fence: Fence | None, run_id: str, status: str, output: str | None,
                   error: str | None, now: float) -> bool:
        if fence is not None:
            if self._fence("fence_delete", fence).rowcount != 1:
                raise LeaseLostError(f"run {run_id}: lease lost by {fence.owner}")
        else:
            self._exec("delete_queue_item", {"run_id": run_id})
        params = {"id": run_id, "status": status, "output": output, "error": error, "now": now}
        return int(self._exec("finish_run", params).rowcount) == 1

    # -- operator actions --------------------------------------------------------------------
    def requeue_run(self, run_id: str, now: float, reset_steps: Sequence[str] | None) -> None:
        run = self.get_run(run_id)
        if run is None:
            return
        for step_id in reset_steps or ():
            self._exec("delete_step", {"run_id": run_id, "step_id": step_id})
        self._exec("reopen_run", {"id": run_id, "status": "queued" if run.started_at is None else "running"})
        if self._one("queue_item", {"run_id": run_id}) is None:
            self._exec("insert_queue_item", {
                "run_id": run_id, "function_id": run.function_id, "partition_key": "",
                "available_at": now, "sort_at": now, "start_deadline": None,
            })

    def request_cancel(self, run_id: str, now: float) -> str:
        run = self.get_run(run_id)
        if run is None or run.status in ENDED_STATUSES:
            return run.status if run else ""
        item = self._one("queue_item", {"run_id": run_id})
        leased = item is not None and item["owner"] is not None and item["available_at"] > now
        if leased:
            self._exec("flag_cancel", {"run_id": run_id})
            return run.status
        self.finish_run(None, run_id, CANCELLED, None, None, now)
        return CANCELLED

    # -- workers ------------------------------------------------------------------------------
    def upsert_worker(self, worker: WorkerRow) -> None:
        self._exec("upsert_worker", {
            "id": worker.id, "app": worker.app, "app_version": worker.app_version,
            "concurrency": worker.concurrency, "started_at": worker.started_at,
            "heartbeat_at": worker.heartbeat_at, "functions": json.dumps(worker.functions),
        })

    def remove_worker(self, worker_id: str) -> None:
        self._exec("remove_worker", {"id": worker_id})

    def list_workers(self, alive_since: float) -> list[WorkerRow]:
        return [
            WorkerRow(r["id"], r["app"], r["app_version"], r["concurrency"], r["started_at"],
                      r["heartbeat_at"], json.loads(r["functions"]))
            for r in self._all("list_workers", {"alive_since": alive_since})
        ]

    # -- operator views ----------------------------------------------------------------------
    def run_backlog(self, now: float) -> list[BacklogRow]:
        return [BacklogRow(r["function_id"], int(r["due"]), float(r["oldest"]))
                for r in self._all("run_backlog", {"now": now})]

    def count_active_runs(self) -> list[RunCountRow]:
        return [RunCountRow(r["function_id"], r["status"], int(r["n"]))
                for r in self._all("count_active_runs")]

    # -- background jobs ----------------------------------------------------------------------
    def create_job(self, job: JobRow) -> None:
        self._exec("insert_job", {
            "id": job.id, "kind": job.kind, "status": job.status, "params": job.params,
            "done": job.done, "examined": job.examined, "error": job.error, "owner": job.owner,
            "created_at": job.created_at, "updated_at": job.updated_at,
            "finished_at": job.finished_at,
        })

    def get_job(self, job_id: str) -> JobRow | None:
        row = self._one("get_job", {"id": job_id})
        return None if row is None else _job_row(row)

    def list_jobs(self, limit: int) -> list[JobRow]:
        return [_job_row(r) for r in self._all("list_jobs", {"limit": limit})]

    def update_job(self, job_id: str, *, status: str, done: int, examined: int, error: str | None,
                   now: float, finished_at: float | None) -> bool:
        params = {"id": job_id, "status": status, "done": done, "examined": examined,
                  "error": error, "now": now, "finished_at": finished_at}
        return int(self._exec("update_job", params).rowcount) == 1

    def interrupt_stale_jobs(self, stale_before: float, now: float, reason: str) -> int:
        params = {"stale_before": stale_before, "now": now, "error": reason}
        return int(self._exec("interrupt_stale_jobs", params).rowcount)
