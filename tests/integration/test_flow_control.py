"""Flow control, each with a test that fails if the control were ignored."""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from typing import Any

import stepstone as ss
from stepstone.testing import TestEnv

from ..conftest import run_of


class Gauge:
    """Counts steps executing at once per key, from inside the steps."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now: Counter[str] = Counter()
        self.peak: Counter[str] = Counter()

    def step(self, key: str, seconds: float) -> Any:
        def fn() -> str:
            with self.lock:
                self.now[key] += 1
                self.peak[key] = max(self.peak[key], self.now[key])
            time.sleep(seconds)
            with self.lock:
                self.now[key] -= 1
            return key

        return fn


def wait_all(app: ss.App, function_id: str, count: int, timeout: float = 60) -> list[ss.Run]:
    deadline = time.monotonic() + timeout
    while True:
        runs = app.runs.list(function_id=function_id, limit=1000)
        if len(runs) == count and all(r.ended for r in runs):
            return runs
        assert time.monotonic() < deadline, f"{sum(r.ended for r in runs)}/{count} ended"
        time.sleep(0.05)


def test_concurrency_limit_per_key_under_200_runs(app: ss.App) -> None:
    gauge = Gauge()

    @app.function(
        id="sync", trigger=ss.on_event("sync"), concurrency=ss.Concurrency(limit=2, key="event.data.tenant")
    )
    def sync(ctx: ss.Context) -> None:
        tenant = ctx.event.data["tenant"]
        ctx.step.run("a", gauge.step(tenant, 0.004))
        ctx.step.run("b", gauge.step(tenant, 0.004))

    app.start(concurrency=16)
    app.send([ss.Event("sync", {"tenant": f"t{i % 4}"}) for i in range(200)])
    runs = wait_all(app, "sync", 200)
    assert all(r.status == "completed" for r in runs)
    assert max(gauge.peak.values()) == 2  # never above the limit...
    assert sum(gauge.peak.values()) == 8  # ...and every tenant reached it (4 x 2)


def test_sleeping_runs_hold_no_concurrency_slot(app: ss.App) -> None:
    @app.function(id="one", trigger=ss.on_event("one"), concurrency=ss.Concurrency(limit=1))
    async def one(ctx: ss.Context) -> str:
        await ctx.step.run("work", lambda: "w")
        if ctx.event.data.get("sleep"):
            await ctx.step.sleep("nap", "30s")
        return "done"

    app.start()
    [sleeper_event] = app.send(ss.Event("one", {"sleep": True}))
    sleeper = run_of(app, sleeper_event)
    deadline = time.monotonic() + 10
    while app.runs.get(sleeper.id).status != "sleeping":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    [other_event] = app.send(ss.Event("one"))
    assert app.runs.wait(run_of(app, other_event).id, timeout="5s").status == "completed"


def test_env_scoped_key_is_shared_across_functions(app: ss.App) -> None:
    gauge = Gauge()
    limit = ss.Concurrency(limit=1, key="event.data.account", scope="env")

    @app.function(id="a", trigger=ss.on_event("a"), concurrency=limit)
    def a(ctx: ss.Context) -> None:
        ctx.step.run("call", gauge.step("acct", 0.01))

    @app.function(id="b", trigger=ss.on_event("b"), concurrency=limit)
    def b(ctx: ss.Context) -> None:
        ctx.step.run("call", gauge.step("acct", 0.01))

    app.start(concurrency=8)
    app.send([ss.Event(name, {"account": "x"}) for name in "ab" * 15])
    wait_all(app, "a", 15)
    wait_all(app, "b", 15)
    assert gauge.peak["acct"] == 1


def test_two_limits_apply_together(app: ss.App) -> None:
    gauge = Gauge()

    @app.function(
        id="f",
        trigger=ss.on_event("f"),
        concurrency=[ss.Concurrency(limit=2, key="event.data.tenant"), ss.Concurrency(limit=3)],
    )
    def f(ctx: ss.Context) -> None:
        ctx.step.run("s", gauge.step(ctx.event.data["tenant"], 0.01))
        ctx.step.run("all", gauge.step("all", 0.01))

    def total() -> Any:
        return gauge.step("total", 0.0)

    app.start(concurrency=12)
    app.send([ss.Event("f", {"tenant": f"t{i % 3}"}) for i in range(60)])
    wait_all(app, "f", 60)
    assert max(gauge.peak[f"t{i}"] for i in range(3)) <= 2
    assert gauge.peak["all"] <= 3
    del total


def test_throttle_obeys_the_gcra_bound_and_drops_nothing(app: ss.App) -> None:
    starts: list[float] = []
    interval, burst = 0.1, 2

    @app.function(id="t", trigger=ss.on_event("t"), throttle=ss.Throttle(limit=10, period="1s", burst=burst))
    def t(ctx: ss.Context) -> None:
        ctx.step.run("start", lambda: starts.append(time.monotonic()))

    app.start(concurrency=10)
    app.send([ss.Event("t", {"i": i}) for i in range(15)])
    runs = wait_all(app, "t", 15)
    assert all(r.status == "completed" for r in runs)  # none dropped
    assert len(starts) == 15
    # The bound holds when runs start (are leased, the throttle's clock), not when
    # their first step gets a thread, which a loaded machine may delay unevenly.
    starts = sorted(r.started_at.timestamp() for r in runs if r.started_at is not None)
    for i in range(len(starts)):
        for j in range(i + 1, len(starts)):
            # GCRA: at most burst + (window / interval) starts in any window
            assert starts[j] - starts[i] >= (j - i - (burst - 1)) * interval - 0.03, (i, j)
    assert starts[-1] - starts[0] >= (15 - burst) * interval - 0.03


def test_rate_limit_skips_excess_runs_with_a_reason(app: ss.App) -> None:
    app.function(
        id="r", trigger=ss.on_event("r"), rate_limit=ss.RateLimit(limit=2, period="1h", key="event.data.user")
    )(lambda ctx: None)
    app.send([ss.Event("r", {"user": u}) for u in ["a", "a", "a", "b", "a", "b"]])
    runs = app.runs.list(function_id="r")
    assert Counter(r.status for r in runs) == {"queued": 4, "skipped": 2}
    skipped = app.runs.list(function_id="r", status="skipped")
    assert all("rate limit" in r.meta["skipped"] for r in skipped)


def test_debounce_runs_once_with_the_last_event(app: ss.App) -> None:
    seen: list[Any] = []

    @app.function(
        id="d", trigger=ss.on_event("typing"), debounce=ss.Debounce(period="300ms", key="event.data.doc")
    )
    def d(ctx: ss.Context) -> None:
        seen.append((ctx.event.data["doc"], ctx.event.data["n"], len(ctx.events)))

    app.start()
    for n in range(5):
        app.send([ss.Event("typing", {"doc": "A", "n": n}), ss.Event("typing", {"doc": "B", "n": n})])
        time.sleep(0.05)
    wait_all(app, "d", 2, timeout=10)
    assert sorted(seen) == [("A", 4, 1), ("B", 4, 1)]


def test_debounce_timeout_bounds_the_delay(app: ss.App) -> None:
    started: list[float] = []

    @app.function(id="d", trigger=ss.on_event("tick"), debounce=ss.Debounce(period="300ms", timeout="600ms"))
    def d(ctx: ss.Context) -> None:
        started.append(time.monotonic())

    app.start()
    t0 = time.monotonic()
    while time.monotonic() - t0 < 1.2:  # never quiet for 300 ms
        app.send(ss.Event("tick"))
        time.sleep(0.05)
    deadline = time.monotonic() + 10
    while not started:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert started[0] - t0 < 0.6 + 0.5  # capped by the timeout, not pushed to the end


def test_batches_respect_size_and_timeout(app: ss.App) -> None:
    batches: list[list[int]] = []

    @app.function(id="b", trigger=ss.on_event("item"), batch=ss.Batch(max_size=3, timeout="300ms"))
    def b(ctx: ss.Context) -> None:
        batches.append([e.data["i"] for e in ctx.events])

    app.start()
    app.send([ss.Event("item", {"i": i}) for i in range(7)])
    wait_all(app, "b", 3, timeout=10)
    assert sorted(batches) == [[0, 1, 2], [3, 4, 5], [6]]
    [late] = [r for r in app.runs.list(function_id="b") if len(r.event_ids) == 1]
    assert late.started_at is not None and (late.started_at - late.created_at).total_seconds() >= 0.29


def test_priority_moves_runs_ahead() -> None:
    order: list[str] = []
    app = ss.App("prio", database_url="sqlite:///unused.db")

    @app.function(
        id="p",
        trigger=ss.on_event("job"),
        priority=ss.Priority(run="event.data.plan == 'enterprise' ? 120 : 0"),
    )
    def p(ctx: ss.Context) -> None:
        order.append(ctx.event.data["name"])

    with TestEnv(app, concurrency=1) as env:
        app.send([ss.Event("job", {"name": f"free{i}", "plan": "free"}) for i in range(3)])
        env.clock.advance(60)  # queued a minute later, but 120 s of priority
        app.send(ss.Event("job", {"name": "big", "plan": "enterprise"}))
        env.clock.advance(200)
        app.send(ss.Event("job", {"name": "late-big", "plan": "enterprise"}))  # 200 s later: behind
        env.run_until_idle()
    assert order == ["big", "free0", "free1", "free2", "late-big"]


def test_noisy_tenant_does_not_block_another(app: ss.App) -> None:
    starts: dict[str, list[float]] = defaultdict(list)

    @app.function(
        id="n", trigger=ss.on_event("n"), concurrency=ss.Concurrency(limit=2, key="event.data.tenant")
    )
    def n(ctx: ss.Context) -> None:
        ctx.step.run("work", work, ctx.event.data["tenant"])

    def work(tenant: str) -> None:
        starts[tenant].append(time.monotonic())
        time.sleep(0.02)

    app.start(concurrency=4)
    app.send([ss.Event("n", {"tenant": "noisy"}) for _ in range(80)])
    time.sleep(0.1)
    app.send([ss.Event("n", {"tenant": "quiet"}) for _ in range(3)])
    wait_all(app, "n", 83)
    assert max(starts["quiet"]) < max(starts["noisy"]) - 0.3  # quiet finished long before noisy
