"""The domain operations of ``Tx``, written once over SQL for every dialect.

Queries live in ``queries.sql`` and run through ``sqlbase`` (a ``Dialect``
adapts parameter style, lists and row locking); the worker registry, operator
views and jobs are in ``sqlviews``, lease passes, takes and leases in
``sqlqueue``, a held run's fenced writes (checkpoint, park, end) in
``sqljournal``, wait rows and signals in ``sqlwaits``, database size and
retention deletes in ``sqlretention``, a send's one event and the run it
starts written in one go (taken, beside a local worker) in ``sqlstart``. Both stores hand this
class a DB-API connection already inside a transaction.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from stepstone.store.rows import (
    ACTIVE_STATUSES,
    ENDED_STATUSES,
    EventRow,
    NewEvent,
    NewRun,
    QueueSpec,
    RunFilter,
    RunHistory,
    RunRead,
    RunRow,
    RunStatus,
    SpanRow,
    StepRow,
    TimedOut,
)
from stepstone.store.sqljournal import SqlJournal
from stepstone.store.sqlretention import SqlRetention
from stepstone.store.sqlstart import SqlStart, claim_params, event_params, item_params, spec_json
from stepstone.store.sqlviews import SqlViews
from stepstone.store.usertx import run_in_savepoint

T = TypeVar("T")


class SqlTx(SqlJournal, SqlStart, SqlViews, SqlRetention):
    """Implements ``stepstone.store.base.Tx`` on one open transaction."""

    # -- functions ----------------------------------------------------------------
    def register_functions(
        self, app: str, configs: dict[str, str], now: float, *, retire_others: bool = False
    ) -> None:
        for function_id, config in configs.items():
            self._exec("upsert_function", {"id": function_id, "app": app, "config": config, "now": now})
        if retire_others and configs:
            self._exec("retire_functions", {"app": app, "now": now}, {"function_ids": sorted(configs)})

    def load_functions(self) -> dict[str, tuple[str, str]]:
        return {row["id"]: (row["app"], row["config"]) for row in self._all("load_functions")}

    def retired_functions(self) -> dict[str, float]:
        return {row["id"]: float(row["retired_at"]) for row in self._all("retired_functions")}

    # -- dedupe ---------------------------------------------------------------------
    def claim_key(self, key: str, ref: str, expires_at: float, now: float) -> str | None:
        won = self._one("claim_key", {"key": key, "ref": ref, "expires_at": expires_at, "now": now})
        if won is not None:
            return None
        held = self._one("get_key", {"key": key, "now": now})
        return str(held["ref"]) if held is not None else ""

    def release_key(self, key: str, ref: str) -> None:
        self._exec("release_key", {"key": key, "ref": ref})

    # -- events and runs -------------------------------------------------------------
    def insert_event(self, event: NewEvent) -> int:
        seq = self._inserted(self._one("insert_event", event_params(event)), event)
        assert seq is not None
        return seq

    def record_event(self, event: NewEvent, dedupe_until: float) -> int | None:
        claim = claim_params(event, dedupe_until)
        if self.dialect.write_ctes:  # the claim as a CTE: the event inserted only if it won
            return self._inserted(self._one("record_event", {**claim, **event_params(event)}), event)
        if self._one("claim_key", claim) is None:
            return None
        return self.insert_event(event)

    def _inserted(self, row: Any, event: NewEvent) -> int | None:
        """An inserted event's seq (``None``: no row), remembered for a direct start."""
        if row is None:
            return None
        seq = int(row["seq"])
        self._new_events[seq] = event
        return seq

    def create_run(self, run: NewRun) -> None:
        self._create_run(run, run.event_seqs)

    def _create_run(self, run: NewRun, event_seqs: Sequence[int]) -> None:
        """``create_run`` of ``run`` linked to ``event_seqs`` (its own, or the
        seq of the event recorded just before it, ``record_event_starting``)."""
        ended = run.status not in ACTIVE_STATUSES
        self._exec(
            "insert_run",
            {
                "id": run.id,
                "function_id": run.function_id,
                "status": run.status,
                "event_ids": json.dumps(list(run.event_ids)),
                "created_at": run.created_at,
                "error": run.error,
                "parent_run_id": run.parent_run_id,
                "parent_step_id": run.parent_step_id,
                "idempotency_key": run.idempotency_key,
                "meta": run.meta,
                "ended_at": run.created_at if ended else None,
                "singleton_key": run.singleton_key,
            },
        )
        for position, seq in enumerate(event_seqs):
            self._exec("insert_run_event", {"run_id": run.id, "position": position, "event_seq": seq})
        if not ended:
            self._new_runs[run.id] = event_seqs
            self._queue_new(run)

    def _queue_new(self, run: NewRun, *, with_row: bool = False) -> None:
        """A new run's queue item and queue spec (its row written before;
        ``with_row``: its spec and partition hint too, ``record_event_starting``)."""
        spec = run.queue_spec
        self._enqueue(
            run.id,
            run.function_id,
            spec,
            run.available_at,
            run.available_at if run.sort_at is None else run.sort_at,
            run.start_deadline,
            run.finish_timeout,
            lowered=with_row,
        )
        if run.spec is not None and not with_row:
            # Its own UPDATE after the queue insert, not a column of insert_run:
            # written with the run, the noisy-neighbour benchmark's quiet tenant
            # (SQLite) waited 42-54 ms instead of 27-30 (bench_flow.py;
            # docs/benchmarks.md, issue 18 after session 7).
            self._exec("set_queue_spec", {"id": run.id, "spec": spec_json(spec)})

    def _enqueue(
        self,
        run_id: str,
        function_id: str,
        spec: QueueSpec,
        available_at: float,
        sort_at: float,
        start_deadline: float | None,
        finish_timeout: float | None,
        *,
        lowered: bool = False,
    ) -> None:
        self._exec(
            "insert_queue_item",
            {
                "run_id": run_id,
                "function_id": function_id,
                "available_at": available_at,
                "sort_at": sort_at,
                **item_params(spec, start_deadline, finish_timeout),
            },
        )
        if not lowered:
            self.lower_partition(spec.partition_key, function_id, spec.ckey1, available_at)

    def lower_partition(self, key: str, function_id: str, ckey: str | None, at: float) -> None:
        self._exec("lower_partition", {"key": key, "function_id": function_id, "ckey": ckey, "at": at})

    def _released(self, row: Any, now: float) -> None:
        """A queue item was parked, woken or deleted: lower its partition's hint and,
        if it held concurrency slots, wake the partitions waiting for them."""
        if row is None:
            return
        if row["available_at"] is not None:
            self.lower_partition(row["partition_key"], row["function_id"], row["ckey1"], row["available_at"])
        if row["ckey1"] is not None:
            self._exec("wake_ckey", {"ckey": row["ckey1"], "now": now})
        if row["ckey2"] is not None:
            self._exec("wake_function_partitions", {"function_id": row["function_id"], "now": now})

    def get_run(self, run_id: str) -> RunRow | None:
        row = self._one("get_run", {"id": run_id})
        return None if row is None else RunRow.from_row(row)

    def lock_run(self, run_id: str) -> RunRow | None:
        row = self._one("lock_run", {"id": run_id})
        return None if row is None else RunRow.from_row(row)

    def get_steps(self, run_id: str) -> list[StepRow]:
        return [StepRow.from_row(r) for r in self._all("get_steps", {"run_id": run_id})]

    def ended_run(self, run_id: str) -> tuple[RunRow | None, list[StepRow] | None]:
        return self._ended(run_id)()

    def ended_run_later(self, run_id: str) -> Callable[[], RunRead]:
        if not self.dialect.pipelined:  # (in-process: read now, while the transaction is open)
            value = self.ended_run(run_id)
            return lambda: value
        return self._ended(run_id)

    def _ended(self, run_id: str) -> Callable[[], RunRead]:
        """``ended_run``'s statements sent (pipelined: both at once), their rows
        read when called."""
        run = self._exec("get_run", {"id": run_id})
        steps = self._steps_if_ended(run_id) if self.dialect.pipelined else None

        def read() -> RunRead:
            row = run.fetchone()
            if row is None:
                return None, None
            found = RunRow.from_row(row)
            if found.status not in ENDED_STATUSES:
                return found, None
            rows = (self._steps_if_ended(run_id) if steps is None else steps).fetchall()
            return found, [StepRow.from_row(r) for r in rows]  # (in-process: once it has ended)

        return read

    def _steps_if_ended(self, run_id: str) -> Any:
        return self._exec("steps_if_ended", {"run_id": run_id}, {"statuses": ENDED_STATUSES})

    def steps_of_runs(self, run_ids: Sequence[str]) -> dict[str, list[StepRow]]:
        steps: dict[str, list[StepRow]] = {run_id: [] for run_id in run_ids}
        if run_ids:
            for row in self._all("steps_of_runs", None, {"run_ids": run_ids}):
                steps[row["run_id"]].append(StepRow.from_row(row))
        return steps

    def step_outputs(self, run_id: str, first: int, last: int) -> dict[str, str | None]:
        rows = self._all("step_outputs", {"run_id": run_id, "first": first, "last": last})
        return {r["step_id"]: r["output"] for r in rows}

    def get_events(self, run_id: str) -> list[EventRow]:
        return [EventRow.from_row(r) for r in self._all("get_events", {"run_id": run_id})]

    def get_spans(self, run_id: str) -> list[SpanRow]:
        return [SpanRow.from_row(r) for r in self._all("get_spans", {"run_id": run_id})]

    def list_runs(self, where: RunFilter) -> list[RunRow]:
        name, params = self._listing(where)
        return [RunRow.from_row(r) for r in self._all(name, params, {"statuses": where.statuses})]

    def runs_page(self, where: RunFilter) -> tuple[list[RunRow], dict[str, list[StepRow]]]:
        name, params = self._listing(where)
        lists = {"statuses": where.statuses}
        if where.event_id is None:
            runs = [RunRow.from_row(r) for r in self._all(name, params, lists)]
            return runs, self.steps_of_runs([run.id for run in runs])
        page = self._exec(name, params, lists)  # sent, not waited for:
        listed = self._exec("steps_of_event_runs", params, lists)
        runs = [RunRow.from_row(r) for r in page.fetchall()]
        steps: dict[str, list[StepRow]] = {run.id: [] for run in runs}
        for row in listed.fetchall():
            if row["run_id"] in steps:  # (the same snapshot: always, in a read)
                steps[row["run_id"]].append(StepRow.from_row(row))
        return runs, steps

    def _listing(self, where: RunFilter) -> tuple[str, dict[str, Any]]:
        """``list_runs``' statement (by event, or not) and its parameters."""
        params = {
            "function_id": where.function_id,
            "any_status": 0 if where.statuses else 1,
            "since": where.since,
            "until": where.until,
            "before_id": where.before_id,
            "app_version": where.app_version,
            "limit": where.limit,
        }
        if where.event_id is None:
            return "list_runs", params
        params["event_id"] = where.event_id
        return "list_runs_of_event", params

    def run_histories(
        self,
        function_ids: Sequence[str],
        statuses: Sequence[RunStatus],
        after_id: str | None,
        limit: int,
    ) -> list[RunHistory]:
        if not function_ids or not statuses:
            return []
        lists = {"function_ids": function_ids, "statuses": statuses}
        runs = [
            RunRow.from_row(r) for r in self._all("check_runs", {"after_id": after_id, "limit": limit}, lists)
        ]
        if not runs:
            return []
        run_ids = [run.id for run in runs]
        steps, events = self.steps_of_runs(run_ids), self._events_of(run_ids)
        return [RunHistory(run=run, events=events[run.id], steps=steps[run.id]) for run in runs]

    def lock(self, key: str) -> None:
        """Serialise transactions that read-then-write the state of ``key``."""
        if self.dialect.key_lock is not None:
            self.conn.execute(self.dialect.key_lock, {"key": key})

    def server_time(self) -> float | None:
        if self.dialect.server_clock is None:
            return None
        row = self.conn.execute(self.dialect.server_clock).fetchone()
        return float(row["now"])

    def try_lock(self, key: str) -> bool:
        if self.dialect.key_try_lock is None:
            return True
        row = self.conn.execute(self.dialect.key_try_lock, {"key": key}).fetchone()
        return bool(row["ok"])

    # -- GCRA, debounce, batch ----------------------------------------------------------------
    def gcra_tat(self, key: str) -> float | None:
        row = self._one("gcra_get", {"key": key})
        return None if row is None else float(row["tat"])

    def set_gcra_tat(self, key: str, tat: float) -> None:
        self._exec("gcra_set", {"key": key, "tat": tat})

    def get_accumulator(self, kind: str, key: str) -> tuple[str, int, float] | None:
        """An open debounce (``kind`` 'debounce') or batch: (run id, size, first_at)."""
        row = self._one("get_debounce" if kind == "debounce" else "get_batch", {"key": key})
        if row is None:
            return None
        return row["run_id"], int(row["size"]) if kind == "batch" else 1, float(row["first_at"])

    def put_accumulator(self, kind: str, key: str, run_id: str, size: int, first_at: float) -> None:
        if kind == "debounce":
            self._exec("put_debounce", {"key": key, "run_id": run_id, "first_at": first_at})
        else:
            self._exec("put_batch", {"key": key, "run_id": run_id, "size": size, "first_at": first_at})

    def close_batch(self, key: str) -> None:
        self._exec("delete_batch", {"key": key})

    def pending_item(self, run_id: str) -> bool:
        """Whether the run is queued and was never leased (its events may change).
        A pending item is locked until the transaction ends (a lease pass skips
        it); one a lease pass holds is waited for, then re-checked."""
        return self._one("pending_item", {"run_id": run_id}) is not None

    def move_item(self, run_id: str, at: float, sort_at: float) -> None:
        row = self._one("queue_item", {"run_id": run_id})
        self._exec("move_item", {"run_id": run_id, "at": at, "sort_at": sort_at})
        if row is not None:
            self.lower_partition(row["partition_key"], row["function_id"], row["ckey1"], at)

    def set_run_events(self, run_id: str, events: Sequence[tuple[int, str]], replace: bool) -> None:
        """Replace the run's only event, or append one (batches)."""
        run = self.get_run(run_id)
        assert run is not None
        seq, event_id = events[-1]
        if replace:
            self._exec("replace_run_event", {"run_id": run_id, "position": 0, "event_seq": seq})
            ids = [event_id]
        else:
            position = len(run.event_ids)
            self._exec("insert_run_event", {"run_id": run_id, "position": position, "event_seq": seq})
            ids = [*run.event_ids, event_id]
        self._exec("set_run_events", {"id": run_id, "event_ids": json.dumps(ids)})

    # -- operator actions --------------------------------------------------------------------
    def requeue_run(self, run_id: str, now: float, reset_steps: Sequence[str] | None) -> None:
        run = self.get_run(run_id)
        if run is None:
            return
        for step_id in reset_steps or ():
            self._exec("delete_step", {"run_id": run_id, "step_id": step_id})
        self._exec(
            "reopen_run",
            {"id": run_id, "status": RunStatus.QUEUED if run.started_at is None else RunStatus.RUNNING},
        )
        if self._one("queue_item", {"run_id": run_id}) is None:
            spec = self.queue_spec(run_id) or QueueSpec(partition_key=run.function_id)
            self._enqueue(run_id, run.function_id, spec, now, now, None, None)

    def unqueue_run(self, run_id: str, now: float) -> None:
        row = self._exec("delete_queue_item", {"run_id": run_id}).fetchone()
        self._released(row and {**dict(row), "available_at": None}, now)

    def queue_spec(self, run_id: str) -> QueueSpec | None:
        row = self._one("get_run", {"id": run_id})
        raw = None if row is None else row["queue_spec"]
        return QueueSpec(**json.loads(raw)) if raw else None

    def lock_lease(self, run_id: str, now: float) -> bool:
        item = self._one("lease_of", {"run_id": run_id})  # locked: see queries.sql
        return bool(
            item is not None
            and item["owner"] is not None
            and item["available_at"] is not None
            and item["available_at"] > now
        )

    def flag_cancel(self, run_id: str, now: float, reason: str | None = None) -> bool:
        params = {"run_id": run_id, "now": now, "reason": reason}
        return self._exec("flag_cancel", params).fetchone() is not None

    def cancel_reason(self, run_id: str) -> str | None:
        row = self._one("cancel_reason", {"run_id": run_id})
        return None if row is None else row["cancel_reason"]

    # -- a resolved wait's run woken, one step read (wait rows, mailbox: sqlwaits.py) -------------
    def wake_run(self, run_id: str, now: float) -> None:
        row = self._exec("wake_run", {"run_id": run_id, "now": now}).fetchone()
        if row is not None:
            self.lower_partition(row["partition_key"], row["function_id"], row["ckey1"], row["available_at"])

    def get_step(self, run_id: str, step_id: str) -> StepRow | None:
        row = self._one("get_step", {"run_id": run_id, "step_id": step_id})
        return None if row is None else StepRow.from_row(row)

    # -- cron ------------------------------------------------------------------------------------
    def ensure_cron(self, function_id: str, schedule: str, next_at: float) -> None:
        self._exec("upsert_cron", {"function_id": function_id, "schedule": schedule, "next_at": next_at})

    def due_crons(self, schedules: Sequence[tuple[str, str]], now: float) -> list[tuple[str, str, float]]:
        wanted = set(schedules)
        rows = self._all("due_crons", {"now": now}, {"function_ids": sorted({f for f, _ in wanted})})
        return [
            (r["function_id"], r["schedule"], float(r["next_at"]))
            for r in rows
            if (r["function_id"], r["schedule"]) in wanted
        ]

    def advance_cron(self, function_id: str, schedule: str, expected: float, next_at: float) -> bool:
        params = {"function_id": function_id, "schedule": schedule, "expected": expected, "next_at": next_at}
        return int(self._exec("advance_cron", params).rowcount) == 1

    def crons_of(self, function_ids: Sequence[str]) -> list[tuple[str, str, float]]:
        if not function_ids:
            return []
        rows = self._all("crons_of", {}, {"function_ids": function_ids})
        return [(r["function_id"], r["schedule"], float(r["next_at"])) for r in rows]

    def next_cron(self, schedules: Sequence[tuple[str, str]]) -> float | None:
        wanted = set(schedules)
        times = [at for f, s, at in self.crons_of(sorted({f for f, _ in wanted})) if (f, s) in wanted]
        return min(times) if times else None

    def delete_stale_cron(self, function_id: str, schedule: str, before: float) -> bool:
        params = {"function_id": function_id, "schedule": schedule, "before": before}
        return int(self._exec("delete_stale_cron", params).rowcount) == 1

    # -- timeouts ----------------------------------------------------------------------------------
    def timed_out(self, now: float, limit: int = 100) -> list[TimedOut]:
        found = []
        for r in self._all("timed_out", {"now": now, "limit": limit}):
            leased = r["owner"] is not None and r["available_at"] is not None and r["available_at"] > now
            kind = "start" if r["start_deadline"] is not None and r["start_deadline"] <= now else "finish"
            found.append(TimedOut(run_id=r["run_id"], function_id=r["function_id"], leased=leased, kind=kind))
        return found

    def next_deadline(self) -> float | None:
        row = self._one("next_deadline")
        return None if row is None or row["due"] is None else float(row["due"])

    def next_times(self, function_ids: Sequence[str]) -> tuple[float | None, float | None]:
        if not function_ids:
            return None, self.next_deadline()
        row = self._exec("next_times", {}, {"function_ids": function_ids}).fetchone()
        return _time(row["due"]), _time(row["deadline"])

    def next_times_later(
        self, function_ids: Sequence[str]
    ) -> Callable[[], tuple[float | None, float | None]]:
        if not self.dialect.pipelined or not function_ids:
            times = self.next_times(function_ids)
            return lambda: times
        sent = self._exec("next_times", {}, {"function_ids": function_ids})  # settled by the COMMIT's sync

        @functools.cache
        def read() -> tuple[float | None, float | None]:
            row = sent.fetchone()
            return _time(row["due"]), _time(row["deadline"])

        return read

    def clear_deadlines(self, run_id: str) -> None:
        self._exec("clear_deadlines", {"run_id": run_id})

    # -- transactional steps ---------------------------------------------------------------------
    def user_sql(self, fn: Callable[[Any], T], seconds: float) -> T:
        return run_in_savepoint(self, fn, seconds)


def _time(value: Any) -> float | None:
    return None if value is None else float(value)
