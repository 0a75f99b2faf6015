"""Server-side robustness (issue 20): the key before the body, DNS rebinding and
cross-site requests under ``--insecure-no-auth``, login throttling, unknown body
fields, malformed JSON. Real HTTP over a live server; raw sockets where the
request itself must be malformed."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import httpx
import pytest

import stepstone as ss
from stepstone.server.auth import AuthConfig
from stepstone.server.throttle import LoginThrottle
from tests.server.conftest import API_KEY, Live, Shop


def raw_request(url: str, head: str, timeout: float = 5.0) -> str:
    """Send ``head`` (request line and headers, no body) and return the status line."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(head.encode())
        received = b""
        while b"\r\n" not in received:
            chunk = sock.recv(4096)  # socket.timeout fails the test: the server waited for the body
            if not chunk:
                break
            received += chunk
    return received.split(b"\r\n", 1)[0].decode()


@pytest.mark.parametrize("length", [1000, 10**12])
def test_a_keyless_request_gets_401_before_its_body_arrives(shop: Shop, length: int) -> None:
    head = (
        "POST /api/v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    )
    started = time.monotonic()
    status = raw_request(shop.live.url, head)
    assert status.split()[1] == "401", status
    assert time.monotonic() - started < 4


def test_a_body_over_the_limit_with_a_key_still_gets_413(shop: Shop) -> None:
    head = (
        f"POST /api/v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {API_KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {10**12}\r\n\r\n"
    )
    assert raw_request(shop.live.url, head).split()[1] == "413"


def test_unknown_body_fields_get_422_naming_the_field(shop: Shop) -> None:
    for path, body in [
        ("/api/v1/events", {"name": "park", "dta": {"x": 1}}),
        ("/api/v1/events", [{"name": "park"}, {"name": "park", "extra": 1}]),
        ("/api/v1/runs/cancel-many", {"function_id": "parked", "status": "queued"}),
    ]:
        response = shop.http.post(path, json=body)
        assert response.status_code == 422, (path, response.text)
        error = response.json()["error"]
        assert error["type"] == "ConfigError" and "unknown field" in error["message"], error
        assert error["field"] in ("dta", "[1].extra", "status"), error


@pytest.mark.parametrize("body", [b"{not json", b'{"name": "park",}', b"", b"[1, 2"])
def test_malformed_json_gets_the_documented_malformed_request_type(shop: Shop, body: bytes) -> None:
    response = shop.http.post("/api/v1/events", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["type"] == "MalformedRequest"


@pytest.fixture
def open_server(serve: Callable[..., Live], make_app: Callable[..., ss.App]) -> Live:
    app = make_app("open")
    app.function(id="parked", trigger=ss.on_event("park"))(lambda ctx: None)
    app.store  # noqa: B018 - registers "parked"
    return serve(app, auth=AuthConfig.resolve(insecure=True, env={}))


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8288", "10.0.0.7", "127.0.0.1.evil.example"])
def test_an_open_server_refuses_a_foreign_host_header(open_server: Live, host: str) -> None:
    for method, path in [("GET", "/api/v1/runs"), ("POST", "/api/v1/events"), ("GET", "/")]:
        response = httpx.request(
            method, open_server.url + path, headers={"Host": host}, json={"name": "park"}
        )
        assert response.status_code == 403, (host, path, response.text)
        assert "Host" in response.text
    assert open_server.http.get("/api/v1/runs").json()["runs"] == []


@pytest.mark.parametrize("host", ["localhost", "localhost:8288", "127.0.0.1", "[::1]:8288", "app.localhost"])
def test_an_open_server_accepts_loopback_host_headers(open_server: Live, host: str) -> None:
    response = httpx.get(open_server.url + "/api/v1/functions", headers={"Host": host})
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "https://evil.example"},
        {"Origin": "null"},
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
    ],
)
def test_an_open_server_refuses_cross_site_state_changes(open_server: Live, headers: dict[str, str]) -> None:
    with httpx.Client(base_url=open_server.url) as client:
        refused = client.post("/api/v1/events", json={"name": "park"}, headers=headers)
        assert refused.status_code == 403, refused.text
        assert client.get("/api/v1/runs").json()["runs"] == []
        assert client.get("/api/v1/runs", headers=headers).status_code == 200  # reading stays allowed
        same = {"Origin": open_server.url, "Sec-Fetch-Site": "same-origin"}
        assert client.post("/api/v1/events", json={"name": "park"}, headers=same).status_code == 200


def test_a_server_with_keys_does_not_check_the_host(shop: Shop) -> None:
    response = shop.http.get("/api/v1/functions", headers={"Host": "stepstone.internal.example"})
    assert response.status_code == 200


def test_login_attempts_are_rate_limited_per_client(shop: Shop) -> None:
    with httpx.Client(base_url=shop.live.url) as browser:
        for _ in range(LoginThrottle.DEFAULT_LIMIT):
            assert browser.post("/login", data={"api_key": "guess"}).status_code == 401
        limited = browser.post("/login", data={"api_key": API_KEY})  # even the right key, now
        assert limited.status_code == 429, limited.text
        assert int(limited.headers["retry-after"]) > 0
        assert "Too many" in limited.text


def test_the_login_throttle_counts_failures_per_address_in_a_window() -> None:
    now = [1000.0]
    throttle = LoginThrottle(limit=2, window=60.0, clock=lambda: now[0])
    for _ in range(2):
        assert throttle.retry_after("10.0.0.1") is None
        throttle.failed("10.0.0.1")
    assert throttle.retry_after("10.0.0.1") == 60
    assert throttle.retry_after("10.0.0.2") is None  # another client is not affected
    now[0] += 30
    assert throttle.retry_after("10.0.0.1") == 30
    now[0] += 30.5
    assert throttle.retry_after("10.0.0.1") is None
