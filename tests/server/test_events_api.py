"""POST /api/v1/events over real HTTP: ids, dedupe, all-or-nothing lists, 4xx for bad input."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import stepstone as ss
from stepstone import limits
from tests.conftest import query
from tests.server.conftest import Live, Shop, poll


def event_count(db_url: str) -> int:
    return int(query(db_url, "SELECT COUNT(*) FROM events")[0][0])


def test_one_event_or_a_list_returns_ids_and_starts_runs(shop: Shop) -> None:
    one = shop.http.post("/api/v1/events", json={"name": "hello", "data": {"name": "ada"}, "id": "e-1"})
    assert one.status_code == 200 and one.json() == {"ids": ["e-1"]}
    many = shop.http.post(
        "/api/v1/events", json=[{"name": "hello", "data": {"name": "bob"}}, {"name": "nobody.listens"}]
    )
    assert many.status_code == 200
    ids = many.json()["ids"]
    assert len(ids) == 2 and all(isinstance(i, str) and i for i in ids)
    done = shop.wait(shop.run_of("e-1")["id"])
    assert done["output"] == "hi ada"
    assert shop.wait(shop.run_of(ids[0])["id"])["output"] == "hi bob"
    assert shop.http.get("/api/v1/runs", params={"event_id": ids[1]}).json()["runs"] == []


def test_an_event_id_seen_before_starts_nothing_new(shop: Shop) -> None:
    for _ in range(3):
        assert shop.http.post("/api/v1/events", json={"name": "hello", "id": "same"}).json() == {
            "ids": ["same"]
        }
    runs = shop.http.get("/api/v1/runs", params={"event_id": "same"}).json()["runs"]
    assert len(runs) == 1


@pytest.mark.parametrize(
    ("body", "status", "kind", "needle"),
    [
        ([{"name": "hello"}, {"name": "hello", "data": []}], 422, "ConfigError", "[1].data"),
        ([{"name": "hello"}, {"name": "stepstone/function.failed"}], 422, "InvalidEventError", "reserved"),
        (
            [{"name": "hello"}, {"name": "hello", "data": {"blob": "x" * (limits.MAX_EVENT_BYTES + 1)}}],
            413,
            "LimitExceededError",
            "over the limit",
        ),
        ({"data": {}}, 422, "ConfigError", "name"),
        ({"name": "   "}, 422, "ConfigError", "name"),
        ({"name": "hello", "ts": "yesterday"}, 422, "ConfigError", "ts"),
        ({"name": "hello", "ts": True}, 422, "ConfigError", "ts"),
        ({"name": "hello", "id": ""}, 422, "ConfigError", "id"),
        ({"name": "x" * (limits.MAX_EVENT_NAME_CHARS + 1)}, 422, "ConfigError", "name"),
        (7, 422, "ConfigError", "body"),
    ],
)
def test_bad_events_are_rejected_whole_with_a_named_problem(
    shop: Shop, db_url: str, body: Any, status: int, kind: str, needle: str
) -> None:
    before = event_count(db_url)
    response = shop.http.post("/api/v1/events", json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["type"] == kind and needle in error["message"], error
    assert event_count(db_url) == before  # nothing stored, not even the good first event


def test_malformed_json_non_json_and_oversized_bodies(shop: Shop, db_url: str) -> None:
    before = event_count(db_url)
    bad_json = shop.http.post(
        "/api/v1/events", content=b'{"name": "hello",', headers={"content-type": "application/json"}
    )
    assert bad_json.status_code == 400 and "malformed JSON" in bad_json.json()["error"]["message"]
    form = shop.http.post(
        "/api/v1/events", content=b"name=hello", headers={"content-type": "application/x-www-form-urlencoded"}
    )
    assert form.status_code == 415 and "application/json" in form.json()["error"]["message"]
    huge = b"[" + b'{"name": "hello"},' * (limits.MAX_REQUEST_BYTES // 18) + b'{"name": "hello"}]'
    too_big = shop.http.post("/api/v1/events", content=huge, headers={"content-type": "application/json"})
    assert too_big.status_code == 413
    assert too_big.json()["error"] == {
        "type": "LimitExceededError",
        "field": None,
        "message": f"request body over the limit of {limits.MAX_REQUEST_BYTES} bytes",
    }
    assert event_count(db_url) == before


def test_a_server_without_user_code_matches_functions_through_the_catalog(
    serve: Callable[..., Live], db_url: str
) -> None:
    registering = ss.App("billing", database_url=db_url)
    registering.function(id="invoice", trigger=ss.on_event("order.paid", if_="event.data.total > 100"))(
        lambda ctx: None
    )
    registering.store  # noqa: B018 - writes the function to the database
    bare = ss.App("bare", database_url=db_url)  # what `stepstone server` uses: no functions
    live: Live = serve(bare)
    small, big = live.http.post(
        "/api/v1/events",
        json=[{"name": "order.paid", "data": {"total": 5}}, {"name": "order.paid", "data": {"total": 500}}],
    ).json()["ids"]
    assert live.http.get("/api/v1/runs", params={"event_id": small}).json()["runs"] == []
    [run] = live.http.get("/api/v1/runs", params={"event_id": big}).json()["runs"]
    assert run["function_id"] == "invoice" and run["status"] == "queued"
    # and a worker of the registering app executes it
    registering.start(concurrency=1)
    poll(
        lambda: live.http.get(f"/api/v1/runs/{run['id']}").json()["status"] == "completed",
        what="the remote worker to run it",
    )
    registering.close()
    bare.close()
