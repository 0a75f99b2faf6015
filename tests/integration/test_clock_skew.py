"""Machines whose clocks disagree share one database: every lease, deadline and
due time must be decided on one clock, the database's.

A skewed machine is simulated by a ``SystemClock`` subclass with a fixed
offset; the apps under test run on PostgreSQL, where each worker process may
live on another machine (SQLite's processes share one machine's clock).
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import psycopg
import pytest

import stepstone as ss
from stepstone.clock import SystemClock

from ..polling import wait_for

pytestmark = pytest.mark.parametrize("db_url", ["postgres"], indirect=True)

TTL = 2.0  # seconds; the skew below is thirty times larger


class SkewedClock(SystemClock):
    """This machine's clock, wrong by a fixed number of seconds."""

    def __init__(self, offset: float) -> None:
        self.offset = offset

    def now(self) -> float:
        return time.time() + self.offset


class Ledger:
    """Executions per (run, step) and the peak of steps executing at once per key,
    recorded from inside the steps."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.runs: Counter[tuple[str, str]] = Counter()
        self.now: Counter[str] = Counter()
        self.peak: Counter[str] = Counter()
        self.started = threading.Event()

    def step(self, run_id: str, step_id: str, key: str, seconds: float) -> None:
        with self.lock:
            self.runs[run_id, step_id] += 1
            self.now[key] += 1
            self.peak[key] = max(self.peak[key], self.now[key])
        self.started.set()
        time.sleep(seconds)
        with self.lock:
            self.now[key] -= 1


def _register(app: ss.App, ledger: Ledger) -> None:
    @app.function(
        id="work", trigger=ss.on_event("work"), concurrency=ss.Concurrency(limit=1, key="event.data.key")
    )
    def work(ctx: ss.Context) -> str:
        key: str = ctx.event.data["key"]
        for step_id in ("a", "b", "c"):
            ctx.step.run(step_id, lambda s=step_id: ledger.step(ctx.run_id, s, key, 0.15))
        return key


def db_now(url: str) -> float:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
        assert row is not None
        return float(row[0])


def test_a_worker_skewed_past_the_lease_ttl_neither_reruns_steps_nor_exceeds_limits(db_url: str) -> None:
    """Worker B's clock is a minute ahead. A holds a run under a 2 s lease when
    B starts: on B's own clock that lease expired long ago, so B would take the
    run A is executing (its steps run twice) and count no live lease on the key
    (the limit of 1 is exceeded). On the database's clock neither happens."""
    ledger = Ledger()
    on_time = ss.App("skew", database_url=db_url)
    ahead = ss.App("skew", database_url=db_url, clock=SkewedClock(+60.0))
    for app in (on_time, ahead):
        _register(app, ledger)
    try:
        on_time.start(concurrency=4, lease_ttl=TTL, instance_id="on-time")
        on_time.send([ss.Event("work", {"key": f"k{i % 2}"}) for i in range(8)])
        assert ledger.started.wait(10)  # the on-time worker holds leases now
        ahead.start(concurrency=4, lease_ttl=TTL, instance_id="ahead")

        def all_ended() -> bool:
            runs = on_time.runs.list(function_id="work")
            return len(runs) == 8 and all(r.ended for r in runs)

        wait_for(all_ended, 60, "every run to end")
        runs = on_time.runs.list(function_id="work")
        assert [r.status for r in runs] == ["completed"] * 8
        twice = {k: n for k, n in ledger.runs.items() if n != 1}
        assert twice == {}, f"steps executed more than once: {twice}"
        assert len(ledger.runs) == 8 * 3
        assert max(ledger.peak.values()) == 1, ledger.peak
    finally:
        on_time.close()
        ahead.close()


def test_a_skewed_client_cancels_a_leased_run_between_steps(db_url: str) -> None:
    """``app.runs.cancel`` decides "leased or not" on its own process's clock: a
    client a minute ahead saw the worker's lease as expired and ended the run at
    once, under the step in flight (whose checkpoint was then refused). On the
    database's clock the run is flagged and cancelled after that step."""
    started, release = threading.Event(), threading.Event()
    worker = ss.App("skew", database_url=db_url)
    client = ss.App("skew", database_url=db_url, clock=SkewedClock(+60.0))

    def long_step() -> str:
        started.set()
        assert release.wait(10)
        return "done"

    @worker.function(id="job", trigger=ss.on_event("job"))
    def job(ctx: ss.Context) -> None:
        ctx.step.run("long", long_step)
        ctx.step.run("after", lambda: "never")

    try:
        worker.start(lease_ttl=TTL)
        [event_id] = worker.send(ss.Event("job"))
        assert started.wait(10)
        [run] = client.runs.list(event_id=event_id)
        assert client.runs.cancel(run.id) == "running"  # flagged, not ended under the step
        release.set()
        done = client.runs.wait(run.id, timeout="10s")
        assert done.status == "cancelled"
        assert [(s.id, s.status) for s in done.steps] == [("long", "completed")]
    finally:
        release.set()
        worker.close()
        client.close()


@pytest.mark.parametrize("offset", [-3600.0, +60.0, +86400.0])
def test_every_time_a_skewed_app_writes_is_database_time(db_url: str, offset: float) -> None:
    """The class of the bug, not one query: whatever a process writes or compares
    (events, runs, steps, sleeps, spans, leases, its worker row) is on the
    database's clock, however wrong the machine's clock is."""
    tolerance = 0.5  # seconds; a loopback round trip is far below this
    before = db_now(db_url)
    app = ss.App("skew", database_url=db_url, clock=SkewedClock(offset))

    @app.function(id="steps", trigger=ss.on_event("go"), timeouts=ss.Timeouts(finish="1h"))
    def steps(ctx: ss.Context) -> str:
        ctx.step.run("one", lambda: 1)
        ctx.step.sleep("nap", "300ms")
        return str(ctx.step.run("two", lambda: 2))

    try:
        app.start(lease_ttl=TTL)
        [event_id] = app.send(ss.Event("go"))
        [run] = app.runs.list(event_id=event_id)
        done = app.runs.wait(run.id, timeout="20s")  # a sleep 300 ms long on the server's clock
        assert (done.status, done.output) == ("completed", "2")
        wait_for(lambda: bool(app.workers.list()), 10, "the worker row")
        after = db_now(db_url)
        with psycopg.connect(db_url) as conn:
            stamps = conn.execute(
                "SELECT 'event', received_at FROM events UNION ALL "
                "SELECT 'run created', created_at FROM runs UNION ALL "
                "SELECT 'run started', started_at FROM runs UNION ALL "
                "SELECT 'run ended', ended_at FROM runs UNION ALL "
                "SELECT 'step started ' || step_id, started_at FROM steps WHERE started_at IS NOT NULL "
                "UNION ALL SELECT 'step ended ' || step_id, ended_at FROM steps WHERE ended_at IS NOT NULL "
                "UNION ALL SELECT 'sleep until', wake_at FROM steps WHERE wake_at IS NOT NULL "
                "UNION ALL SELECT 'span ' || name, started_at FROM spans UNION ALL "
                "SELECT 'worker started', started_at FROM workers UNION ALL "
                "SELECT 'heartbeat', heartbeat_at FROM workers UNION ALL "
                "SELECT 'function registered', updated_at FROM functions UNION ALL "
                "SELECT 'dedupe expiry - 24 h', expires_at - 86400 FROM dedupe"
            ).fetchall()
        assert len(stamps) >= 12
        wrong = [
            (what, round(at - before, 3))
            for what, at in stamps
            if not before - tolerance <= at <= after + tolerance
        ]
        assert wrong == [], f"times off the database's clock (seconds after the start): {wrong}"
        assert abs(app.clock.now() - db_now(db_url)) < tolerance
    finally:
        app.close()
