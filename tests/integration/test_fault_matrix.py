"""Every commit site, failed before and after its commit (issue 12).

A workload exercising every kind of step (runs, a transaction step writing a
row of the user's own, a sleep, a wait answered by an event, a wait that times out, invokes, one of them in parallel with a step so that its effect commits
in a plain checkpoint, a send_event, a retried step, a failing run with an
on_failure handler, a run cancelled while it sleeps) runs once without faults,
recording the name of every write operation (``stepstone.store.faults``). It
then runs again once per (site x before/after), with the first write at that
site failed: "before" rolls it back and raises, "after" commits it and raises
as if the connection died at ``COMMIT`` (the ambiguous case). Each run must
end exactly as the fault-free one did:

- every run ends, with the same function, status and output;
- every side effect recorded in a ledger happens as often as without faults
  (at most one step, the one in flight at the failure, may run once more);
  the transaction step's row exists exactly once, whatever failed;
- no event is ingested twice, no child started twice, no wait row left over;
- after each pass, status and queue agree and every unended run is due or
  parked on something that can wake it;
- a cancelled run executes no step after its cancellation.

SQLite runs the full matrix (every occurrence of each journal commit, the
first of every other write); PostgreSQL the first occurrence of the journal's
sites (the ones whose retries carry effects and meet the server-side fence). A
hypothesis test then injects several faults into one workload (SQLite).
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import stepstone as ss
from stepstone.errors import StoreUnavailableError
from stepstone.store import faults
from tests.conftest import FAST, query
from tests.faultrun import Driver, virtual_app

ENDED = "('completed', 'failed', 'cancelled', 'skipped')"
_names = itertools.count()


@dataclass
class Outcome:
    ledger: Counter[str] = field(default_factory=Counter)
    runs: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    events: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)


class _Hooks(ss.Middleware):
    """Counts the worker's on_failure hook: it runs once, when the worker knows
    the run failed (also after an ambiguous commit of the failure)."""

    def __init__(self, ledger: Counter[str]) -> None:
        self.ledger = ledger

    def on_failure(self, ctx: ss.Context, error: ss.ErrorInfo) -> None:
        self.ledger[f"on_failure hook:{ctx.function_id}"] += 1


def build(db_url: str, ledger: Counter[str]) -> ss.App:
    app = virtual_app(db_url)

    def record(label: str) -> Callable[[], str]:
        def effect() -> str:
            ledger[label] += 1
            return label

        return effect

    @app.function(id="child", retries=0)
    async def child(ctx: ss.Context) -> int:
        await ctx.step.run("c", record(f"child:{ctx.event.data['n']}"))
        return int(ctx.event.data["n"]) * 2

    @app.function(id="pinged", trigger=ss.on_event("ping"), retries=0)
    async def pinged(ctx: ss.Context) -> None:
        await ctx.step.run("p", record(f"pinged:{ctx.event.data['n']}"))

    def flaky(attempt: int) -> str:
        ledger[f"main:flaky#{attempt}"] += 1
        if attempt == 0:
            raise RuntimeError("first attempt fails")
        return "steady"

    mark = "?" if db_url.startswith("sqlite:") else "%s"

    def insert_row(conn: Any, run_id: str) -> str:
        conn.execute(f"INSERT INTO user_rows (run_id) VALUES ({mark})", (run_id,))
        return "row"

    @app.function(id="main", trigger=ss.on_event("start"), retries=2, backoff=FAST)
    async def main(ctx: ss.Context) -> Any:
        a = await ctx.step.run("a", record("main:a"))
        await ctx.step.transaction("t", insert_row, ctx.run_id)
        await ctx.step.sleep("nap", "1m")
        answer = await ctx.step.wait_for_event(
            "w", event="answer", timeout="1h", if_="async.data.k == event.data.k"
        )
        missed = await ctx.step.wait_for_event("late", event="never", timeout="5m")
        invoked = await ctx.step.invoke("inv", function=child, data={"n": 21})
        sent = await ctx.step.send_event("s", ss.Event("ping", {"n": 1}))
        steady = await ctx.step.run("flaky", lambda: flaky(ctx.attempt))
        both = await asyncio.gather(
            ctx.step.invoke("inv2", function=child, data={"n": 2}), ctx.step.run("b", record("main:b"))
        )
        return [a, answer.data if answer else None, missed, invoked, len(sent), steady, both]

    def notify(ctx: ss.Context) -> None:
        ctx.step.run("notify", record("doomed:notify"))

    @app.function(
        id="doomed", trigger=ss.on_event("start"), retries=0, on_failure=notify, middleware=[_Hooks(ledger)]
    )
    async def doomed(ctx: ss.Context) -> None:
        await ctx.step.run("d1", record("doomed:d1"))
        await ctx.step.run("d2", lambda: (record("doomed:d2")(), _fail()))

    @app.function(id="sleeper", trigger=ss.on_event("start"), retries=0)
    async def sleeper(ctx: ss.Context) -> None:
        await ctx.step.run("s1", record("sleeper:s1"))
        await ctx.step.sleep("long", "1h")
        await ctx.step.run("s2", record("sleeper:s2"))

    return app


def create_user_table(db_url: str) -> None:
    """The transaction step's table, in the Stepstone database (emptied with it)."""
    ddl = "CREATE TABLE IF NOT EXISTS user_rows (run_id TEXT NOT NULL)"
    if db_url.startswith("sqlite:"):
        import sqlite3

        with sqlite3.connect(db_url.removeprefix("sqlite:///")) as conn:
            conn.execute(ddl)
        return
    import psycopg

    with psycopg.connect(db_url, autocommit=True) as pg:
        pg.execute(ddl)


def _fail() -> NoReturn:
    raise ss.NonRetriableError("doomed")


def agreement(db_url: str) -> list[str]:
    """Status and queue agree; every unended run is due or can be woken."""
    problems = [
        f"run {r} ({s}) has no queue item"
        for r, s in query(
            db_url,
            f"""
        SELECT r.id, r.status FROM runs r LEFT JOIN queue q ON q.run_id = r.id
        WHERE r.status NOT IN {ENDED} AND q.run_id IS NULL""",
        )
    ]
    problems += [
        f"ended run {r} ({s}) is still queued"
        for r, s in query(
            db_url,
            f"""
        SELECT r.id, r.status FROM runs r JOIN queue q ON q.run_id = r.id
        WHERE r.status IN {ENDED}""",
        )
    ]
    problems += [
        f"run {r} is parked with nothing to wake it"
        for (r,) in query(
            db_url,
            """
        SELECT q.run_id FROM queue q WHERE q.available_at IS NULL
        AND NOT EXISTS (SELECT 1 FROM waits w WHERE w.run_id = q.run_id)""",
        )
    ]
    return problems


def _driver(app: ss.App) -> Driver:
    for _ in range(5):  # registering the functions is a commit site too
        try:
            return Driver(app)
        except StoreUnavailableError:
            continue
    return Driver(app)


async def drive(db_url: str) -> Outcome:
    out = Outcome()
    app = build(db_url, out.ledger)
    create_user_table(db_url)
    try:
        driver = _driver(app)
        await driver.send([ss.Event("start", {"k": "x"}, id="start-1")])
        answered = cancelled = False

        async def step() -> bool:
            nonlocal answered, cancelled
            out.problems.extend(agreement(db_url))
            runs = await app.runs.list_async(limit=100)
            by_fn = {r.function_id: r for r in runs}
            main, sleeper = by_fn.get("main"), by_fn.get("sleeper")
            if not answered and main and any(s.id == "w" and s.status == "waiting" for s in main.steps):
                await driver.send([ss.Event("answer", {"k": "x", "v": 1}, id="answer-1")])
                answered = True
            if not cancelled and sleeper and sleeper.status == "sleeping":
                await driver.retried(lambda: app.runs.cancel_async(sleeper.id))
                cancelled = True
            return answered and cancelled and all(r.ended for r in runs)

        await driver.settle(step)
        for run in await app.runs.list_async(limit=100):
            out.runs[(run.function_id, run.status, repr(run.output))] += 1
    finally:
        app.close()
    out.events.update(name for (name,) in query(db_url, "SELECT name FROM events"))
    [(rows,)] = query(db_url, "SELECT COUNT(*) FROM user_rows")
    out.ledger["main:t rows"] = rows
    if query(db_url, "SELECT run_id, step_id FROM waits"):
        out.problems.append("wait rows left over")
    return out


def differences(base: Outcome, got: Outcome, repeats: int = 1) -> list[str]:
    found = list(dict.fromkeys(got.problems))
    if got.runs != base.runs:
        found.append(
            f"runs differ: {sorted((got.runs - base.runs).items())} instead of "
            f"{sorted((base.runs - got.runs).items())}"
        )
    if got.events != base.events:
        found.append(
            f"events differ: {dict(got.events - base.events)} extra, {dict(base.events - got.events)} missing"
        )
    missing = base.ledger - got.ledger
    extra = got.ledger - base.ledger
    if missing:
        found.append(f"effects that never happened: {dict(missing)}")
    if sum(extra.values()) > repeats:  # only a step in flight at a failure may repeat
        found.append(f"effects repeated: {dict(extra)}")
    if got.ledger["sleeper:s2"]:
        found.append("the cancelled run executed a step")
    if got.ledger["main:t rows"] != 1:  # exactly once, even where a step in flight may repeat
        found.append(f"the transaction step left {got.ledger['main:t rows']} rows")
    return found


@pytest.fixture(params=["sqlite", "postgres"])
def databases(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], str]]:
    if request.param == "sqlite":
        yield lambda: f"sqlite:///{tmp_path}/{next(_names)}.db"
        return
    url: str = request.getfixturevalue("pg_url")
    yield lambda: _emptied(url)


def _emptied(url: str) -> str:
    """The database with every table emptied (faster than a new one per pass)."""
    import psycopg

    tables = [
        t
        for (t,) in query(
            url,
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
            " AND tablename <> 'schema_migrations'",
        )
    ]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY".encode())
    return url


WHEN: tuple[faults.When, ...] = ("before", "after")
JOURNAL_SITES = {
    "journal(checkpoint)",
    "journal(checkpoint+_park_or_cancel.park)",
    "journal(checkpoint+_finish.final)",
    "journal(checkpoint+wait_for_event.insert_wait+_park_or_cancel.park)",
    "journal(checkpoint+invoke.start_child+_park_or_cancel.park)",
    "journal(checkpoint+invoke.start_child)",
    "journal(checkpoint+send_event.ingest_sent)",
    "journal(checkpoint+_resolved.timeout)",
    "journal(checkpoint+transaction)",
}


def test_every_commit_site_survives_a_fault_before_and_after_its_commit(
    databases: Callable[[], str], request: pytest.FixtureRequest
) -> None:
    with faults.recording() as seen:
        base = asyncio.run(drive(databases()))
    assert not base.problems, base.problems
    assert base.ledger["main:flaky#1"] == 1 and base.ledger["doomed:notify"] == 1
    assert base.ledger["on_failure hook:doomed"] == 1
    assert set(seen.sites) >= JOURNAL_SITES, seen.sites
    failures: dict[tuple[str, int, str], list[str]] = {}
    for site, nth in plan_of(seen.seen, full="sqlite" in request.node.name):
        for when in WHEN:
            with faults.inject(site, when, nth) as plan:
                got = asyncio.run(drive(databases()))
            assert plan.fired, (site, nth, when)
            found = differences(base, got)
            if found:
                failures[(site, nth, when)] = found
    assert not failures, "\n".join(f"{key}: {found}" for key, found in failures.items())


def plan_of(seen: Counter[str], *, full: bool) -> list[tuple[str, int]]:
    """(site, occurrence) pairs to fail: on SQLite every occurrence of a journal
    commit (each is a different run or step) and the first of every other site;
    on PostgreSQL the first of each journal site (the other writes' retries are
    the same SQL on both stores)."""
    chosen: list[tuple[str, int]] = []
    for site, count in seen.items():
        journal = site.startswith("journal(")
        if full:
            chosen += [(site, n) for n in range(1, (count if journal else 1) + 1)]
        elif journal:
            chosen.append((site, 1))
    return chosen


OTHER_SITES = {
    "App._register.op",
    "App._send.op",
    "Worker._lease.op",
    "timeouts_op.op",
    "cancel_op.op",
    "register_crons_op.op",
}
SITES = sorted(JOURNAL_SITES | OTHER_SITES)
_baseline: list[Outcome] = []


def baseline(tmp: Path) -> Outcome:
    if not _baseline:
        with faults.recording() as seen:
            _baseline.append(asyncio.run(drive(f"sqlite:///{tmp}/baseline.db")))
        assert set(seen.sites) == set(SITES), seen.sites  # a renamed site must be renamed here
    return _baseline[0]


fault_lists = st.lists(
    st.builds(faults.Fault, site=st.sampled_from(SITES), when=st.sampled_from(WHEN), nth=st.integers(1, 4)),
    min_size=2,
    max_size=4,
    unique_by=lambda f: (f.site, f.nth),
)


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(planned=fault_lists)
def test_several_faults_in_one_workload_change_nothing(planned: list[faults.Fault], tmp_path: Path) -> None:
    """Several faults in one workload (SQLite): an ambiguous commit whose retry
    fails too, a lost lease pass and then a lost checkpoint, ..."""
    base = baseline(tmp_path)
    with faults.inject_all(planned) as plan:
        got = asyncio.run(drive(f"sqlite:///{tmp_path}/{next(_names)}.db"))
    assert not differences(base, got, repeats=len(plan.injected)), plan.injected
