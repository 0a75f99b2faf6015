"""Steps: memoization, loops, parallelism, idempotency keys, sync and async."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import stepstone as ss
from stepstone.store import make_store

from ..conftest import FAST, send_and_wait


def test_async_handler_runs_steps_in_order(app: ss.App) -> None:
    order: list[str] = []

    async def work(name: str) -> str:
        order.append(name)
        return name.upper()

    @app.function(id="f", trigger=ss.on_event("go"))
    async def f(ctx: ss.Context) -> list[str]:
        a = await ctx.step.run("a", work, "a")
        b = await ctx.step.run("b", work, "b")
        return [a, b]

    app.start()
    run = send_and_wait(app, ss.Event("go"))
    assert run.status == "completed" and run.output == ["A", "B"]
    assert order == ["a", "b"]
    assert [(s.id, s.status, s.attempts, s.output) for s in run.steps] == [
        ("a", "completed", 1, "A"),
        ("b", "completed", 1, "B"),
    ]


def test_sync_handler_and_mixed_step_functions(app: ss.App) -> None:
    threads: set[str] = set()

    def sync_step(x: int) -> int:
        threads.add(threading.current_thread().name)
        return x * 2

    async def async_step(x: int) -> int:
        return x + 1

    @app.function(id="f", trigger=ss.on_event("go"))
    def f(ctx: ss.Context) -> int:
        a = ctx.step.run("double", sync_step, ctx.event.data["x"])
        b = ctx.step.run("inc", async_step, a)
        return int(b)

    app.start()
    run = send_and_wait(app, ss.Event("go", {"x": 20}))
    assert run.output == 41
    assert "MainThread" not in threads  # plain handlers run off the event loop


def test_completed_steps_never_rerun_when_a_later_step_retries(app: ss.App) -> None:
    calls: Counter[str] = Counter()

    def step(name: str) -> str:
        calls[name] += 1
        if name == "c" and calls[name] < 3:
            raise RuntimeError("flaky")
        return name

    @app.function(id="f", trigger=ss.on_event("go"), backoff=FAST)
    def f(ctx: ss.Context) -> str:
        return "".join(ctx.step.run(n, step, n) for n in "abc")

    app.start()
    run = send_and_wait(app, ss.Event("go"))
    assert run.output == "abc"
    assert calls == {"a": 1, "b": 1, "c": 3}
    assert [s.attempts for s in run.steps] == [1, 1, 3]


def test_repeated_ids_in_a_loop_get_suffixes(app: ss.App) -> None:
    @app.function(id="f", trigger=ss.on_event("go"))
    async def f(ctx: ss.Context) -> list[int]:
        out = []
        for i in range(3):
            out.append(await ctx.step.run("item", lambda i=i: i * 10))
        return out

    app.start()
    run = send_and_wait(app, ss.Event("go"))
    assert run.output == [0, 10, 20]
    assert [s.id for s in run.steps] == ["item", "item:1", "item:2"]


def test_parallel_and_gather_run_concurrently(app: ss.App) -> None:
    barrier = asyncio.Event()
    arrived: list[str] = []

    async def meet(name: str) -> str:
        arrived.append(name)
        if len(arrived) == 2:
            barrier.set()
        await asyncio.wait_for(barrier.wait(), 5)  # fails unless both run at once
        return name

    @app.function(id="f", trigger=ss.on_event("go"))
    async def f(ctx: ss.Context) -> list[Any]:
        first = await ctx.step.parallel(
            lambda: ctx.step.run("p1", meet, "x"), lambda: ctx.step.run("p2", meet, "y")
        )
        barrier.clear()
        arrived.clear()
        second = await asyncio.gather(ctx.step.run("g1", meet, "u"), ctx.step.run("g2", meet, "v"))
        return [first, list(second)]

    app.start()
    run = send_and_wait(app, ss.Event("go"))
    assert run.status == "completed", run.error
    assert run.output == [["x", "y"], ["u", "v"]]


def test_sync_parallel(app: ss.App) -> None:
    barrier = threading.Barrier(3, timeout=5)

    def meet(name: str) -> str:
        barrier.wait()
        return name

    @app.function(id="f", trigger=ss.on_event("go"))
    def f(ctx: ss.Context[ss.SyncStep]) -> list[Any]:
        return ctx.step.parallel(*(lambda n=n: ctx.step.run(f"p{n}", meet, n) for n in "abc"))

    app.start()
    run = send_and_wait(app, ss.Event("go"))
    assert run.output == ["a", "b", "c"]


def test_parallel_branch_failure_keeps_sibling_results(app: ss.App) -> None:
    calls: Counter[str] = Counter()

    async def ok() -> str:
        calls["ok"] += 1
        await asyncio.sleep(0.05)
        return "ok"

    async def flaky() -> str:
        calls["flaky"] += 1
        if calls["flaky"] == 1:
            raise RuntimeError("first attempt fails")
        return "flaky"

    @app.function(id="f", trigger=ss.on_event("go"), backoff=FAST)
    async def f(ctx: ss.Context) -> list[Any]:
        return list(await asyncio.gather(ctx.step.run("ok", ok), ctx.step.run("flaky", flaky)))

    app.start()
    run = send_and_wait(app, ss.Event("go"))
    assert run.output == ["ok", "flaky"]
    assert calls == {"ok": 1, "flaky": 2}  # the slow sibling was checkpointed, not re-run


def test_idempotency_key_is_stable_across_retries(app: ss.App) -> None:
    keys: list[str] = []

    def charge() -> str:
        keys.append(ss_key[0])
        if len(keys) < 3:
            raise RuntimeError("gateway timeout")
        return "charged"

    ss_key: list[str] = []

    @app.function(id="f", trigger=ss.on_event("go"), backoff=FAST)
    def f(ctx: ss.Context) -> list[str]:
        ss_key[:] = [ctx.step.idempotency_key("charge")]
        ctx.step.run("charge", charge)
        inside = ctx.step.run("inner", lambda: ctx.step.idempotency_key())
        return [ss_key[0], inside]

    app.start()
    run = send_and_wait(app, ss.Event("go"))
    assert len(set(keys)) == 1 and len(keys) == 3
    assert run.output[0] == keys[0]
    assert run.output[1] != keys[0]  # the key of the step named "inner"


def test_each_step_is_committed_before_the_next_starts(app: ss.App, db_url: str) -> None:
    observer = make_store(db_url)  # another store, other connections: sees only commits

    def committed_steps(run_id: str) -> list[str]:
        return [
            s.step_id for s in observer.read_sync(lambda tx: tx.get_steps(run_id)) if s.status == "completed"
        ]

    @app.function(id="f", trigger=ss.on_event("go"))
    def f(ctx: ss.Context) -> list[list[str]]:
        ctx.step.run("one", lambda: 1)
        seen_by_two = ctx.step.run("two", committed_steps, ctx.run_id)
        seen_by_three = ctx.step.run("three", committed_steps, ctx.run_id)
        return [seen_by_two, seen_by_three]

    app.start()
    run = send_and_wait(app, ss.Event("go"))
    observer.close()
    assert run.output == [["one"], ["one", "two"]]


def test_non_serialisable_output_fails_the_step_clearly(app: ss.App) -> None:
    calls = Counter[str]()

    def bad() -> object:
        calls["bad"] += 1
        return object()

    @app.function(id="f", trigger=ss.on_event("go"), backoff=FAST)
    def f(ctx: ss.Context) -> None:
        ctx.step.run("make-object", bad)

    app.start()
    run = send_and_wait(app, ss.Event("go"))
    assert run.status == "failed"
    assert calls["bad"] == 1  # non-retriable
    assert run.error is not None and run.error.type == "SerializationError"
    assert "make-object" in run.error.message and "JSON" in run.error.message


def test_values_are_identical_on_first_run_and_replay(app: ss.App) -> None:
    seen: list[Any] = []

    @app.function(id="f", trigger=ss.on_event("go"), backoff=FAST)
    def f(ctx: ss.Context) -> None:
        value = ctx.step.run("tuple", lambda: {"t": (1, 2), 3: "int key"})
        seen.append(value)
        ctx.step.run("fail-once", _fail_first(len(seen)))

    app.start()
    send_and_wait(app, ss.Event("go"))
    assert seen[0] == seen[1] == {"t": [1, 2], "3": "int key"}


def _fail_first(invocation: int) -> Callable[[], str]:
    def fn() -> str:
        if invocation == 1:
            raise RuntimeError("once")
        return "ok"

    return fn


def test_step_limit_per_run(app: ss.App) -> None:
    @app.function(id="f", trigger=ss.on_event("go"))
    def f(ctx: ss.Context) -> None:
        for _ in range(1001):
            ctx.step.run("s", lambda: None)

    app.start()
    run = send_and_wait(app, ss.Event("go"), timeout="60s")
    assert run.status == "failed"
    assert run.error is not None and "limit is 1000" in run.error.message
    assert len(run.steps) == 1000


def test_context_fields(app: ss.App) -> None:
    @app.function(id="ctx-fields", trigger=ss.on_event("go"))
    def f(ctx: ss.Context) -> dict[str, Any]:
        inner = ctx.step.run("s", lambda: ctx.attempt)
        return {
            "run": ctx.run_id,
            "fn": ctx.function_id,
            "name": ctx.event.name,
            "n": len(ctx.events),
            "id": ctx.event.id,
            "attempt": inner,
        }

    app.start()
    [eid] = app.send(ss.Event("go", id="evt-1"))
    run = app.runs.wait(app.runs.list(event_id=eid)[0].id)
    assert run.output == {
        "run": run.id,
        "fn": "ctx-fields",
        "name": "go",
        "n": 1,
        "id": "evt-1",
        "attempt": 0,
    }


def test_step_output_over_4mb_fails_clearly(app: ss.App) -> None:
    calls: Counter[str] = Counter()

    def huge() -> str:
        calls["huge"] += 1
        return "x" * (4 * 1024 * 1024 + 1)

    @app.function(id="f", trigger=ss.on_event("go"))
    def f(ctx: ss.Context) -> None:
        ctx.step.run("huge", huge)

    app.start()
    run = send_and_wait(app, ss.Event("go"))
    assert run.status == "failed" and calls["huge"] == 1
    assert run.error is not None and run.error.type == "LimitExceededError"
    assert "step 'huge' output" in run.error.message and "4194304" in run.error.message
