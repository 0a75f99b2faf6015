"""Retention (issue 17): a worker deletes ended runs past ``retention`` with their
rows and the events no remaining run links to, in bounded batches; live runs,
and ended runs a live run invoked, are kept; expired keys, idle GCRA cells and
unused wait keys go too. On both stores."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import stepstone as ss
from stepstone import metrics
from stepstone.actions import replay_op
from stepstone.scheduler.retention import (
    CELL_GRACE,
    ROW_BATCH,
    RUN_BATCH,
    Pace,
    prune_plan,
    run_plan,
    runs_batch_op,
)
from stepstone.store.rows import ENDED_STATUSES, RunStatus
from stepstone.store.viewrows import Pruned

from ..conftest import query, run_of, send_and_wait
from ..polling import wait_for

DEADLINE = 10.0
NOT_ENDED = "paused"  # a live status this branch does not have: kept because it is not ended


def execute(db_url: str, sql: str) -> None:
    """A write straight to either database (what another feature's code might leave)."""
    if db_url.startswith("sqlite:"):
        import sqlite3

        with sqlite3.connect(db_url.removeprefix("sqlite:///")) as conn:
            conn.execute(sql)
        return
    import psycopg

    with psycopg.connect(db_url) as pg:
        pg.execute(sql.encode())


def rows_of(db_url: str, run_id: str) -> dict[str, int]:
    """How many rows each table holds for ``run_id``."""
    where = {"runs": "id", "steps": "run_id", "spans": "run_id", "run_events": "run_id", "waits": "run_id"}
    return {
        t: query(db_url, f"SELECT COUNT(*) FROM {t} WHERE {c} = '{run_id}'")[0][0] for t, c in where.items()
    }


def pruned_total(table: str) -> float:
    """``stepstone_pruned_rows_total{table=...}`` as the process's metrics hold it."""
    from prometheus_client.parser import text_string_to_metric_families

    exposition = metrics.render(metrics.StoreSnapshot(now=0.0, backlog=(), active=()))
    for family in text_string_to_metric_families(exposition.decode()):
        for sample in family.samples:
            if sample.name == "stepstone_pruned_rows_total" and sample.labels == {"table": table}:
                return float(sample.value)
    return 0.0


def events_with_id(db_url: str, event_id: str) -> int:
    return int(query(db_url, f"SELECT COUNT(*) FROM events WHERE id = '{event_id}'")[0][0])


def test_not_ended_is_what_the_store_says_is_not_ended() -> None:
    assert NOT_ENDED not in ENDED_STATUSES and RunStatus.SLEEPING not in ENDED_STATUSES


def test_a_worker_prunes_ended_runs_and_keeps_live_ones_and_invoked_children(
    make_app: Callable[..., ss.App], db_url: str
) -> None:
    app = make_app(retention="1s")
    app.function(id="done", trigger=ss.on_event("done"))(lambda ctx: ctx.step.run("s", lambda: 1))
    app.function(id="child", trigger=ss.on_event("child"))(lambda ctx: ctx.step.run("c", lambda: 2))

    @app.function(id="sleeper", trigger=ss.on_event("sleep"))
    def sleeper(ctx: ss.Context) -> None:
        ctx.step.run("before", lambda: "x")
        ctx.step.sleep("nap", "1h")

    @app.function(id="waiter", trigger=ss.on_event("wait"))
    def waiter(ctx: ss.Context) -> None:
        ctx.step.wait_for_event("w", event="never", timeout="1h")

    @app.function(id="parent", trigger=ss.on_event("parent"))
    def parent(ctx: ss.Context) -> Any:
        got = ctx.step.invoke("call", function="child", data={})
        ctx.step.wait_for_event("hold", event="parent.go", timeout="1h")
        return got

    app.start()
    [parent_event] = app.send(ss.Event("parent"))
    wait_for(lambda: len(app.runs.list(function_id="child", status="completed")) == 1, 10, "the child ends")
    [child] = app.runs.list(function_id="child")
    [sleep_event, other_sleep, wait_event] = app.send(
        [ss.Event("sleep"), ss.Event("sleep"), ss.Event("wait")]
    )
    live = [run_of(app, e) for e in (sleep_event, other_sleep, wait_event, parent_event)]
    wait_for(lambda: {app.runs.get(r.id).status for r in live} == {"sleeping", "waiting"}, 10, "runs parked")
    # A run in a status this code does not know as ended, with an old end time.
    execute(db_url, f"UPDATE runs SET status = '{NOT_ENDED}', ended_at = 1 WHERE id = '{live[1].id}'")
    ended = send_and_wait(app, ss.Event("done", id="done-1"))
    assert rows_of(db_url, ended.id)["steps"] == 1
    counted = pruned_total("runs"), pruned_total("steps")

    # (its event goes in a later batch: the events phase follows the runs phase)
    wait_for(lambda: events_with_id(db_url, "done-1") == 0, 15, "the ended run and its event pruned")
    assert rows_of(db_url, ended.id) == {"runs": 0, "steps": 0, "spans": 0, "run_events": 0, "waits": 0}
    assert pruned_total("runs") >= counted[0] + 1 and pruned_total("steps") >= counted[1] + 1
    # The child ended before it, but its parent is live: kept, as is every live run.
    assert rows_of(db_url, child.id)["runs"] == 1 and app.runs.get(child.id).output == 2
    for run in live:
        kept = rows_of(db_url, run.id)
        assert kept["runs"] == 1 and kept["run_events"] == 1, (run.function_id, kept)
    assert events_with_id(db_url, sleep_event) == 1
    assert app.runs.get(live[0].id).steps[0].output == "x"

    app.send(ss.Event("parent.go"))
    assert app.runs.wait(live[3].id).output == 2
    wait_for(lambda: rows_of(db_url, child.id)["runs"] == 0, 15, "the child pruned after its parent ended")
    wait_for(lambda: rows_of(db_url, live[3].id)["runs"] == 0, 15, "the parent pruned")
    assert rows_of(db_url, live[0].id)["runs"] == 1 and rows_of(db_url, live[1].id)["runs"] == 1


def _prune(
    app: ss.App, retention: float | None, now: float, runs: int = RUN_BATCH, rows: int = ROW_BATCH
) -> list[Pruned]:
    seen: list[Pruned] = []
    pace = Pace(runs=runs, rows=rows, budget=float("inf"), duty=1.0)  # batches of exactly these sizes
    run_plan(prune_plan(retention, now, pace), app.store.transact_sync, seen.append, pace)
    return seen


def test_batches_are_bounded_and_events_other_runs_use_are_kept(app: ss.App, db_url: str) -> None:
    app.function(id="f", trigger=ss.on_event("go"))(lambda ctx: ctx.step.run("s", lambda: 1))
    app.function(id="g", trigger=ss.on_event("go"))(lambda ctx: None)
    app.function(id="idle", trigger=ss.on_event("never-worked"))(lambda ctx: None)
    app.start()
    ids = app.send([ss.Event("go", id=f"e{i}") for i in range(5)])
    for event_id in ids:
        for run in app.runs.list(event_id=event_id):
            app.runs.wait(run.id)
    app.stop()
    [queued_event] = app.send(ss.Event("never-worked"))
    # The run of "g" on e0 is replayed: live again, so e0 stays for it.
    [shared] = app.runs.list(event_id="e0", function_id="g")
    execute(db_url, f"UPDATE runs SET status = 'failed' WHERE id = '{shared.id}'")
    app.runs.replay(shared.id)

    batches = _prune(app, 0.001, time.time() + 5, runs=3, rows=2)
    runs_per_batch = [b.counts["runs"] for b in batches if "runs" in b.counts]
    assert runs_per_batch == [3, 3, 3, 0]  # 9 ended runs, 3 per transaction, then none left
    assert all(b.counts.get("events", 0) <= 2 and b.counts.get("dedupe", 0) <= 2 for b in batches)
    assert sum(b.counts.get("events", 0) for b in batches) == 4  # e1..e4; e0 is still linked
    assert sum(b.counts.get("steps", 0) for b in batches) == 5
    left = app.runs.list()
    assert {r.id for r in left} == {shared.id, run_of(app, queued_event).id}
    assert not {r.status for r in left} & set(ENDED_STATUSES)
    assert events_with_id(db_url, "e0") == 1 and events_with_id(db_url, queued_event) == 1
    assert _prune(app, 0.001, time.time() + 5)[0].counts.get("runs") == 0


def test_a_run_replayed_after_it_was_chosen_is_not_deleted(app: ss.App, db_url: str) -> None:
    app.function(id="f", trigger=ss.on_event("go"), retries=0)(
        lambda ctx: ctx.step.run("s", lambda: 1) and ctx.step.run("boom", lambda: 1 / 0)
    )
    app.start()
    failed = send_and_wait(app, ss.Event("go"))
    assert failed.status == "failed"
    app.stop()
    cutoff = time.time() + 5
    chosen = app.store.read_sync(lambda tx: tx.prunable_runs(cutoff, ENDED_STATUSES, 10))
    assert chosen == [failed.id]
    app.runs.replay(failed.id)  # between the choice and the delete
    pruned = app.store.transact_sync(lambda tx: tx.delete_runs(chosen, cutoff, ENDED_STATUSES))
    assert pruned.counts == {"runs": 0}
    assert app.runs.get(failed.id).status == "running"  # replayed: live again, with its memo
    assert rows_of(db_url, failed.id)["steps"] == 1


def test_expired_keys_idle_cells_and_unused_wait_keys_are_pruned(app: ss.App, db_url: str) -> None:
    app.function(id="limited", trigger=ss.on_event("go"), rate_limit=ss.RateLimit(limit=1, period="1s"))(
        lambda ctx: None
    )

    @app.function(id="waiter", trigger=ss.on_event("start"))
    def waiter(ctx: ss.Context) -> Any:
        got = ctx.step.wait_for_event(
            "w", event=f"pay.{ctx.event.data['k']}", if_="async.data.id == event.data.id", timeout="1h"
        )
        return None if got is None else got.data

    app.start()
    app.send(
        [
            ss.Event("go", id="g1"),
            ss.Event("start", {"k": "a", "id": 1}),
            ss.Event("start", {"k": "b", "id": 2}),
        ]
    )
    wait_for(lambda: len(app.runs.list(function_id="waiter", status="waiting")) == 2, 10, "two waits")
    assert query(db_url, "SELECT COUNT(*) FROM wait_keys")[0][0] == 2
    assert query(db_url, "SELECT COUNT(*) FROM gcra")[0][0] >= 1
    [gone, live] = app.runs.list(function_id="waiter")
    app.runs.cancel(gone.id)  # its wait goes; its key is used by no wait
    app.stop()

    now = time.time()
    total = sum(_prune(app, None, now), Pruned())
    assert total.counts["wait_keys"] == 1 and query(db_url, "SELECT COUNT(*) FROM wait_keys")[0][0] == 1
    assert total.counts["gcra"] == 0  # not idle for CELL_GRACE yet
    later = sum(_prune(app, None, now + 86400 + CELL_GRACE + 1), Pruned())
    assert later.counts["gcra"] >= 1 and later.counts["dedupe"] >= 3
    assert query(db_url, "SELECT COUNT(*) FROM gcra")[0][0] == 0
    assert query(db_url, "SELECT COUNT(*) FROM dedupe WHERE key LIKE 'event:g1%'")[0][0] == 0
    assert "runs" not in later.counts  # retention None: no run is deleted
    # The live wait still matches: its key was kept.
    [(name,)] = query(db_url, "SELECT event_name FROM wait_keys")
    app.start()
    data = {"id": 1 if name == "pay.a" else 2}
    app.send(ss.Event(name, data))
    assert app.runs.wait(live.id).output == data


@pytest.mark.parametrize("value", ["0s", "soon", -5])
def test_an_invalid_retention_names_the_field(value: Any) -> None:
    with pytest.raises(ss.ConfigError) as bad:
        ss.App("a", retention=value)
    assert bad.value.field == "retention"


class _PausedAfterRead:
    """A transaction that stops, after the replay's first read, until told to go
    on: where a prune in another transaction is let in."""

    def __init__(self, tx: Any, read: threading.Event, go_on: threading.Event) -> None:
        self._tx, self._read, self._go_on = tx, read, go_on

    def get_steps(self, run_id: str) -> Any:  # the replay's first call after reading the run
        self._read.set()
        assert self._go_on.wait(DEADLINE)
        return self._tx.get_steps(run_id)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tx, name)


def _blocked_backends(db_url: str) -> int:
    return int(query(db_url, "SELECT COUNT(*) FROM pg_locks WHERE NOT granted")[0][0])


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)  # SQLite serialises writers
def test_a_prune_between_a_replays_read_and_write_never_leaves_a_missing_run_requeued(
    make_app: Callable[..., ss.App], db_url: str
) -> None:
    """The replay has read the failed run; a prune (another worker) deletes that
    run before the replay writes. Either the prune waits and keeps the run the
    replay made live, or the replay finds no run: never a replay that reports
    success over a deleted run, nor a queue row or span without its run."""
    app, pruner = make_app(), make_app()
    app.function(id="f", trigger=ss.on_event("go"), retries=0)(
        lambda ctx: ctx.step.run("s", lambda: 1) and ctx.step.run("boom", lambda: 1 / 0)
    )
    app.start()
    failed = send_and_wait(app, ss.Event("go"))
    app.stop()
    assert failed.status == "failed"
    cutoff = time.time() + 5
    read, go_on, pruned = threading.Event(), threading.Event(), threading.Event()
    outcome: dict[str, Any] = {}

    def replay() -> None:
        op = replay_op(failed.id, time.time())
        try:
            app.store.transact_sync(lambda tx: op(_PausedAfterRead(tx, read, go_on)))
            outcome["replay"] = "replayed"
        except ss.NotFoundError:
            outcome["replay"] = "not found"

    def prune() -> None:
        outcome["pruned"] = pruner.store.transact_sync(runs_batch_op(cutoff, Pace(runs=10)))[0].counts["runs"]
        pruned.set()

    threads = [threading.Thread(target=replay), threading.Thread(target=prune)]
    threads[0].start()
    assert read.wait(DEADLINE)
    threads[1].start()
    wait_for(lambda: pruned.is_set() or _blocked_backends(db_url) > 0, DEADLINE, "the prune done or waiting")
    go_on.set()
    for thread in threads:
        thread.join(DEADLINE)
    assert outcome in ({"replay": "replayed", "pruned": 0}, {"replay": "not found", "pruned": 1}), outcome
    queued = query(db_url, f"SELECT COUNT(*) FROM queue WHERE run_id = '{failed.id}'")[0][0]
    spans = query(db_url, f"SELECT COUNT(*) FROM spans WHERE run_id = '{failed.id}'")[0][0]
    if outcome["replay"] == "replayed":
        assert app.runs.get(failed.id).status == "running" and queued == 1
        assert rows_of(db_url, failed.id)["steps"] == 1  # its completed memo kept
    else:
        assert rows_of(db_url, failed.id)["runs"] == 0 and queued == 0 and spans == 0
