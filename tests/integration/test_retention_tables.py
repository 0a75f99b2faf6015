"""Retention of the tables pruned by their own rule (issue 17): finished jobs,
functions no deploy registers (and their schedules) once retired past the
retention and without runs, batches and debounces whose run is gone, and a
run's signals with it. The keep-rules hold: an active function, a retired one
with runs left, a pending batch or debounce, a live run's signals, a job not
finished, all stay. On both stores."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

import pytest

import stepstone as ss
from stepstone import metrics
from stepstone.scheduler.retention import Pace, count_prunable_op, prune_plan, run_plan
from stepstone.store.viewrows import Pruned

from ..conftest import query, send_and_wait
from ..polling import wait_for
from .test_retention import execute, pruned_total

RETENTION = 60.0
LATER = 3 * 86400.0  # the prune looks this far ahead: all written now (and tomorrow's cron ticks) is older


def count(db_url: str, table: str, where: str = "1 = 1") -> int:
    return int(query(db_url, f"SELECT COUNT(*) FROM {table} WHERE {where}")[0][0])


def _deploy_v1(make_app: Callable[..., ss.App]) -> ss.App:
    app = make_app("shop")
    for name in ("old", "old_live", "kept"):
        app.function(id=name, trigger=[ss.on_event(name), ss.on_cron("0 3 * * *")])(
            lambda ctx: ctx.step.run("s", lambda: 1)
        )

    @app.function(id="sleepy", trigger=ss.on_event("sleepy"))
    def sleepy(ctx: ss.Context) -> Any:
        ctx.step.sleep("nap", "1h")

    @app.function(id="waits", trigger=ss.on_event("waits"))
    def waits(ctx: ss.Context) -> Any:
        return ctx.step.wait_for_signal("w", "go", timeout="1h")

    app.function(id="deb", trigger=ss.on_event("deb"), debounce=ss.Debounce(period="1h"))(lambda ctx: None)
    app.function(id="bat", trigger=ss.on_event("bat"), batch=ss.Batch(max_size=5, timeout="1h"))(
        lambda ctx: None
    )
    return app


def test_jobs_functions_crons_batches_debounces_and_signals_follow_their_rules(
    make_app: Callable[..., ss.App], db_url: str
) -> None:
    v1 = _deploy_v1(make_app)
    v1.start()
    send_and_wait(v1, ss.Event("old"))
    [waiting] = [v1.runs.list(event_id=e)[0] for e in v1.send(ss.Event("waits"))]
    wait_for(lambda: v1.runs.get(waiting.id).status == "waiting", 10, "the signal wait")
    v1.runs.signal(waiting.id, "other", 1)  # never received: the run is live, so kept
    [signalled] = [v1.runs.list(event_id=e)[0] for e in v1.send(ss.Event("waits"))]
    wait_for(lambda: v1.runs.get(signalled.id).status == "waiting", 10, "the second wait")
    v1.runs.signal(signalled.id, "go", 2)
    assert v1.runs.wait(signalled.id).output == 2  # ended: its signal goes with it
    [old_live_event] = v1.send(ss.Event("sleepy"))
    v1.send([ss.Event("deb"), ss.Event("bat")])  # pending: their rows stay with their runs
    wait_for(lambda: v1.runs.list(event_id=old_live_event)[0].status == "sleeping", 10, "the nap")
    v1.stop()
    # The next deploy has only "kept": the six others are retired.
    v2 = make_app("shop")
    v2.function(id="kept", trigger=[ss.on_event("kept"), ss.on_cron("0 3 * * *")])(lambda ctx: None)
    v2.start()
    v2.stop()
    assert count(db_url, "functions", "retired_at IS NOT NULL") == 6
    now = time.time()
    _orphans_and_jobs(db_url, now)

    counted = {t: pruned_total(t) for t in ("functions", "crons", "jobs", "signals")}
    total = _prune(v2, now + LATER)
    assert {t: pruned_total(t) - n for t, n in counted.items()} == {  # the metric, per table
        "functions": 2,
        "crons": 2,
        "jobs": 1,
        "signals": 1,
    }
    assert total.counts["runs"] == 2 and total.counts["signals"] == 1  # "old" and the signalled run
    assert total.counts["jobs"] == 1 and total.counts["batches"] == 1 and total.counts["debounces"] == 1
    assert count(db_url, "signals") == 1 and count(db_url, "signals", f"run_id = '{waiting.id}'") == 1
    assert count(db_url, "jobs") == 2 and count(db_url, "jobs", "id = 'old-done'") == 0
    assert count(db_url, "batches", "run_id = 'gone'") == 0 and count(db_url, "batches") == 1
    assert count(db_url, "debounces", "run_id = 'gone'") == 0 and count(db_url, "debounces") == 1
    # Retired with no run left ("old", "old_live") go, with their schedules; retired ones
    # with a live run, and the active one, stay, "kept" with its schedule.
    left = {row[0] for row in query(db_url, "SELECT id FROM functions")}
    assert left == {"kept", "sleepy", "waits", "deb", "bat"}, left
    assert total.counts["functions"] == 2 and total.counts["crons"] == 2
    assert {row[0] for row in query(db_url, "SELECT function_id FROM crons")} == {"kept"}
    assert _prune(v2, now + LATER).total == 0  # nothing more to do


def _orphans_and_jobs(db_url: str, now: float) -> None:
    """A batch and a debounce whose run is gone, and three jobs: finished long
    ago (pruned), finished just now (kept), still running (kept)."""
    execute(db_url, "INSERT INTO batches (key, run_id, size, first_at) VALUES ('k-gone', 'gone', 1, 1)")
    execute(db_url, "INSERT INTO debounces (key, run_id, first_at) VALUES ('k-gone', 'gone', 1)")
    for job_id, status, finished in (
        ("old-done", "completed", "1"),
        ("new-done", "failed", str(now + LATER)),
        ("running", "running", "NULL"),
    ):
        execute(
            db_url,
            "INSERT INTO jobs (id, kind, status, params, created_at, updated_at, finished_at)"
            f" VALUES ('{job_id}', 'replay', '{status}', '{{}}', 1, 1, {finished})",
        )


def _prune(app: ss.App, now: float) -> Pruned:
    pace = Pace(duty=1.0)  # no rest beyond the minimum: the test's database is idle
    counted = lambda batch: metrics.pruned(batch.counts)  # noqa: E731 - as the worker and the CLI count
    return run_plan(prune_plan(RETENTION, now, pace), app.store.transact_sync, counted, pace)


def test_a_dry_run_counts_every_table_and_deletes_nothing(
    make_app: Callable[..., ss.App], db_url: str
) -> None:
    app = make_app()
    app.function(id="f", trigger=ss.on_event("go"))(lambda ctx: ctx.step.run("s", lambda: 1))
    app.start()
    send_and_wait(app, ss.Event("go"))
    app.stop()
    now = time.time()
    _orphans_and_jobs(db_url, now)
    counts = app.store.read_sync(count_prunable_op(RETENTION, now + LATER))
    assert counts["runs"] == 1 and counts["jobs"] == 1
    assert counts["batches"] == 1 and counts["debounces"] == 1 and counts["dedupe"] == 1
    assert count(db_url, "runs") == 1 and count(db_url, "jobs") == 3


@pytest.mark.parametrize("seed", [1, 2])
def test_a_dry_run_counts_what_the_prune_then_deletes(
    make_app: Callable[..., ss.App], db_url: str, seed: int
) -> None:
    """On random data: ended runs (their events freed only by their deletion),
    events nothing links, a retired function whose runs all go, a live run
    keeping its event and its retired function. Every count of the dry run
    equals what the prune then deletes."""
    rng = random.Random(seed)
    v1 = make_app("shop")
    for name in ("done", "gone"):
        v1.function(id=name, trigger=ss.on_event(name))(lambda ctx: ctx.step.run("s", lambda: 1))

    @v1.function(id="sleepy", trigger=ss.on_event("sleepy"))
    def sleepy(ctx: ss.Context) -> None:
        ctx.step.sleep("nap", "1h")

    v1.start()
    for name in ["done"] * rng.randint(1, 4) + ["gone"] * rng.randint(1, 3):
        send_and_wait(v1, ss.Event(name))
    v1.send([ss.Event("nothing") for _ in range(rng.randint(0, 3))])  # no run links them
    sleeping = [e for _ in range(rng.randint(1, 2)) for e in v1.send(ss.Event("sleepy"))]
    wait_for(lambda: all(v1.runs.list(event_id=e)[0].status == "sleeping" for e in sleeping), 10, "naps")
    v1.stop()
    v2 = make_app("shop")  # retires "gone" and "sleepy"
    v2.function(id="done", trigger=ss.on_event("done"))(lambda ctx: None)
    v2.start()
    v2.stop()
    now = time.time() + LATER
    counts = v2.store.read_sync(count_prunable_op(RETENTION, now))
    deleted = _prune(v2, now).counts
    for table in ("runs", "events", "functions", "jobs", "crons", "batches", "debounces", "dedupe"):
        assert counts[table] == deleted.get(table, 0), (table, counts, deleted)
