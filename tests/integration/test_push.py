"""Runs of functions served over HTTP (``ss.serve``), executed by the server's
pusher against a real store (both backends), the endpoint in process behind
``httpx.ASGITransport``: the push model's semantics are a worker's."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

import stepstone as ss
from stepstone.executor import ExecEnv
from stepstone.pusher import Endpoint, PushSettings, push, served_apps
from stepstone.registry import Registry
from stepstone.scheduler.leasing import lease
from stepstone.signing import SIGNATURE_HEADER, sign
from stepstone.wire import Answer
from tests.polling import wait_for
from tests.pushing import KEY, KEYS, pushing, register_app

URL = "http://served.test/api/stepstone"


class Served:
    """A served app, its endpoint and a client app on the test database."""

    def __init__(self, make_app: Callable[..., ss.App], **serve: object) -> None:
        self.app = ss.App("served", database_url="sqlite:////nonexistent/never-opened.db", **serve)  # type: ignore[arg-type]
        self.client = make_app("client")
        self.asgi = ss.serve(self.app, signing_key=KEY, max_duration=60)
        self.down = False  # answer 503 while set

    async def _asgi(self, scope: dict[str, object], receive: object, send: object) -> None:
        if self.down and scope["type"] == "http":
            await send({"type": "http.response.start", "status": 503, "headers": []})  # type: ignore[operator]
            await send({"type": "http.response.body", "body": b"down"})  # type: ignore[operator]
            return
        await self.asgi(scope, receive, send)  # type: ignore[arg-type]

    def transport(self) -> httpx.AsyncBaseTransport:
        return httpx.ASGITransport(app=self._asgi)  # type: ignore[arg-type]

    def register(self) -> None:
        register_app(self.client, self.app, URL)


@pytest.fixture
def served(make_app: Callable[..., ss.App]) -> Iterator[Served]:
    harness = Served(make_app)
    yield harness
    assert harness.app._store is None  # the endpoint never opened a database


def run_for(client: ss.App, event_id: str) -> ss.Run:
    [run] = client.runs.list(event_id=event_id)
    return run


def test_steps_sleep_and_retries_checkpoint_each_step_once(served: Served) -> None:
    ran: Counter[str] = Counter()
    failures = {"flaky": 1}

    @served.app.function(
        id="order", trigger=ss.on_event("order"), retries=2, backoff=ss.Backoff(initial="0.05s", max="0.05s")
    )
    def order(ctx: ss.Context) -> dict[str, object]:
        def once(name: str) -> Callable[[], str]:
            def body() -> str:
                ran[name] += 1
                if failures.get(name, 0) > 0:
                    failures[name] -= 1
                    raise RuntimeError("flaky failure")
                return name

            return body

        a = ctx.step.run("a", once("a"))
        ctx.step.sleep("nap", "0.2s")
        b = ctx.step.run("flaky", once("flaky"))
        c = ctx.step.run("c", once("c"))
        return {"steps": [a, b, c], "n": ctx.event.data["n"]}

    served.register()
    with pushing(served.client, served.transport()):
        [event_id] = served.client.send(ss.Event("order", {"n": 7}))
        run = served.client.runs.wait(run_for(served.client, event_id).id, timeout="20s")
    assert run.status == "completed", run.error
    assert run.output == {"steps": ["a", "flaky", "c"], "n": 7}
    assert ran == {"a": 1, "flaky": 2, "c": 1}  # each body once after its success
    steps = {s.id: s for s in run.steps}
    assert steps["flaky"].attempts == 2 and steps["nap"].status == "completed"


def test_waits_sends_and_timeouts_pushed(served: Served) -> None:
    @served.app.function(id="waiter", trigger=ss.on_event("start"))
    async def waiter(ctx: ss.Context) -> dict[str, object]:
        got = await ctx.step.wait_for_event(
            "paid", event="order.paid", if_="async.data.id == event.data.id", timeout="30s"
        )
        late = await ctx.step.wait_for_event("never", event="order.never", timeout="0.3s")
        return {"paid": got.data if got else None, "late": late}

    @served.app.function(id="payer", trigger=ss.on_event("pay"))
    async def payer(ctx: ss.Context) -> object:
        return await ctx.step.send_event(
            "send", ss.Event("order.paid", {"id": ctx.event.data["id"], "amount": 3})
        )

    served.register()
    with pushing(served.client, served.transport()):
        [started] = served.client.send(ss.Event("start", {"id": "o1"}))
        run_id = run_for(served.client, started).id
        wait_for(lambda: served.client.runs.get(run_id).status == "waiting", 10, "the wait")
        served.client.send(ss.Event("pay", {"id": "o1"}))
        run = served.client.runs.wait(run_id, timeout="20s")
    assert run.status == "completed", run.error
    assert run.output == {"paid": {"id": "o1", "amount": 3}, "late": None}


def test_signals_buffered_and_later_pushed(served: Served) -> None:
    @served.app.function(id="signalled", trigger=ss.on_event("sig"))
    async def signalled(ctx: ss.Context) -> list[object]:
        first = await ctx.step.wait_for_signal("first", "go", timeout="30s")
        second = await ctx.step.wait_for_signal("second", "go", timeout="30s")
        return [first, second]

    served.register()
    [event_id] = served.client.send(ss.Event("sig", {}))
    run_id = run_for(served.client, event_id).id
    served.client.runs.signal(run_id, "go", {"n": 1})  # buffered before the run starts
    with pushing(served.client, served.transport()):
        wait_for(lambda: served.client.runs.get(run_id).status == "waiting", 10, "the second wait")
        served.client.runs.signal(run_id, "go", {"n": 2})
        run = served.client.runs.wait(run_id, timeout="20s")
    assert run.status == "completed", run.error
    assert run.output == [{"n": 1}, {"n": 2}]


def test_invoke_across_worker_and_url_served(served: Served, make_app: Callable[..., ss.App]) -> None:
    local = make_app("local")

    @local.function(id="double", trigger=ss.on_event("double"))
    def double(ctx: ss.Context) -> int:
        return int(ctx.event.data["x"]) * 2

    @local.function(id="local-parent", trigger=ss.on_event("local-parent"))
    async def local_parent(ctx: ss.Context) -> object:
        return await ctx.step.invoke("call", function="square", data={"x": 5}, timeout="30s")

    @served.app.function(id="square", trigger=ss.on_event("square"))
    def square(ctx: ss.Context) -> int:
        return int(ctx.event.data["x"]) ** 2

    @served.app.function(id="served-parent", trigger=ss.on_event("served-parent"))
    async def served_parent(ctx: ss.Context) -> object:
        return await ctx.step.invoke("call", function="double", data={"x": 21}, timeout="30s")

    served.register()
    local.start()
    try:
        with pushing(served.client, served.transport()):
            [a] = served.client.send(ss.Event("served-parent", {}))
            [b] = served.client.send(ss.Event("local-parent", {}))
            first = served.client.runs.wait(run_for(served.client, a).id, timeout="20s")
            second = served.client.runs.wait(run_for(served.client, b).id, timeout="20s")
    finally:
        local.stop()
    assert (first.status, first.output) == ("completed", 42), first.error
    assert (second.status, second.output) == ("completed", 25), second.error


def test_cancel_while_the_request_is_in_flight_wins(served: Served) -> None:
    entered, release = threading.Event(), threading.Event()
    ran: list[str] = []

    @served.app.function(id="slow", trigger=ss.on_event("slow"))
    def slow(ctx: ss.Context) -> str:
        def block() -> str:
            entered.set()
            assert release.wait(10)
            return "done"

        ctx.step.run("block", block)
        ctx.step.run("after", lambda: ran.append("after"))
        return "finished"

    served.register()
    with pushing(served.client, served.transport()):
        [event_id] = served.client.send(ss.Event("slow", {}))
        run_id = run_for(served.client, event_id).id
        assert entered.wait(10)
        served.client.runs.cancel(run_id)
        release.set()
        run = served.client.runs.wait(run_id, timeout="20s")
    assert run.status == "cancelled"
    assert ran == ["after"]  # the request ran on: at-least-once inside one request
    assert run.output is None


def test_an_unavailable_endpoint_is_retried_not_failed(served: Served) -> None:
    @served.app.function(id="hello", trigger=ss.on_event("hello"))
    def hello(ctx: ss.Context) -> object:
        return ctx.step.run("greet", lambda: "hi")

    served.register()
    served.down = True
    with pushing(served.client, served.transport()):
        [event_id] = served.client.send(ss.Event("hello", {}))
        run_id = run_for(served.client, event_id).id

        def warned() -> bool:
            return any(s.name == "endpoint unavailable" for s in served.client.runs.trace(run_id))

        wait_for(warned, 10, "an 'endpoint unavailable' span")
        assert served.client.runs.get(run_id).status == "running"
        served.down = False
        run = served.client.runs.wait(run_id, timeout="20s")
    assert (run.status, run.output) == ("completed", "hi")
    [span] = [s for s in served.client.runs.trace(run_id) if s.name == "endpoint unavailable"][:1]
    assert span.kind == "warning" and "HTTP 503" in span.detail["error"]
    assert [s.attempts for s in run.steps] == [1]


def test_step_transaction_pushed_fails_clearly(served: Served) -> None:
    @served.app.function(id="txn", trigger=ss.on_event("txn"))
    def txn(ctx: ss.Context) -> object:
        return ctx.step.transaction("write", lambda conn: 1)

    served.register()
    with pushing(served.client, served.transport()):
        [event_id] = served.client.send(ss.Event("txn", {}))
        run = served.client.runs.wait(run_for(served.client, event_id).id, timeout="20s")
    assert run.status == "failed"
    assert run.error is not None and "endpoint served over HTTP" in run.error.message


def test_encryption_runs_in_the_endpoint(make_app: Callable[..., ss.App]) -> None:
    secret = "a long random secret for tests"
    served = Served(make_app, middleware=[ss.EncryptionMiddleware(secret)])

    @served.app.function(id="secretive", trigger=ss.on_event("secretive"))
    def secretive(ctx: ss.Context) -> dict[str, str]:
        card = ctx.step.run("card", lambda: {"number": "4242-SECRET"})
        ctx.step.sleep("nap", "0.05s")  # the memo travels back encrypted and is opened here
        return {"again": card["number"]}

    served.register()
    with pushing(served.client, served.transport()):
        [event_id] = served.client.send(ss.Event("secretive", {}))
        run_id = run_for(served.client, event_id).id
        wait_for(lambda: served.client.runs.get(run_id).status == "completed", 20, "the run")
    raw = served.client.store.read_sync(lambda tx: (tx.get_run(run_id), tx.get_steps(run_id)))
    stored = repr(raw)
    assert "4242-SECRET" not in stored  # the server holds only ciphertext
    middleware = ss.EncryptionMiddleware(secret)
    run = served.client.runs.get(run_id)
    assert middleware.reveal(run.output, "output") == {"again": "4242-SECRET"}
    [card] = [s for s in run.steps if s.id == "card"]
    assert middleware.reveal(card.output, "card") == {"number": "4242-SECRET"}


def test_an_answer_under_a_stale_fence_is_discarded(served: Served) -> None:
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from stepstone.executor import ExecEnv
    from stepstone.pusher import Endpoint, PushSettings, push, served_apps
    from stepstone.registry import Registry
    from stepstone.scheduler.leasing import lease
    from tests.pushing import KEYS

    ran: list[str] = []

    @served.app.function(id="once", trigger=ss.on_event("once"))
    def once(ctx: ss.Context) -> object:
        return ctx.step.run("effect", lambda: ran.append("effect"))

    served.register()
    client = served.client
    [event_id] = client.send(ss.Event("once", {}))
    run_id = run_for(client, event_id).id
    registry = Registry()
    for fn in served_apps(client.catalog.registry(client.store))[URL]:
        registry.add_definition(fn)
    now = client.clock.now()
    [stale] = client.store.transact_sync(lambda tx: lease(tx, "A", registry, 1, now, now + 1))
    # A's lease lapses and B takes the run (a bumped epoch) while A's request is in flight.
    [fresh] = client.store.transact_sync(lambda tx: lease(tx, "B", registry, 1, now + 5, now + 60))
    assert fresh.epoch > stale.epoch

    async def push_as_a() -> object:
        endpoint = Endpoint(URL, KEYS, PushSettings(), served.transport())
        with ThreadPoolExecutor(2) as threads:
            env = ExecEnv(client.store, registry, client.clock, "A", 1.0, threads, lambda: registry)
            try:
                return await push(stale, env, endpoint)
            finally:
                await endpoint.close()

    assert asyncio.run(push_as_a()) is None  # the lease was lost: nothing written
    assert ran == ["effect"]  # the endpoint did run the step
    assert client.store.read_sync(lambda tx: tx.get_steps(run_id)) == []
    assert client.runs.get(run_id).status == "running"


def test_rerun_and_flow_control_pushed(served: Served) -> None:
    lock = threading.Lock()
    active, peak, ran = [0], [0], Counter[str]()

    def work(run_id: str) -> str:
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
            ran[run_id] += 1
        threading.Event().wait(0.05)
        with lock:
            active[0] -= 1
        return run_id

    @served.app.function(id="limited", trigger=ss.on_event("limited"), concurrency=ss.Concurrency(limit=1))
    def limited(ctx: ss.Context) -> object:
        return ctx.step.run("work", work, ctx.run_id)

    served.register()
    with pushing(served.client, served.transport()):
        event_ids = [served.client.send(ss.Event("limited", {"n": n}))[0] for n in range(4)]
        runs = [served.client.runs.wait(run_for(served.client, e).id, timeout="20s") for e in event_ids]
        assert [r.status for r in runs] == ["completed"] * 4
        assert peak[0] == 1  # concurrency=1 held across the pushed runs
        rerun = served.client.runs.rerun_from(runs[0].id, "work")  # the step runs again, in a new run
        again = served.client.runs.wait(rerun, timeout="20s")
    assert (again.status, again.output) == ("completed", rerun)
    assert ran[rerun] == 1 and ran[runs[0].id] == 1


def test_cancel_while_the_endpoint_is_down(served: Served) -> None:
    @served.app.function(id="unreachable", trigger=ss.on_event("unreachable"))
    def unreachable(ctx: ss.Context) -> object:
        return ctx.step.run("never", lambda: "ran")

    served.register()
    served.down = True
    with pushing(served.client, served.transport()):
        [event_id] = served.client.send(ss.Event("unreachable", {}))
        run_id = run_for(served.client, event_id).id
        refused = lambda: any(s.name == "endpoint unavailable" for s in served.client.runs.trace(run_id))  # noqa: E731
        wait_for(refused, 10, "a first refused request")
        served.client.runs.cancel(run_id)
        run = served.client.runs.wait(run_id, timeout="20s")
    assert run.status == "cancelled" and run.steps == []


def test_a_deploy_of_changed_code_mid_run_is_judged_as_in_a_worker(served: Served) -> None:
    @served.app.function(id="deployed", trigger=ss.on_event("deployed"), on_nondeterminism="pause")
    def v1(ctx: ss.Context) -> object:
        ctx.step.run("a", lambda: "a")
        ctx.step.sleep("nap", "0.3s")
        return ctx.step.run("b", lambda: "b")

    served.register()
    with pushing(served.client, served.transport()):
        [event_id] = served.client.send(ss.Event("deployed", {}))
        run_id = run_for(served.client, event_id).id
        wait_for(lambda: served.client.runs.get(run_id).status == "sleeping", 10, "the sleep")
        v2 = ss.App("served", database_url="sqlite:////nonexistent/never-opened.db")

        @v2.function(id="deployed", trigger=ss.on_event("deployed"), on_nondeterminism="pause")
        def changed(ctx: ss.Context) -> object:  # a step inserted before the recorded ones
            ctx.step.run("new", lambda: "new")
            ctx.step.run("a", lambda: "a")
            ctx.step.sleep("nap", "0.3s")
            return ctx.step.run("b", lambda: "b")

        served.asgi = ss.serve(v2, signing_key=KEY)  # the endpoint redeployed
        wait_for(
            lambda: served.client.runs.get(run_id).status == "paused", 10, "the divergence to pause the run"
        )
    run = served.client.runs.get(run_id)
    assert [s.id for s in run.steps] == ["a", "nap"]  # nothing new executed
    assert any(s.kind == "warning" for s in served.client.runs.trace(run_id))


def test_invoking_a_function_no_one_registered_fails_the_step(served: Served) -> None:
    @served.app.function(id="lost-call", trigger=ss.on_event("lost-call"))
    async def lost_call(ctx: ss.Context) -> object:
        return await ctx.step.invoke("call", function="nope", data={}, timeout="30s")

    served.register()
    with pushing(served.client, served.transport()):
        [event_id] = served.client.send(ss.Event("lost-call", {}))
        run = served.client.runs.wait(run_for(served.client, event_id).id, timeout="20s")
    assert run.status == "failed"
    assert run.error is not None and "no function 'nope' to invoke" in run.error.message


# -- answers the server must refuse (the endpoint is trusted only for its own request) ------------
def _registry(client: ss.App) -> Registry:
    registry = Registry()
    for fn in served_apps(client.catalog.registry(client.store))[URL]:
        registry.add_definition(fn)
    return registry


def _push_once(client: ss.App, transport: httpx.AsyncBaseTransport) -> object:
    """Lease the one due run and push one invocation of it through ``transport``."""
    registry = _registry(client)
    now = client.clock.now() + 2  # past the run's 1 s sleep
    [leased] = client.store.transact_sync(lambda tx: lease(tx, "A", registry, 1, now, now + 60))

    async def push_as_a() -> object:
        endpoint = Endpoint(URL, KEYS, PushSettings(), transport)
        with ThreadPoolExecutor(2) as threads:
            env = ExecEnv(client.store, registry, client.clock, "A", 60.0, threads, lambda: registry)
            try:
                return await push(leased, env, endpoint)
            finally:
                await endpoint.close()

    return asyncio.run(push_as_a())


def _stored(client: ss.App, run_id: str) -> tuple[object, list[object]]:
    steps, spans = client.store.read_sync(lambda tx: (tx.get_steps(run_id), tx.get_spans(run_id)))
    return steps, [s for s in spans if s.name != "endpoint unavailable"]


def _refusals(client: ss.App, run_id: str) -> list[str]:
    spans = client.store.read_sync(lambda tx: tx.get_spans(run_id))
    return [str(s.detail) for s in spans if s.name == "endpoint unavailable"]


def _two_step_app(served: Served) -> None:
    @served.app.function(id="two", trigger=ss.on_event("two"))
    def two(ctx: ss.Context) -> object:
        first = ctx.step.run("a", lambda: "a")
        ctx.step.sleep("nap", "1s")
        return [first, ctx.step.run("b", lambda: "b")]


def test_a_captured_answer_replayed_to_a_later_request_writes_nothing(served: Served) -> None:
    _two_step_app(served)
    served.register()
    client = served.client
    [event_id] = client.send(ss.Event("two", {}))
    run_id = run_for(client, event_id).id
    captured: list[httpx.Response] = []

    async def capture(request: httpx.Request) -> httpx.Response:
        async with httpx.AsyncClient(transport=served.transport()) as http:
            response = await http.post(str(request.url), content=request.content, headers=request.headers)
        captured.append(response)
        return response

    _push_once(client, httpx.MockTransport(capture))  # the first request: "a" committed, then the sleep
    before = _stored(client, run_id)

    async def replay(request: httpx.Request) -> httpx.Response:  # signed, fresh, but another request's
        return httpx.Response(200, content=captured[0].content, headers=captured[0].headers)

    _push_once(client, httpx.MockTransport(replay))
    assert _stored(client, run_id) == before  # nothing of the replayed answer committed
    [refusal] = _refusals(client, run_id)
    assert "another request" in refusal
    with pushing(client, served.transport()):
        run = client.runs.wait(run_id, timeout="20s")
    assert (run.status, run.output) == ("completed", ["a", "b"])


def test_an_answer_restaging_a_completed_step_never_overwrites_it(served: Served) -> None:
    _two_step_app(served)
    served.register()
    client = served.client
    [event_id] = client.send(ss.Event("two", {}))
    run_id = run_for(client, event_id).id
    _push_once(client, served.transport())
    [a] = [s for s in client.store.read_sync(lambda tx: tx.get_steps(run_id)) if s.step_id == "a"]

    async def forge(request: httpx.Request) -> httpx.Response:
        async with httpx.AsyncClient(transport=served.transport()) as http:
            real = await http.post(str(request.url), content=request.content, headers=request.headers)
        answer = Answer.decode(real.content)
        forged = dataclasses.replace(answer, steps=(*answer.steps, dataclasses.replace(a, output='"forged"')))
        body = forged.encode()
        return httpx.Response(200, content=body, headers={SIGNATURE_HEADER: sign(body, KEYS)})

    _push_once(client, httpx.MockTransport(forge))
    [kept] = [s for s in client.store.read_sync(lambda tx: tx.get_steps(run_id)) if s.step_id == "a"]
    assert kept == a
    [refusal] = _refusals(client, run_id)
    assert "'a'" in refusal and "completed" in refusal
    assert client.runs.get(run_id).status == "running"  # called again later, not failed


# -- functions no longer served: their started runs drain to the URL that served them ------------
def _napper(app: ss.App) -> None:
    @app.function(id="napper", trigger=ss.on_event("napper"))
    def napper(ctx: ss.Context) -> object:
        ctx.step.run("before", lambda: "before")
        ctx.step.sleep("nap", "0.3s")
        return ctx.step.run("after", lambda: "after")


def test_an_unregistered_apps_started_runs_drain_to_its_endpoint(served: Served) -> None:
    from stepstone.appsync import unregister_app

    _napper(served.app)
    served.register()
    client = served.client
    with pushing(client, served.transport()):
        [event_id] = client.send(ss.Event("napper", {}))
        run_id = run_for(client, event_id).id
        wait_for(lambda: client.runs.get(run_id).status == "sleeping", 10, "the nap")
        asyncio.run(unregister_app(client.store, client.clock, URL))
        client.catalog.invalidate()
        assert client.send(ss.Event("napper", {})) != [] and len(client.runs.list(function_id="napper")) == 1
        run = client.runs.wait(run_id, timeout="10s")  # the endpoint still serves it: the run completes
    assert (run.status, run.output) == ("completed", "after")


def test_a_function_a_resync_dropped_fails_its_started_runs_clearly(served: Served) -> None:
    _napper(served.app)
    served.register()
    client = served.client
    with pushing(client, served.transport()):
        [event_id] = client.send(ss.Event("napper", {}))
        run_id = run_for(client, event_id).id
        wait_for(lambda: client.runs.get(run_id).status == "sleeping", 10, "the nap")
        v2 = ss.App("served", database_url="sqlite:////nonexistent/never-opened.db")

        @v2.function(id="other", trigger=ss.on_event("other"))
        def other(ctx: ss.Context) -> str:
            return "other"

        served.asgi = ss.serve(v2, signing_key=KEY)  # redeployed without napper, then synced
        register_app(client, v2, URL)
        run = client.runs.wait(run_id, timeout="20s")
    assert run.status == "failed"
    assert run.error is not None and "no function 'napper' at this endpoint" in run.error.message


def test_a_burst_never_opens_more_requests_than_the_push_concurrency(served: Served) -> None:
    open_now, peak, done = [0], [0], [0]

    @served.app.function(id="burst", trigger=ss.on_event("burst"))
    async def burst(ctx: ss.Context) -> object:
        return await ctx.step.run("work", asyncio.sleep, 0.005)

    served.register()
    inner = served.asgi

    async def counting(scope: dict[str, object], receive: object, send: object) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            open_now[0] += 1
            peak[0] = max(peak[0], open_now[0])
            try:
                await inner(scope, receive, send)  # type: ignore[arg-type]
            finally:
                open_now[0] -= 1
                done[0] += 1
            return
        await inner(scope, receive, send)  # type: ignore[arg-type]

    served.asgi = counting  # type: ignore[assignment]
    served.client.send([ss.Event("burst", {"n": n}) for n in range(200)])
    with pushing(served.client, served.transport(), concurrency=4):

        def completed() -> list[ss.Run]:
            return served.client.runs.list(function_id="burst", status="completed", limit=500)

        wait_for(lambda: len(completed()) == 200, 60, "200 completed runs")
    assert 1 < peak[0] <= 4  # requests overlapped, never past the bound


def test_a_pushed_run_past_max_state_fails_as_in_a_worker(served: Served) -> None:
    ran: list[int] = []

    @served.app.function(id="hoarder", trigger=ss.on_event("hoarder"), max_state="1KB")
    def hoarder(ctx: ss.Context) -> object:
        def chunk(n: int) -> str:
            ran.append(n)
            return "x" * 400

        for n in range(4):
            ctx.step.sleep(f"nap{n}", "0.01s")  # each output then travels in a later request
            ctx.step.run(f"chunk{n}", chunk, n)
        return "hoarded"

    served.register()
    with pushing(served.client, served.transport()):
        [event_id] = served.client.send(ss.Event("hoarder", {}))
        run = served.client.runs.wait(run_for(served.client, event_id).id, timeout="20s")
    assert run.status == "failed"
    assert run.error is not None and run.error.type == "LimitExceededError", run.error
    assert ran == [0, 1, 2]  # the third output passed the cap; nothing ran after it


def test_an_answer_over_the_cap_without_a_length_is_refused(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stepstone import limits
    from stepstone.journal import warning_span

    monkeypatch.setattr(limits, "MAX_PUSH_BYTES", 100_000)
    _two_step_app(served)
    served.register()
    client = served.client
    [event_id] = client.send(ss.Event("two", {}))
    run_id = run_for(client, event_id).id

    async def bloat(request: httpx.Request) -> httpx.Response:
        async with httpx.AsyncClient(transport=served.transport()) as http:
            real = await http.post(str(request.url), content=request.content, headers=request.headers)
        answer = Answer.decode(real.content)
        ballast = warning_span(run_id, "ballast", "x" * 200_000, 1.0)
        body = dataclasses.replace(answer, spans=(*answer.spans, ballast)).encode()

        async def chunks() -> AsyncIterator[bytes]:  # streamed: no content-length to go by
            for at in range(0, len(body), 16_384):
                yield body[at : at + 16_384]

        return httpx.Response(200, content=chunks(), headers={SIGNATURE_HEADER: sign(body, KEYS)})

    _push_once(client, httpx.MockTransport(bloat))
    assert client.store.read_sync(lambda tx: tx.get_steps(run_id)) == []  # nothing committed
    [refusal] = _refusals(client, run_id)
    assert "100000 bytes" in refusal
