"""The operator views over HTTP: run search (`q`, `if`), counts per status,
function load and backlog per concurrency key, timelines, bulk previews, and the
event log."""

from __future__ import annotations

from collections.abc import Callable

import httpx

import stepstone as ss
from stepstone.expressions import compile_expression
from stepstone.server.search import EventQuery, search_op
from stepstone.store.rows import RunFilter
from tests.server.conftest import Live, Shop, poll


def ids(response: httpx.Response) -> list[str]:
    return [r["id"] for r in response.json()["runs"]]


def test_runs_are_found_by_event_text_and_cel(shop: Shop) -> None:
    acme = shop.run_of(shop.send("park", {"tenant": "ACME", "n": 1}, id="evt-acme"))["id"]
    other = shop.run_of(shop.send("park", {"tenant": "globex", "n": 2}))["id"]
    get = shop.http.get
    assert ids(get("/api/v1/runs", params={"q": "acme"})) == [acme]  # data, any case
    assert ids(get("/api/v1/runs", params={"q": "EVT-AC"})) == [acme]  # event id
    assert ids(get("/api/v1/runs", params={"q": other[-8:]})) == [other]  # run id
    assert ids(get("/api/v1/runs", params={"if": "event.data.n > 1"})) == [other]
    assert ids(get("/api/v1/runs", params={"if": "event.data.n > 1", "q": "acme"})) == []
    assert ids(get("/api/v1/runs", params={"q": "park", "status": "failed"})) == []
    bad = get("/api/v1/runs", params={"if": "event.data =="})
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "if"


def test_a_search_scans_a_bounded_number_of_runs_and_resumes(shop: Shop) -> None:
    shop.http.post("/api/v1/events", json=[{"name": "park", "data": {"i": i}} for i in range(9)])
    event_query = EventQuery(None, compile_expression("event.data.i % 3 == 0", field="if"))
    where = RunFilter(function_id="parked")
    seen: list[int] = []
    pages = 0
    while True:
        found = shop.app.store.read_sync(search_op(where, event_query, limit=10, scan_limit=4))
        assert found.examined <= 4
        seen += [int(_data(shop, r.id)["i"]) for r in found.runs]
        pages += 1
        if found.cursor is None:
            break
        where = RunFilter(function_id="parked", before_id=found.cursor)
    assert sorted(seen) == [0, 3, 6] and pages == 3


def _data(shop: Shop, run_id: str) -> dict[str, int]:
    return dict(shop.http.get(f"/api/v1/runs/{run_id}/events").json()["events"][0]["data"])


def test_counts_per_status_and_function_load(shop: Shop) -> None:
    shop.wait(shop.run_of(shop.send("boom"))["id"])
    shop.wait(shop.run_of(shop.send("hello"))["id"])
    shop.send("park")
    shop.send("park")
    counts = shop.http.get("/api/v1/stats/runs").json()
    assert counts["total"] == 4 and counts["counts"]["failed"] == 1 and counts["counts"]["queued"] == 2
    assert shop.http.get("/api/v1/stats/runs", params={"function_id": "greet"}).json()["total"] == 1
    assert shop.http.get("/api/v1/stats/runs", params={"function_id": "ghost"}).status_code == 422
    loads = {f["function"]["id"]: f for f in shop.http.get("/api/v1/stats/functions").json()["functions"]}
    assert loads["flaky"]["failed_last_hour"] == 1 and loads["greet"]["failed_last_hour"] == 0
    parked = loads["parked"]
    assert parked["active"]["queued"] == 2 and parked["backlog"] == 2
    assert parked["keys"] == [
        {"ckey1": "fn:parked", "ckey2": None, "limit1": 2, "limit2": None, "due": 2, "leased": 0, "total": 2}
    ]
    assert parked["function"]["config"]["concurrency"]


def test_the_timeline_counts_outcomes_and_queue_delay(shop: Shop) -> None:
    for _ in range(3):
        shop.wait(shop.run_of(shop.send("boom"))["id"])
    shop.wait(shop.run_of(shop.send("hello"))["id"])
    shop.send("park")
    timeline = shop.http.get("/api/v1/stats/timeline", params={"buckets": 12}).json()
    buckets = timeline["buckets"]
    assert timeline["width"] == 300 and 12 <= len(buckets) <= 13
    assert sum(b["created"] for b in buckets) == 5
    assert sum(b["failed"] for b in buckets) == 3 and sum(b["completed"] for b in buckets) == 1
    busy = [b for b in buckets if b["created"]]
    delays = [b["queue_delay_avg"] for b in busy if b["queue_delay_avg"] is not None]
    assert delays and all(0 <= d < 10 for d in delays)
    for b in busy:
        ended = b["completed"] + b["failed"] + b["cancelled"]
        assert b["failure_rate"] == (b["failed"] / ended if ended else None)
    one = shop.http.get("/api/v1/stats/timeline", params={"function_id": "greet"}).json()
    assert sum(b["created"] for b in one["buckets"]) == 1
    for params in (
        {"since": "2000-01-01T00:00:00Z"},
        {"since": "1e308"},
        {"until": "-1e300"},
        {"since": "100", "until": "100"},
    ):
        refused = shop.http.get("/api/v1/stats/timeline", params=params)
        assert refused.status_code == 422, params


def test_the_preview_counts_what_the_bulk_job_then_acts_on(shop: Shop) -> None:
    shop.http.post("/api/v1/events", json=[{"name": "park", "data": {"tenant": t}} for t in "aab"])
    preview = shop.http.get(
        "/api/v1/stats/preview",
        params={"action": "cancel", "function_id": "parked", "if": "event.data.tenant == 'a'"},
    ).json()
    assert preview["count"] == 2 and preview["complete"] and len(preview["sample"]) == 2
    plain = shop.http.get("/api/v1/stats/preview", params={"action": "cancel", "function_id": "parked"})
    assert plain.json()["count"] == 3
    job = shop.http.post(
        "/api/v1/runs/cancel-many", json={"function_id": "parked", "if": "event.data.tenant == 'a'"}
    ).json()
    done = poll(
        lambda: (j := shop.http.get(f"/api/v1/jobs/{job['id']}").json())["status"] == "completed" and j
    )
    assert done["done"] == preview["count"]
    replay = shop.http.get(
        "/api/v1/stats/preview",
        params=[("action", "replay"), ("function_id", "parked"), ("status", "cancelled")],
    ).json()
    assert replay["count"] == 2 and set(replay["sample"]) == set(preview["sample"])
    bad = shop.http.get("/api/v1/stats/preview", params={"action": "replay", "function_id": "ghost"})
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "function_id"


def test_the_event_log_lists_events_with_the_runs_they_started(shop: Shop) -> None:
    for i in range(3):
        shop.send("park", {"i": i}, id=f"p-{i}")
    greet = shop.wait(shop.run_of(shop.send("hello", id="h-1"))["id"])
    page = shop.http.get("/api/v1/events", params={"limit": 2}).json()
    assert [e["id"] for e in page["events"]] == ["h-1", "p-2"]
    assert page["events"][0]["runs"] == [{"id": greet["id"], "function_id": "greet", "status": "completed"}]
    rest = shop.http.get("/api/v1/events", params={"limit": 2, "cursor": page["next_cursor"]}).json()
    assert [e["id"] for e in rest["events"]] == ["p-1", "p-0"] and rest["next_cursor"] is None
    named = shop.http.get("/api/v1/events", params={"name": "hello"}).json()["events"]
    assert [e["id"] for e in named] == ["h-1"]
    mine = shop.http.get(f"/api/v1/runs/{greet['id']}/events").json()["events"]
    assert [e["id"] for e in mine] == ["h-1"]
    assert shop.http.get("/api/v1/runs/nope/events").status_code == 404
    assert shop.http.get("/api/v1/events", params={"cursor": "bad"}).status_code == 422


def test_encrypted_event_data_shows_as_encrypted(
    make_app: Callable[..., ss.App], serve: Callable[..., Live]
) -> None:
    app = make_app("vault", middleware=[ss.EncryptionMiddleware("k" * 32)])
    app.function(id="noop", trigger=ss.on_event("secret"))(lambda ctx: None)
    live = serve(app)
    [event_id] = app.send(ss.Event("secret", {"encrypted": {"card": "4242"}, "plain": 1}))
    [event] = live.http.get("/api/v1/events").json()["events"]
    assert event["id"] == event_id and event["data"] == {"encrypted": "encrypted", "plain": 1}
