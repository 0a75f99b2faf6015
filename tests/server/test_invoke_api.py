"""``POST /api/v1/functions/{id}/invoke`` (issue 20): a run of that function
alone, whatever its triggers, through its flow control; the same checks as any
body (unknown fields, size, keys). Over real HTTP, on both stores."""

from __future__ import annotations

import httpx

from stepstone import limits
from tests.conftest import query
from tests.server.conftest import EVENT_KEY, Shop


def test_invoke_starts_one_run_of_that_function_only(shop: Shop, db_url: str) -> None:
    response = shop.http.post("/api/v1/functions/greet/invoke", json={"data": {"name": "ivy"}})
    assert response.status_code == 200, response.text
    body = response.json()
    run = shop.wait(body["run_id"])
    assert run["function_id"] == "greet" and run["output"] == "hi ivy"
    assert run["event_ids"] == [body["event_id"]]
    assert [
        r["id"] for r in shop.http.get("/api/v1/runs", params={"event_id": body["event_id"]}).json()["runs"]
    ] == [run["id"]]
    [event] = shop.http.get("/api/v1/events", params={"event_id": body["event_id"]}).json()["events"]
    assert event["name"] == "stepstone/function.invoked" and event["data"] == {"name": "ivy"}


def test_invoke_goes_through_flow_control(shop: Shop) -> None:
    """``parked`` (concurrency 2, no worker) queues like a run its event started."""
    run_id = shop.http.post("/api/v1/functions/parked/invoke", json={}).json()["run_id"]
    assert shop.http.get(f"/api/v1/runs/{run_id}").json()["status"] == "queued"


def test_invoke_refuses_what_it_cannot_do(shop: Shop, db_url: str) -> None:
    before = query(db_url, "SELECT COUNT(*) FROM runs")
    for path, body, status, kind in [
        ("/api/v1/functions/nobody/invoke", {"data": {}}, 404, "NotFoundError"),
        ("/api/v1/functions/greet/invoke", {"data": [1]}, 422, "ConfigError"),
        ("/api/v1/functions/greet/invoke", {"dat": {}}, 422, "ConfigError"),
        (
            "/api/v1/functions/greet/invoke",
            {"data": {"blob": "x" * (limits.MAX_EVENT_BYTES + 1)}},
            413,
            "LimitExceededError",
        ),
    ]:
        response = shop.http.post(path, json=body)
        assert response.status_code == status, (body, response.text)
        assert response.json()["error"]["type"] == kind
    sender = httpx.post(
        f"{shop.live.url}/api/v1/functions/greet/invoke",
        json={},
        headers={"Authorization": f"Bearer {EVENT_KEY}"},
    )
    assert sender.status_code == 401  # invoking is not sending: the API key only
    assert query(db_url, "SELECT COUNT(*) FROM runs") == before
