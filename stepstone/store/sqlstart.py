"""A send's one event and the one run it starts, written in one go
(``RunsTx.record_event_starting``, mixed into ``SqlTx``): on PostgreSQL one
statement with everything behind it, nothing read before the ``COMMIT``; and,
when a local worker's lease is offered (a send's direct start), the run, its
queue item and its partition's hint written already taken, as a take and its
settle would leave them, unless a due item of the partition waits
(``record_event_started``; on SQLite in order: ``insert_started_run``, the
item inserted leased, ``settle_started``). No UPDATE follows the INSERTs.
Also the statement parameters every write of events, runs and queue items
shares (``sqltx``).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from typing import Any

from stepstone.store.rows import (
    FIRST_EPOCH,
    EventRow,
    LeasedRun,
    LeaseTerms,
    NewEvent,
    NewRun,
    QueueSpec,
    Recorded,
    RunStatus,
)
from stepstone.store.sqlbase import once
from stepstone.store.sqlqueue import SqlQueue, started_run
from stepstone.store.sqlwaits import SqlWaits


class SqlStart(SqlQueue, SqlWaits):
    """``record_event_starting`` (mixed into ``SqlTx``, which supplies the
    usual writes it falls back on: the hooks below)."""

    def record_event_starting(
        self, event: NewEvent, dedupe_until: float, run: NewRun, lease: LeaseTerms | None = None
    ) -> Callable[[], Recorded]:
        if not self.dialect.write_ctes:  # (in-process: in order, each read at once)
            if self.wait_keys(event.name):
                return lambda: (None, True, None)
            seq = self.record_event(event, dedupe_until)
            started = None
            if seq is not None:
                if lease is None or self.due_ahead(run.queue_spec.partition_key, lease.now, [run.id]):
                    self._create_run(run, [seq])  # (no dataclasses.replace: ~20 calls a send)
                else:
                    started = self._create_started(run, event.stored(seq), lease)
            return lambda: (seq, False, started)
        spec = run.queue_spec
        params = {
            **claim_params(event, dedupe_until),
            **event_params(event),
            "run_id": run.id,
            "function_id": run.function_id,
            "status": run.status,
            "event_ids": json.dumps(list(run.event_ids)),
            "created_at": run.created_at,
            "queue_spec": None if run.spec is None else spec_json(run.spec),
            "partition_key": spec.partition_key,
            "ckey": spec.ckey1,
            "available_at": run.available_at,
        }
        if lease is not None:
            return self._record_started(event, run, lease, params)
        sent = self._exec("record_event_starting", params)
        self._queue_new(run, with_row=True)  # (its queue item only if the run's row was written)

        @once
        def read() -> Recorded:
            row = sent.fetchone()
            return seq_of(row["seq"]), bool(row["awaited"]), None

        self._later_events[run.id] = (lambda: read()[0], event)
        return read

    def _record_started(
        self, event: NewEvent, run: NewRun, lease: LeaseTerms, params: dict[str, Any]
    ) -> Callable[[], Recorded]:
        """``record_event_starting`` with ``lease`` on PostgreSQL: one statement
        (``record_event_started``), its row read after the ``COMMIT``."""
        spec = run.queue_spec
        params.update(
            item_params(spec, run.start_deadline, run.finish_timeout),
            sort_at=run.available_at if run.sort_at is None else run.sort_at,
            owner=lease.owner,
            until=lease.until,
            taken_at=lease.now,
            app_version=lease.app_version,
        )
        sent = self._exec("record_event_started", params)

        @once  # (not a method's closure: ``_later_events`` keeps it, a cycle through the tx)
        def read() -> Recorded:
            row = sent.fetchone()
            if row is None:  # (a duplicate: nothing written)
                return None, False, None
            seq = seq_of(row["seq"])
            if seq is None or row["status"] != RunStatus.RUNNING:
                return seq, bool(row["awaited"]), None  # (a due item waited: queued)
            return seq, False, started_run(row, event.stored(seq), run.start_deadline)

        self._later_events[run.id] = (lambda: read()[0], event)
        return read

    def _create_started(self, run: NewRun, event: EventRow, lease: LeaseTerms) -> LeasedRun:
        """``create_run`` of ``run`` (linked to ``event``, recorded just before)
        written already taken on ``lease``'s terms, as ``take_in_order_later``
        and its settle leave it (SQLite, in order: no UPDATE after)."""
        [row] = self._all(  # (all read: the INSERT's statement done before the next)
            "insert_started_run",
            {
                "id": run.id,
                "function_id": run.function_id,
                "status": RunStatus.RUNNING,
                "event_ids": json.dumps(list(run.event_ids)),
                "created_at": run.created_at,
                "taken_at": lease.now,
                "app_version": lease.app_version,
                "epoch": FIRST_EPOCH,
                "queue_spec": None if run.spec is None else spec_json(run.spec),
            },
        )
        self._exec("insert_run_event", {"run_id": run.id, "position": 0, "event_seq": event.seq})
        spec, timeout = run.queue_spec, run.finish_timeout
        params = {"function_id": run.function_id, "until": lease.until, "taken_at": lease.now}
        self._exec(
            "insert_taken_item",
            {
                **params,
                **item_params(spec, None, timeout),
                "run_id": run.id,
                "sort_at": run.available_at if run.sort_at is None else run.sort_at,
                "finish_deadline": None if timeout is None else lease.now + timeout,
                "owner": lease.owner,
            },
        )
        self._exec("settle_started", {**params, "partition_key": spec.partition_key, "ckey1": spec.ckey1})
        return started_run(row, event, run.start_deadline)

    # -- the usual writes, supplied by ``SqlTx`` ------------------------------------------
    def record_event(self, event: NewEvent, dedupe_until: float) -> int | None:
        raise NotImplementedError

    def _create_run(self, run: NewRun, event_seqs: Sequence[int]) -> None:
        raise NotImplementedError

    def _queue_new(self, run: NewRun, *, with_row: bool = False) -> None:
        raise NotImplementedError


@functools.lru_cache(maxsize=1024)  # (a function's plain spec is one shared object: encoded once)
def spec_json(spec: QueueSpec) -> str:
    return json.dumps(vars(spec))  # (plain values: vars(), not dataclasses.asdict's deep copy)


def seq_of(value: Any) -> int | None:
    return None if value is None else int(value)


def claim_params(event: NewEvent, dedupe_until: float) -> dict[str, Any]:
    """``claim_key``'s parameters for the event's id (``event:<id>``)."""
    return {"key": f"event:{event.id}", "ref": event.id, "expires_at": dedupe_until, "now": event.received_at}


def item_params(
    spec: QueueSpec, start_deadline: float | None, finish_timeout: float | None
) -> dict[str, Any]:
    """A queue item's parameters that come from where it queues and its deadlines."""
    return {
        "partition_key": spec.partition_key,
        "start_deadline": start_deadline,
        "finish_timeout": finish_timeout,
        "ckey1": spec.ckey1,
        "limit1": spec.limit1,
        "ckey2": spec.ckey2,
        "limit2": spec.limit2,
        "throttle_key": spec.throttle_key,
    }


def event_params(event: NewEvent) -> dict[str, Any]:
    return {
        "id": event.id,
        "name": event.name,
        "data": event.data,
        "ts": event.ts,
        "now": event.received_at,
        "trace": event.trace,
    }
