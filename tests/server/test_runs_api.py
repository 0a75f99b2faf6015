"""Runs over real HTTP: list filters and cursor pages, show, trace, cancel, replay, rerun."""

from __future__ import annotations

from datetime import UTC, datetime

import httpx
import pytest

from tests.server.conftest import Shop


def test_list_filters_by_function_status_and_time(shop: Shop) -> None:
    greet = shop.wait(shop.run_of(shop.send("hello", {"name": "a"}))["id"])
    failed = shop.wait(shop.run_of(shop.send("boom"))["id"])
    parked = shop.run_of(shop.send("park"))
    get = shop.http.get

    def ids(response: httpx.Response) -> list[str]:
        return [r["id"] for r in response.json()["runs"]]

    assert ids(get("/api/v1/runs", params={"function_id": "greet"})) == [greet["id"]]
    assert ids(get("/api/v1/runs", params={"status": "failed"})) == [failed["id"]]
    both = get("/api/v1/runs", params=[("status", "failed"), ("status", "queued")])
    assert set(ids(both)) == {failed["id"], parked["id"]}
    # a moment between the first two runs, as RFC 3339 and as epoch seconds
    between = (
        datetime.fromisoformat(greet["created_at"]).timestamp()
        + datetime.fromisoformat(failed["created_at"]).timestamp()
    ) / 2
    rfc3339 = datetime.fromtimestamp(between, UTC).isoformat().replace("+00:00", "Z")
    assert set(ids(get("/api/v1/runs", params={"since": rfc3339}))) == {failed["id"], parked["id"]}
    assert ids(get("/api/v1/runs", params={"until": str(between)})) == [greet["id"]]
    assert ids(get("/api/v1/runs", params={"since": rfc3339, "until": rfc3339})) == []
    shown = get(f"/api/v1/runs/{greet['id']}").json()
    assert shown["output"] == "hi a" and [s["id"] for s in shown["steps"]] == ["first", "second"]
    assert shown["started_at"] and shown["ended_at"] and shown["error"] is None


def test_cursor_pagination_walks_every_run_once(shop: Shop) -> None:
    shop.http.post("/api/v1/events", json=[{"name": "park", "data": {"i": i}} for i in range(7)])
    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        params: dict[str, str | int] = {
            "limit": 3,
            "function_id": "parked",
            **({"cursor": cursor} if cursor else {}),
        }
        page = shop.http.get("/api/v1/runs", params=params).json()
        seen += [r["id"] for r in page["runs"]]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert pages == 3 and len(seen) == 7 and len(set(seen)) == 7
    assert seen == sorted(seen, reverse=True)  # newest first


@pytest.mark.parametrize(
    ("params", "field", "needle"),
    [
        ({"function_id": "no-such-fn"}, "function_id", "unknown function 'no-such-fn'"),
        ({"status": "exploded"}, "status[0]", "Input should be"),
        ({"since": "last tuesday"}, "since", "RFC 3339"),
        ({"until": "nan"}, "until", "finite"),
        ({"since": "2030-01-01T00:00:00Z", "until": "2020-01-01T00:00:00Z"}, "since", "must not be after"),
        ({"cursor": "not-a-cursor"}, "cursor", "malformed cursor"),
        ({"limit": 0}, "limit", "greater than or equal to 1"),
        ({"functon_id": "greet"}, "functon_id", "unknown query parameter"),
    ],
)
def test_bad_filters_get_422_naming_the_parameter(
    shop: Shop, params: dict[str, str | int], field: str, needle: str
) -> None:
    response = shop.http.get("/api/v1/runs", params=params)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["field"] == field and needle in error["message"], error


def test_trace_has_every_span_with_errors_and_tracebacks(shop: Shop) -> None:
    run = shop.wait(shop.run_of(shop.send("boom"))["id"])
    assert run["status"] == "failed" and run["error"]["message"] == "kaboom"
    trace = shop.http.get(f"/api/v1/runs/{run['id']}/trace").json()
    assert trace["run_id"] == run["id"]
    by_name = {s["name"]: s for s in trace["spans"]}
    assert [s["kind"] for s in trace["spans"]][:2] == ["run", "queued"]
    fragile = by_name["fragile"]
    assert fragile["kind"] == "step" and fragile["status"] == "failed" and fragile["attempt"] == 1
    assert fragile["error"]["type"] == "NonRetriableError"
    assert "kaboom" in fragile["error"]["traceback"]
    assert by_name["before"]["status"] == "completed" and by_name["before"]["duration"] >= 0
    for span in trace["spans"]:
        assert set(span) == {
            "kind",
            "name",
            "status",
            "attempt",
            "started_at",
            "ended_at",
            "duration",
            "error",
            "detail",
        }


def test_cancel_replay_and_rerun(shop: Shop) -> None:
    parked = shop.run_of(shop.send("park"))
    cancelled = shop.http.post(f"/api/v1/runs/{parked['id']}/cancel")
    assert cancelled.json() == {"id": parked["id"], "status": "cancelled"}
    assert shop.http.get(f"/api/v1/runs/{parked['id']}").json()["status"] == "cancelled"

    failed = shop.wait(shop.run_of(shop.send("boom"))["id"])
    shop.switches["broken"] = False
    replayed = shop.http.post(f"/api/v1/runs/{failed['id']}/replay")
    assert replayed.status_code == 200 and replayed.json()["id"] == failed["id"]
    done = shop.wait(failed["id"], ("completed",))
    assert done["output"] == "fixed"

    again = shop.http.post(f"/api/v1/runs/{failed['id']}/replay")
    assert again.status_code == 409 and again.json()["error"]["type"] == "InvalidStateError"

    fork = shop.http.post(f"/api/v1/runs/{failed['id']}/rerun", json={"step_id": "fragile"})
    assert fork.status_code == 200, fork.text
    new = fork.json()
    assert new["rerun_of"] == failed["id"] and new["id"] != failed["id"]
    forked = shop.wait(new["id"], ("completed",))
    assert [s["id"] for s in forked["steps"]] == ["before", "fragile"]


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/api/v1/runs/nope", None),
        ("GET", "/api/v1/runs/nope/trace", None),
        ("POST", "/api/v1/runs/nope/cancel", None),
        ("POST", "/api/v1/runs/nope/replay", None),
        ("POST", "/api/v1/runs/nope/rerun", {"step_id": "a"}),
    ],
)
def test_unknown_runs_are_404(shop: Shop, method: str, path: str, body: object) -> None:
    response = shop.http.request(method, path, json=body)
    assert response.status_code == 404
    assert (
        response.json()["error"]["type"] == "NotFoundError" and "nope" in response.json()["error"]["message"]
    )


def test_rerun_from_an_unknown_step_is_404_and_needs_a_step_id(shop: Shop) -> None:
    run = shop.wait(shop.run_of(shop.send("hello"))["id"])
    missing = shop.http.post(f"/api/v1/runs/{run['id']}/rerun", json={"step_id": "third"})
    assert missing.status_code == 404 and "third" in missing.json()["error"]["message"]
    empty = shop.http.post(f"/api/v1/runs/{run['id']}/rerun", json={})
    assert empty.status_code == 422 and empty.json()["error"]["field"] == "step_id"


def test_rerun_with_edited_event_data(shop: Shop) -> None:
    run = shop.wait(shop.run_of(shop.send("hello", {"name": "ada"}))["id"])
    assert run["output"] == "hi ada"
    path = f"/api/v1/runs/{run['id']}/rerun"
    fork = shop.http.post(path, json={"step_id": "second", "event_data": {"name": "bob"}})
    assert fork.status_code == 200, fork.text
    forked = shop.wait(fork.json()["id"], ("completed",))
    assert forked["output"] == "hi bob" and forked["event_ids"] != run["event_ids"]
    assert shop.http.get(f"/api/v1/runs/{run['id']}").json()["output"] == "hi ada"

    not_object = shop.http.post(path, json={"step_id": "second", "event_data": ["bob"]})
    assert not_object.status_code == 422 and not_object.json()["error"]["field"] == "event_data"
    not_json = shop.http.post(
        path, content=b'{"step_id": "second", "event_data": {', headers={"content-type": "application/json"}
    )
    assert not_json.status_code == 400, not_json.text
    assert len(shop.http.get("/api/v1/runs", params={"function_id": "greet"}).json()["runs"]) == 2
