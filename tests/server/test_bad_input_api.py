"""Over HTTP, bad input never blocks good input: expressions that fail at runtime
leave ``POST /api/v1/events`` answering 2xx and run filters answering 200;
deeply nested data is refused with 422 and a message; events stored nested
deeper (before the bound existed) still show in the API and the dashboard."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx

import stepstone as ss
from stepstone.encryption import TOO_DEEP
from stepstone.server.auth import AuthConfig
from stepstone.store.base import Tx
from stepstone.store.rows import NewEvent, NewRun
from tests.integration.test_bad_input import CONDITIONS, DATA, nested, register_failing_slots
from tests.server.conftest import Live, poll


def open_server(make_app: Callable[..., ss.App], serve: Callable[..., Live]) -> tuple[Live, list[str]]:
    """An open server (no keys) over an app with a failing expression in every
    slot (see ``register_failing_slots``, whose must-start functions it returns)
    and "probe", a plain function."""
    app = make_app("bad-input")
    every = register_failing_slots(app)
    app.function(id="probe", trigger=ss.on_event("probe"))(lambda ctx: None)
    return serve(app, auth=AuthConfig.resolve(insecure=True, env={})), every


def test_events_with_failing_expressions_are_ingested_with_their_batch(
    make_app: Callable[..., ss.App], serve: Callable[..., Live]
) -> None:
    live, every = open_server(make_app, serve)
    response = live.http.post(
        "/api/v1/events", json=[{"name": "go", "data": DATA}, {"name": "probe", "data": {"n": 0}}]
    )
    assert response.status_code == 200, response.text
    go, probe = response.json()["ids"]
    started = {
        r["function_id"]
        for r in live.http.get("/api/v1/runs", params={"event_id": go, "limit": 500}).json()["runs"]
    }
    assert set(every) <= started
    assert len(live.http.get("/api/v1/runs", params={"event_id": probe}).json()["runs"]) == 1
    for condition in CONDITIONS:
        listed = live.http.get("/api/v1/runs", params={"function_id": "plain", "if": condition})
        assert listed.status_code == 200 and listed.json()["runs"] == [], (condition, listed.text)
        preview = live.http.get(
            "/api/v1/stats/preview", params={"action": "cancel", "function_id": "plain", "if": condition}
        )
        assert preview.status_code == 200, (condition, preview.text)
        assert preview.json()["count"] == 0 and preview.json()["examined"] == 1, preview.text
    job = live.http.post("/api/v1/runs/cancel-many", json={"function_id": "plain", "if": CONDITIONS[0]})
    assert job.status_code == 202, job.text

    def finished() -> Any:
        found = live.http.get(f"/api/v1/jobs/{job.json()['id']}").json()
        return found if found["status"] not in ("queued", "running") else None

    done = poll(finished, what="the cancel-many job")
    assert (done["status"], done["done"], done["examined"], done["error"]) == ("completed", 0, 1, None)


def test_deeply_nested_events_are_refused_with_422(
    make_app: Callable[..., ss.App], serve: Callable[..., Live]
) -> None:
    live, _ = open_server(make_app, serve)
    for depth in (65, 900):
        response = live.http.post("/api/v1/events", json={"name": "probe", "data": nested(depth)})
        assert response.status_code == 422, response.text
        assert "nested more than 64 levels" in response.json()["error"]["message"]
    deep = "[" * 100_000 + "]" * 100_000  # beyond what the JSON decoder follows
    response = live.http.post(
        "/api/v1/events",
        content=f'{{"name": "probe", "data": {{"a": {deep}}}}}',
        headers={"content-type": "application/json"},
    )
    assert 400 <= response.status_code < 500, response.text
    assert live.http.post("/api/v1/events", json={"name": "probe", "data": nested(64)}).status_code == 200


def test_events_stored_nested_deeper_still_show(
    make_app: Callable[..., ss.App], serve: Callable[..., Live]
) -> None:
    live, _ = open_server(make_app, serve)
    now = live.app.clock.now()

    def store_old_row(tx: Tx) -> None:  # as an older version accepted it
        seq = tx.insert_event(
            NewEvent(id="deep-1", name="probe", data=json.dumps(nested(900)), ts=7, received_at=now)
        )
        tx.create_run(
            NewRun(
                id="run-deep",
                function_id="probe",
                event_seqs=[seq],
                event_ids=["deep-1"],
                available_at=now + 3600,
                created_at=now,
            )
        )

    live.app.store.transact_sync(store_old_row)
    listing = live.http.get("/api/v1/events", params={"name": "probe"})
    assert listing.status_code == 200, listing.text
    shown = listing.json()["events"][0]["data"]
    for _ in range(100):
        shown = shown["a"]
    assert shown == TOO_DEEP
    assert live.http.get("/api/v1/runs/run-deep/events").status_code == 200
    assert live.http.get("/api/v1/runs", params={"q": "deep-1"}).json()["runs"][0]["id"] == "run-deep"
    with httpx.Client(base_url=live.url, timeout=30) as browser:
        page = browser.get("/runs/run-deep")
        assert page.status_code == 200 and "nested too deeply" in page.text
        assert browser.get("/events", params={"name": "probe"}).status_code == 200
