"""ss.Client against a live server: the same calls and results as app.send / app.runs."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC

import pytest

import stepstone as ss
from tests.server.conftest import API_KEY, EVENT_KEY, Shop, free_port


@pytest.fixture
def client(shop: Shop) -> Iterator[ss.Client]:
    with ss.Client(shop.live.url, api_key=API_KEY, event_key=EVENT_KEY) as remote:
        yield remote


def test_send_get_list_wait_and_trace_match_the_app(shop: Shop, client: ss.Client) -> None:
    [event_id] = client.send(ss.Event("hello", {"name": "ada"}, id="c-1"))
    [run] = client.runs.list(event_id=event_id)
    done = client.runs.wait(run.id, timeout="10s")
    local = shop.app.runs.get(run.id)
    assert isinstance(done, ss.Run) and done == local
    assert done.output == "hi ada" and [s.id for s in done.steps] == ["first", "second"]
    spans = client.runs.trace(run.id)
    assert all(isinstance(s, ss.Span) for s in spans)
    assert spans == shop.app.runs.trace(run.id)


def test_a_history_exported_through_the_server_is_the_apps(shop: Shop, client: ss.Client) -> None:
    [event_id] = client.send(ss.Event("hello", {"name": "ada"}, id="c-history"))
    [run] = client.runs.list(event_id=event_id)
    client.runs.wait(run.id, timeout="10s")
    history = client.runs.export(run.id)
    assert history == shop.app.runs.export(run.id)
    assert [s["id"] for s in history["steps"]] == ["first", "second"]
    assert shop.app.check(histories=[history]).runs_checked == 1
    with pytest.raises(ss.NotFoundError):
        client.runs.export("missing")


def test_list_pages_through_the_server(shop: Shop, client: ss.Client) -> None:
    client.send([ss.Event("park", {"i": i}) for i in range(11)])
    client.send(ss.Event("park", {"i": 11}))  # created later than the others
    assert len(client.runs.list(function_id="parked", limit=5)) == 5
    everything = client.runs.list(function_id="parked", status="queued", limit=1000)
    assert [r.id for r in everything] == [r.id for r in shop.app.runs.list(function_id="parked")]
    newest = everything[0]
    assert [r.id for r in client.runs.list(function_id="parked", before=newest.id)] == [
        r.id for r in everything[1:]
    ]
    assert client.runs.list(function_id="parked", since=newest.created_at) == [newest]
    assert newest.created_at.tzinfo is UTC


def test_cancel_replay_rerun_and_bulk(shop: Shop, client: ss.Client) -> None:
    [parked_event] = client.send(ss.Event("park"))
    [parked] = client.runs.list(event_id=parked_event)
    assert client.runs.cancel(parked.id) == "cancelled"
    [failed_event] = client.send(ss.Event("boom"))
    failed = client.runs.wait(client.runs.list(event_id=failed_event)[0].id)
    assert failed.status == "failed" and failed.error is not None and failed.error.message == "kaboom"
    shop.switches["broken"] = False
    client.runs.replay(failed.id)
    assert client.runs.wait(failed.id).output == "fixed"
    forked = client.runs.rerun_from(failed.id, "fragile")
    assert client.runs.wait(forked).meta == {"rerun_of": failed.id, "from_step": "fragile"}
    [hello] = client.send(ss.Event("hello", {"name": "ada"}))
    greeted = client.runs.wait(client.runs.list(event_id=hello)[0].id)
    edited = client.runs.wait(client.runs.rerun_from(greeted.id, "second", event_data={"name": "bob"}))
    assert (greeted.output, edited.output) == ("hi ada", "hi bob")

    client.send([ss.Event("park") for _ in range(4)])
    seen: list[tuple[int, int]] = []
    assert client.runs.cancel_many(function_id="parked", progress=lambda d, e: seen.append((d, e))) == 4
    assert seen[0] == (0, 0) and seen[-1] == (4, 4)  # only active runs are examined
    assert client.runs.replay_many(function_id="parked", status="cancelled") == 5


def test_errors_are_the_same_stepstone_errors(shop: Shop, client: ss.Client) -> None:
    with pytest.raises(ss.NotFoundError, match="nope"):
        client.runs.get("nope")
    with pytest.raises(ss.ConfigError) as bad_status:
        client.runs.list(status="exploded")
    assert bad_status.value.field == "status[0]"
    with pytest.raises(ss.ConfigError, match="unknown function"):
        client.runs.cancel_many(function_id="ghost")
    with pytest.raises(ss.InvalidEventError, match="reserved"):
        client.send(ss.Event("stepstone/function.failed"))
    with pytest.raises(ss.LimitExceededError):
        client.send(ss.Event("hello", {"blob": "x" * 600_000}))
    run = client.runs.wait(client.runs.list(event_id=client.send(ss.Event("hello"))[0])[0].id)
    with pytest.raises(ss.InvalidStateError):
        client.runs.replay(run.id)
    with pytest.raises(ss.RunTimeoutError):
        client.runs.wait(client.runs.list(event_id=client.send(ss.Event("park"))[0])[0].id, timeout="50ms")
    with ss.Client(shop.live.url, api_key="wrong") as intruder, pytest.raises(ss.AuthenticationError):
        intruder.runs.list()
    with ss.Client(shop.live.url, event_key=EVENT_KEY) as sender:
        assert sender.send(ss.Event("park", id="sent-with-event-key")) == ["sent-with-event-key"]
        with pytest.raises(ss.AuthenticationError):
            sender.runs.list()


def test_an_unreachable_server_is_a_stepstone_error() -> None:
    with (
        ss.Client(f"http://127.0.0.1:{free_port()}", api_key="k") as nowhere,
        pytest.raises(ss.ServerUnavailableError, match="cannot reach"),
    ):
        nowhere.runs.list()


def test_async_twins(shop: Shop) -> None:
    async def scenario() -> tuple[ss.Run, list[ss.FunctionInfo], int]:
        async with ss.Client(shop.live.url, api_key=API_KEY) as remote:
            [event_id] = await remote.send_async(ss.Event("hello", {"name": "async"}))
            [run] = await remote.runs.list_async(event_id=event_id)
            done = await remote.runs.wait_async(run.id)
            functions = await remote.functions.list_async()
            workers = await remote.workers.list_async()
            return done, functions, len(workers)

    done, functions, workers = asyncio.run(scenario())
    assert done.output == "hi async"
    assert {f.id for f in functions} == {"greet", "flaky", "parked"}
    assert workers == 1
