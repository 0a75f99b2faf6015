"""Keys: missing or wrong keys get 401 with a JSON error and change nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

import stepstone as ss
from stepstone.server.auth import AuthConfig
from tests.conftest import query
from tests.server.conftest import API_KEY, EVENT_KEY, Live, Shop

ENDPOINTS: list[tuple[str, str, Any]] = [
    ("POST", "/api/v1/events", {"name": "park"}),
    ("GET", "/api/v1/runs", None),
    ("GET", "/api/v1/runs/{run}", None),
    ("GET", "/api/v1/runs/{run}/trace", None),
    ("POST", "/api/v1/runs/{run}/cancel", None),
    ("POST", "/api/v1/runs/{run}/replay", None),
    ("POST", "/api/v1/runs/{run}/resume", None),
    ("POST", "/api/v1/runs/{run}/rerun", {"step_id": "x"}),
    ("POST", "/api/v1/runs/cancel-many", {"function_id": "parked"}),
    ("POST", "/api/v1/runs/replay-many", {"function_id": "parked", "status": ["cancelled"]}),
    ("POST", "/api/v1/runs/resume-many", {"function_id": "parked"}),
    ("GET", "/api/v1/jobs", None),
    ("GET", "/api/v1/jobs/x", None),
    ("GET", "/api/v1/functions", None),
    ("GET", "/api/v1/workers", None),
    ("GET", "/metrics", None),
]


def database_state(db_url: str) -> list[Any]:
    return [
        query(db_url, q)
        for q in (
            "SELECT id, status FROM runs ORDER BY id",
            "SELECT COUNT(*) FROM events",
            "SELECT COUNT(*) FROM jobs",
            "SELECT run_id, cancel_requested FROM queue ORDER BY run_id",
        )
    ]


@pytest.mark.parametrize("header", [None, "Bearer wrong-key", f"Basic {API_KEY}", "Bearer", API_KEY])
def test_every_endpoint_refuses_a_missing_or_wrong_key(shop: Shop, db_url: str, header: str | None) -> None:
    run = shop.run_of(shop.send("park"))["id"]
    before = database_state(db_url)
    with httpx.Client(base_url=shop.live.url) as anonymous:
        for method, path, body in ENDPOINTS:
            headers = {"Authorization": header} if header is not None else {}
            response = anonymous.request(method, path.format(run=run), json=body, headers=headers)
            assert response.status_code == 401, (method, path, response.text)
            assert response.json()["error"]["type"] == "AuthenticationError"
            assert response.headers["www-authenticate"] == "Bearer"
    assert database_state(db_url) == before


def test_authentication_comes_before_the_body_is_read(shop: Shop) -> None:
    with httpx.Client(base_url=shop.live.url) as anonymous:
        response = anonymous.post(
            "/api/v1/events", content=b"{not json", headers={"content-type": "application/json"}
        )
    assert response.status_code == 401


def test_the_event_key_only_sends_and_the_api_key_does_everything(shop: Shop, db_url: str) -> None:
    event_auth = {"Authorization": f"Bearer {EVENT_KEY}"}
    with httpx.Client(base_url=shop.live.url, headers=event_auth) as sender:
        assert sender.post("/api/v1/events", json={"name": "park", "id": "by-event-key"}).status_code == 200
        before = database_state(db_url)
        refused = sender.post("/api/v1/runs/cancel-many", json={"function_id": "parked"})
        assert refused.status_code == 401 and "only send events" in refused.json()["error"]["message"]
        assert sender.get("/api/v1/runs").status_code == 401
        assert database_state(db_url) == before
    assert shop.http.post("/api/v1/events", json={"name": "park"}).status_code == 200  # API key sends too
    assert shop.http.get("/api/v1/runs", params={"event_id": "by-event-key"}).json()["runs"]


def test_healthz_is_open(shop: Shop, db_url: str) -> None:
    response = httpx.get(f"{shop.live.url}/healthz")
    dialect = db_url.split(":", 1)[0]  # the URL scheme
    assert response.status_code == 200 and response.json() == {
        "status": "ok",
        "database": dialect,
        "error": None,
    }


def test_rotated_keys_are_all_accepted(serve: Callable[..., Live], make_app: Callable[..., ss.App]) -> None:
    auth = AuthConfig.resolve(env={"STEPSTONE_API_KEY": "old-key, new-key"})
    live: Live = serve(make_app("rotate"), auth=auth)
    for key, status in [("old-key", 200), ("new-key", 200), ("old-key,new-key", 401)]:
        response = httpx.get(f"{live.url}/api/v1/functions", headers={"Authorization": f"Bearer {key}"})
        assert response.status_code == status, key


def test_keys_are_required_unless_explicitly_insecure(
    serve: Callable[..., Live], make_app: Callable[..., ss.App]
) -> None:
    with pytest.raises(ss.ConfigError, match="no API key"):
        AuthConfig.resolve(env={})
    with pytest.raises(ss.ConfigError, match="no API key"):
        AuthConfig.resolve(event_key="only-events", env={})
    with pytest.raises(ss.ConfigError, match="insecure-no-auth"):
        ss.asgi(make_app("mounted"), event_key="e")
    assert AuthConfig.resolve(env={"STEPSTONE_API_KEY": "k"}).api_keys == ("k",)
    open_server: Live = serve(make_app("open"), auth=AuthConfig.resolve(insecure=True, env={}))
    response = httpx.get(f"{open_server.url}/api/v1/functions")
    assert response.status_code == 200 and response.json() == {"functions": []}
