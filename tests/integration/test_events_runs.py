"""Events, triggers, dedupe, and the runs API (get, list, wait, replay, rerun, cancel)."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

import stepstone as ss

from ..conftest import FAST, run_of, send_and_wait


class ManualClock:
    def __init__(self, t: float = 1_800_000_000.0) -> None:
        self.t = t

    def now(self) -> float:
        return self.t


def test_send_returns_ids_and_creates_runs(app: ss.App) -> None:
    app.function(id="f", trigger=ss.on_event("go"))(lambda ctx: None)
    ids = app.send([ss.Event("go", id="a"), ss.Event("go")])
    assert ids[0] == "a" and len(ids[1]) == 26
    assert len(app.runs.list(function_id="f")) == 2
    run = run_of(app, "a")
    assert run.status == "queued" and run.event_ids == ["a"]


def test_event_id_dedupes_for_24_hours(make_app: Callable[..., ss.App]) -> None:
    clock = ManualClock()
    app = make_app(clock=clock)
    app.function(id="f", trigger=ss.on_event("go"))(lambda ctx: None)
    assert app.send(ss.Event("go", id="order-1")) == ["order-1"]
    clock.t += 23 * 3600
    assert app.send(ss.Event("go", {"again": True}, id="order-1")) == ["order-1"]
    assert len(app.runs.list(function_id="f")) == 1
    clock.t += 3601  # 24 h after the first
    app.send(ss.Event("go", id="order-1"))
    assert len(app.runs.list(function_id="f")) == 2


def test_fan_out_wildcards_conditions_and_several_triggers(app: ss.App) -> None:
    app.function(id="exact", trigger=ss.on_event("user.created"))(lambda ctx: None)
    app.function(id="dotted", trigger=ss.on_event("user.*"))(lambda ctx: None)
    app.function(id="slashed", trigger=ss.on_event("app/*"))(lambda ctx: None)
    app.function(id="paid-only", trigger=ss.on_event("user.created", if_="event.data.plan != 'free'"))(
        lambda ctx: None
    )
    app.function(id="two", trigger=[ss.on_event("user.created"), ss.on_event("app/ping")])(lambda ctx: None)

    def started_by(event: ss.Event) -> set[str]:
        [eid] = app.send(event)
        return {r.function_id for r in app.runs.list(event_id=eid)}

    assert started_by(ss.Event("user.created", {"plan": "pro"})) == {"exact", "dotted", "paid-only", "two"}
    assert started_by(ss.Event("user.created", {"plan": "free"})) == {"exact", "dotted", "two"}
    assert started_by(ss.Event("user.deleted")) == {"dotted"}
    assert started_by(ss.Event("app/ping")) == {"slashed", "two"}
    assert started_by(ss.Event("nobody.listens")) == set()


def test_bad_events_are_rejected_whole(app: ss.App) -> None:
    app.function(id="f", trigger=ss.on_event("go"))(lambda ctx: None)
    cases: list[tuple[Any, type[Exception], str]] = [
        ([ss.Event("go"), ss.Event("go", data="x")], ss.InvalidEventError, "data must be an object"),  # type: ignore[arg-type]
        (ss.Event(""), ss.InvalidEventError, "non-empty"),
        (ss.Event("n" * 513), ss.LimitExceededError, "limit of 512"),
        (ss.Event("go", {"blob": "x" * (512 * 1024)}), ss.LimitExceededError, "524288 bytes"),
        (ss.Event("go", {"x": object()}), ss.SerializationError, "not JSON"),
        (ss.Event("stepstone/function.failed"), ss.InvalidEventError, "reserved"),
        ("go", ss.InvalidEventError, "stepstone.Event"),
    ]
    for events, kind, message in cases:
        with pytest.raises(kind, match=message):
            app.send(events)
    assert app.runs.list() == []  # nothing half-written
    app.send(ss.Event("go", {"blob": "x" * (500 * 1024)}))  # under the limit


def test_runs_get_list_filters_and_pages(make_app: Callable[..., ss.App]) -> None:
    clock = ManualClock()
    app = make_app(clock=clock)
    app.function(id="a", trigger=ss.on_event("a"))(lambda ctx: None)
    app.function(id="b", trigger=ss.on_event("b"))(lambda ctx: None)
    for i in range(5):
        clock.t += 10
        app.send([ss.Event("a", id=f"a{i}"), ss.Event("b", id=f"b{i}")])
    assert len(app.runs.list()) == 10
    assert {r.function_id for r in app.runs.list(function_id="a")} == {"a"}
    assert len(app.runs.list(status="queued")) == 10 and app.runs.list(status="completed") == []
    since = clock.t - 25
    assert {r.event_ids[0] for r in app.runs.list(function_id="a", since=since)} == {"a2", "a3", "a4"}
    assert {r.event_ids[0] for r in app.runs.list(function_id="a", until=since)} == {"a0", "a1"}
    page1 = app.runs.list(limit=4)
    page2 = app.runs.list(limit=4, before=page1[-1].id)
    page3 = app.runs.list(limit=4, before=page2[-1].id)
    ids = [r.id for r in page1 + page2 + page3]
    assert len(ids) == 10 and len(set(ids)) == 10 and ids == sorted(ids, reverse=True)
    assert app.runs.get(ids[0]).id == ids[0]
    with pytest.raises(ss.NotFoundError):
        app.runs.get("nope")
    with pytest.raises(ss.ConfigError, match="status"):
        app.runs.list(status="exploded")
    with pytest.raises(ss.ConfigError, match="since"):
        app.runs.list(since=20, until=10)


def test_wait_times_out_with_timeout_error(app: ss.App) -> None:
    app.function(id="f", trigger=ss.on_event("go"))(lambda ctx: None)
    [eid] = app.send(ss.Event("go"))
    with pytest.raises(TimeoutError):
        app.runs.wait(run_of(app, eid).id, timeout="100ms")


def test_fix_the_bug_and_replay_resumes_from_the_failed_step(app: ss.App) -> None:
    calls: Counter[str] = Counter()
    bug = {"present": True}

    def provision() -> str:
        calls["provision"] += 1
        if bug["present"]:
            raise KeyError("tier")
        return "granted"

    @app.function(id="f", trigger=ss.on_event("go"), retries=1, backoff=FAST)
    def f(ctx: ss.Context) -> str:
        ctx.step.run("charge", lambda: calls.update(["charge"]))
        ctx.step.run("record", lambda: calls.update(["record"]))
        return str(ctx.step.run("provision", provision))

    app.start()
    run = send_and_wait(app, ss.Event("go"))
    assert run.status == "failed" and calls == {"charge": 1, "record": 1, "provision": 2}
    with pytest.raises(ss.InvalidStateError):
        app.runs.replay(
            app.runs.list(status="completed")[0].id
            if app.runs.list(status="completed")
            else _completed_run(app)
        )
    bug["present"] = False
    app.runs.replay(run.id)
    replayed = app.runs.wait(run.id)
    assert replayed.status == "completed" and replayed.output == "granted"
    assert calls == {"charge": 1, "record": 1, "provision": 3}
    trace = app.runs.trace(run.id)
    assert [s.kind for s in trace].count("replay") == 1
    attempts = [(s.status, s.attempt) for s in trace if s.name == "provision"]
    assert attempts == [("retrying", 1), ("failed", 2), ("completed", 1)]  # the failure stays visible


def _completed_run(app: ss.App) -> str:
    app.function(id="ok", trigger=ss.on_event("ok"))(lambda ctx: 1)
    return send_and_wait(app, ss.Event("ok")).id


def test_rerun_from_a_step_forks_a_new_run(app: ss.App) -> None:
    calls: Counter[str] = Counter()

    @app.function(id="f", trigger=ss.on_event("go"))
    def f(ctx: ss.Context) -> list[int]:
        return [ctx.step.run(n, lambda n=n: calls.update([n]) or calls[n]) for n in ("a", "b", "c")]

    app.start()
    first = send_and_wait(app, ss.Event("go"))
    assert first.output == [1, 1, 1]
    fork_id = app.runs.rerun_from(first.id, "b")
    fork = app.runs.wait(fork_id)
    assert fork.id != first.id and fork.output == [1, 2, 2]
    assert calls == {"a": 1, "b": 2, "c": 2}
    assert fork.meta == {"rerun_of": first.id, "from_step": "b"}
    with pytest.raises(ss.NotFoundError):
        app.runs.rerun_from(first.id, "zzz")


def test_rerun_with_edited_event_data_fixes_a_bad_payload(app: ss.App) -> None:
    """The payload was wrong: rerun from the step that used it with the fixed data.
    Steps before the cut keep their memos; the original event stays as sent."""

    @app.function(id="f", trigger=ss.on_event("order"), retries=0)
    def f(ctx: ss.Context) -> list[Any]:
        seen = ctx.step.run("seen", lambda: ctx.event.data["qty"])
        charged = ctx.step.run("charge", lambda: 10 // ctx.event.data["qty"])
        return [seen, charged, ctx.event.name]

    app.start()
    failed = send_and_wait(app, ss.Event("order", {"qty": 0}, id="order-1"))
    assert failed.status == "failed"
    fork_id = app.runs.rerun_from(failed.id, "charge", event_data={"qty": 5})
    fork = app.runs.wait(fork_id)
    assert fork.status == "completed" and fork.output == [0, 2, "order"]
    assert fork.meta == {"rerun_of": failed.id, "from_step": "charge", "edited_event": True}
    [edited] = fork.event_ids
    assert edited != "order-1"
    assert app.runs.get(failed.id).event_ids == ["order-1"]
    [original] = app.store.read_sync(lambda tx: tx.get_events(failed.id))
    assert original.id == "order-1" and original.data == '{"qty":0}'
    [copy] = app.store.read_sync(lambda tx: tx.get_events(fork_id))
    assert copy.name == "order" and copy.data == '{"qty":5}'
    # The edited event is not routed: no other run started from it.
    assert app.runs.list(event_id=edited) == [app.runs.get(fork_id)]
    # A rerun of the fork without event_data keeps the edited data.
    again = app.runs.wait(app.runs.rerun_from(fork_id, "charge"))
    assert again.output == [0, 2, "order"] and again.event_ids == [edited]


def test_rerun_with_invalid_event_data_writes_nothing(app: ss.App) -> None:
    app.function(id="f", trigger=ss.on_event("go"))(lambda ctx: ctx.step.run("s", lambda: 1))
    app.start()
    run = send_and_wait(app, ss.Event("go"))
    before = len(app.runs.list())
    with pytest.raises(ss.InvalidEventError, match="must be an object"):
        app.runs.rerun_from(run.id, "s", event_data=[1, 2])  # type: ignore[arg-type]
    deep: dict[str, Any] = {}
    for _ in range(200):
        deep = {"d": deep}
    with pytest.raises(ss.InvalidEventError, match="nested"):
        app.runs.rerun_from(run.id, "s", event_data=deep)
    assert len(app.runs.list()) == before
    assert app.store.read_sync(lambda tx: tx.list_events(None, None, None, 10))[0].id == run.event_ids[0]


def test_a_batch_run_reruns_with_edited_data_refused(app: ss.App) -> None:
    app.function(id="f", trigger=ss.on_event("go"), batch=ss.Batch(max_size=2, timeout="1s"))(
        lambda ctx: ctx.step.run("s", lambda: len(ctx.events))
    )
    app.start()
    [a, _] = app.send([ss.Event("go"), ss.Event("go")])
    run = app.runs.wait(run_of(app, a).id)
    assert run.output == 2
    with pytest.raises(ss.InvalidStateError, match="2 events"):
        app.runs.rerun_from(run.id, "s", event_data={"x": 1})
    assert app.runs.wait(app.runs.rerun_from(run.id, "s")).output == 2


def test_cancel_a_queued_run(app: ss.App) -> None:
    app.function(id="f", trigger=ss.on_event("go"))(lambda ctx: None)
    [eid] = app.send(ss.Event("go"))
    run = run_of(app, eid)
    assert app.runs.cancel(run.id) == "cancelled"
    assert app.runs.get(run.id).status == "cancelled"
    app.runs.replay(run.id)  # cancelled runs can be replayed
    assert app.runs.get(run.id).status == "queued"


def test_async_client_api(app: ss.App) -> None:
    @app.function(id="f", trigger=ss.on_event("go"))
    async def f(ctx: ss.Context) -> int:
        return int(await ctx.step.run("s", lambda: 7))

    async def scenario() -> ss.Run:
        await app.start_async()
        try:
            [eid] = await app.send_async(ss.Event("go"))
            [run] = await app.runs.list_async(event_id=eid)
            return await app.runs.wait_async(run.id, timeout="10s")
        finally:
            await app.stop_async()

    assert asyncio.run(scenario()).output == 7


def test_send_from_many_threads(app: ss.App) -> None:
    app.function(id="f", trigger=ss.on_event("go"))(lambda ctx: None)

    def sender(n: int) -> None:
        for i in range(20):
            app.send(ss.Event("go", id=f"{n}-{i}"))

    threads = [threading.Thread(target=sender, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(app.runs.list(limit=1000)) == 80


def test_cancel_many_and_replay_many(make_app: Callable[..., ss.App]) -> None:
    clock = ManualClock()
    app = make_app(clock=clock)
    app.function(id="a", trigger=ss.on_event("a"))(lambda ctx: None)
    app.function(id="b", trigger=ss.on_event("b"))(lambda ctx: None)
    for i in range(250):  # more than one page
        clock.t += 1
        app.send([ss.Event("a", {"tenant": "t1" if i % 2 else "t2", "i": i}), ss.Event("b")])
    progress: list[tuple[int, int]] = []
    n = app.runs.cancel_many(
        function_id="a",
        if_="event.data.tenant == 't1'",
        progress=lambda done, seen: progress.append((done, seen)),
    )
    assert n == 125
    assert progress[-1] == (125, 250) and len(progress) == 2
    assert len(app.runs.list(function_id="a", status="cancelled", limit=1000)) == 125
    assert len(app.runs.list(function_id="b", status="queued", limit=1000)) == 250
    # time range: the last 50 seconds of b
    assert app.runs.cancel_many(function_id="b", since=clock.t - 49) == 50
    assert app.runs.replay_many(function_id="a", status="cancelled", until=clock.t - 149) == 50
    assert len(app.runs.list(function_id="a", status="cancelled", limit=1000)) == 75
    with pytest.raises(ss.ConfigError, match="if_"):
        app.runs.cancel_many(if_="event.data.")
    with pytest.raises(ss.ConfigError, match="status"):
        app.runs.replay_many(status="completed")


def _count_run_reads(app: ss.App) -> list[str]:
    """Reads of one run (``runs.get`` and each poll of ``runs.wait``) by this thread."""
    store = app.store
    reads: list[str] = []
    plain = store.read_sync

    def counted(op: Callable[[Any], Any]) -> Any:
        if getattr(op, "__qualname__", "").startswith(("_get_op", "_ended_op")):
            reads.append(op.__qualname__)
        return plain(op)

    store.read_sync = counted  # type: ignore[method-assign]
    return reads


def test_waiting_for_a_run_a_local_worker_executes_does_not_poll_it(app: ss.App) -> None:
    """The local worker signals the run's end, so ``runs.wait`` does not poll the
    store meanwhile (a 30 ms run used to cost five reads); it tells it the run
    as the end left it, so a run it holds is not read at all
    (``test_local_wait.py``)."""

    def work() -> int:
        threading.Event().wait(0.03)  # the work takes 30 ms
        return 1

    @app.function(id="f", trigger=ss.on_event("go"))
    def f(ctx: ss.Context[ss.SyncStep]) -> int:
        done: int = ctx.step.run("work", work)
        return done

    app.start(concurrency=1)
    try:
        [eid] = app.send(ss.Event("go"))
        run_id = run_of(app, eid).id
        reads = _count_run_reads(app)
        assert app.runs.wait(run_id, timeout="10s").output == 1
    finally:
        app.stop()
    assert len(reads) <= 2, reads  # none while held (one if it ended first; one poll if the host is slow)


def test_a_run_another_process_ends_is_still_noticed_by_an_app_with_workers(
    make_app: Callable[..., ss.App],
) -> None:
    host = make_app("host")
    host.function(id="f", trigger=ss.on_event("go"))(lambda ctx: 7)
    client = make_app("client")
    client.function(id="g", trigger=ss.on_event("other"))(lambda ctx: None)
    host.start(concurrency=1)
    client.start(concurrency=1)  # workers here, but none hosting f: polling notices f's end
    try:
        [eid] = client.send(ss.Event("go"))
        assert client.runs.wait(run_of(client, eid, "f").id, timeout="10s").output == 7
    finally:
        client.stop()
        host.stop()
