"""The dashboard over plain HTTP: login and sessions, the cookie on the JSON API,
CSRF protection, and every page rendering what the database holds."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import httpx
import pytest

import stepstone as ss
from stepstone.server.auth import AuthConfig
from stepstone.server.sessions import COOKIE, SessionKeeper
from tests.conftest import FAST
from tests.dashboard.conftest import csrf_of, sign_in
from tests.server.conftest import API_KEY, EVENT_KEY, Live, Shop, poll
from tests.server.test_auth import database_state

PAGES = ["/", "/functions", "/events", "/workers", "/bulk", "/database", "/runs/anything"]


@pytest.mark.parametrize("path", PAGES)
def test_pages_without_a_session_redirect_to_the_login_form(shop: Shop, path: str) -> None:
    with httpx.Client(base_url=shop.live.url) as anonymous:
        response = anonymous.get(path, params={"q": "x"} if path == "/" else None)
        assert response.status_code == 303
        expected = "/login?next=" + httpx.URL(path).path.replace("/", "%2F")
        assert response.headers["location"].startswith(expected)
        # a bearer key is for the API, not for pages; a forged cookie is no session
        forged = f"{int(time.time()) + 999}.nonce.{'A' * 43}"
        assert anonymous.get(path, headers={"Authorization": f"Bearer {API_KEY}"}).status_code == 303
        assert anonymous.get(path, headers={"Cookie": f"{COOKIE}={forged}"}).status_code == 303


def test_a_wrong_key_shows_an_error_and_sets_no_cookie(shop: Shop) -> None:
    with httpx.Client(base_url=shop.live.url) as client:
        for key in ("wrong", EVENT_KEY, ""):
            response = client.post("/login", data={"api_key": key, "next": "/"})
            assert response.status_code == 401
            assert "That key is not valid" in response.text and 'role="alert"' in response.text
            assert "set-cookie" not in response.headers
        assert not client.cookies


def test_login_sets_a_hardened_session_cookie_that_is_not_the_key(shop: Shop) -> None:
    with httpx.Client(base_url=shop.live.url) as client:
        response = client.post("/login", data={"api_key": API_KEY, "next": "/functions?x=1"})
        assert response.status_code == 303 and response.headers["location"] == "/functions?x=1"
        cookie = response.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie
        assert "Secure" not in cookie  # plain http on loopback
        value = client.cookies[COOKIE]
        assert API_KEY not in value and re.fullmatch(r"\d+\.[\w-]+\.[\w-]+", value)
        page = client.get("/functions")
        assert page.status_code == 200 and "greet" in page.text and "parked" in page.text
        assert "script-src 'self'" in page.headers["content-security-policy"]
        assert page.headers["x-frame-options"] == "DENY"
    behind_tls = httpx.post(
        f"{shop.live.url}/login", data={"api_key": API_KEY}, headers={"X-Forwarded-Proto": "https"}
    )  # uvicorn trusts loopback proxies
    assert "Secure" in behind_tls.headers["set-cookie"]


@pytest.mark.parametrize(
    "target", ["https://evil.example/", "//evil.example/x", "/\\evil.example", "javascript:x"]
)
def test_login_never_redirects_off_site(shop: Shop, target: str) -> None:
    response = httpx.post(f"{shop.live.url}/login", data={"api_key": API_KEY, "next": target})
    assert response.status_code == 303 and response.headers["location"] == "/"


def test_the_session_cookie_opens_the_api_and_unsafe_requests_need_the_csrf_token(
    shop: Shop, session: httpx.Client, db_url: str
) -> None:
    parked = shop.run_of(shop.send("park"))["id"]
    listed = session.get("/api/v1/runs", params={"function_id": "parked"})
    assert listed.status_code == 200 and [r["id"] for r in listed.json()["runs"]] == [parked]
    before = database_state(db_url)
    for headers in ({}, {"X-CSRF-Token": "forged"}):
        refused = session.post(f"/api/v1/runs/{parked}/cancel", headers=headers)
        assert refused.status_code == 403 and refused.json()["error"]["type"] == "Forbidden"
        bulk = session.post("/api/v1/runs/cancel-many", json={"function_id": "parked"}, headers=headers)
        assert bulk.status_code == 403
    assert database_state(db_url) == before
    token = csrf_of(session)
    done = session.post(f"/api/v1/runs/{parked}/cancel", headers={"X-CSRF-Token": token})
    assert done.status_code == 200 and done.json()["status"] == "cancelled"
    # a bearer header always decides: a wrong key is refused even with a valid cookie
    wrong = session.get("/api/v1/runs", headers={"Authorization": "Bearer wrong"})
    assert wrong.status_code == 401
    assert shop.http.get("/api/v1/runs").status_code == 200  # bearer keys keep working


def test_logout_needs_the_token_and_ends_the_session(shop: Shop, session: httpx.Client) -> None:
    token = csrf_of(session)
    assert session.post("/logout", data={"csrf": "forged"}).status_code == 403
    assert session.get("/").status_code == 200
    stolen = session.cookies[COOKIE]
    response = session.post("/logout", data={"csrf": token})
    assert response.status_code == 303 and response.headers["location"] == "/login"
    assert f'{COOKIE}=""' in response.headers["set-cookie"]
    with httpx.Client(base_url=shop.live.url, headers={"Cookie": f"{COOKIE}={stolen}"}) as replayed:
        assert replayed.get("/").status_code == 303  # revoked, even if someone kept the cookie
        assert replayed.get("/api/v1/runs").status_code == 401


def test_sessions_expire_follow_key_rotation_and_resist_tampering() -> None:
    now = [1_000_000.0]
    keeper = SessionKeeper(AuthConfig(("new", "old")), ttl=60, clock=lambda: now[0])
    assert keeper.login("event-key") is None and keeper.login("") is None
    token = keeper.login("old")
    assert token is not None and keeper.read(token) is not None
    expires, nonce, mac = token.split(".")
    assert keeper.read(f"{int(expires) + 3600}.{nonce}.{mac}") is None  # extended expiry: bad MAC
    rotated = SessionKeeper(AuthConfig(("newer", "new")), clock=lambda: now[0])
    assert rotated.read(token) is not None  # signed with "new", still a listed key
    assert SessionKeeper(AuthConfig(("other",)), clock=lambda: now[0]).read(token) is None
    session = keeper.read(token)
    assert session is not None and keeper.check_csrf(session, session.csrf)
    assert not keeper.check_csrf(session, None) and not keeper.check_csrf(session, session.csrf[:-1])
    now[0] += 61
    assert keeper.read(token) is None


def test_an_open_server_needs_no_login(make_app: Callable[..., ss.App], serve: Callable[..., Live]) -> None:
    live = serve(make_app("open"), auth=AuthConfig.resolve(insecure=True, env={}))
    response = httpx.get(f"{live.url}/")
    assert response.status_code == 200 and "Sign out" not in response.text
    assert httpx.get(f"{live.url}/login").status_code == 303


def test_pages_show_runs_functions_events_workers_and_a_preview(shop: Shop, session: httpx.Client) -> None:
    failed = shop.wait(shop.run_of(shop.send("boom", {"order": "o-7"}, id="order-7"))["id"])
    shop.wait(shop.run_of(shop.send("hello", {"name": "ada"}))["id"])
    runs = session.get("/", params={"status": "failed"}).text
    assert failed["id"] in runs and 'data-count="failed">1<' in runs
    assert failed["id"] in session.get("/", params={"q": "O-7"}).text  # event data, any case
    assert failed["id"] not in session.get("/", params={"q": "nothing-like-it"}).text
    assert failed["id"] in session.get("/", params={"if": "event.data.order == 'o-7'"}).text
    assert "Condition:" in session.get("/", params={"if": "event.data =="}).text
    absurd = session.get("/", params={"since": "1e308"})
    assert absurd.status_code == 200 and "cannot be charted" in absurd.text
    page = session.get(f"/runs/{failed['id']}").text
    assert "kaboom" in page and "Traceback" in page and 'data-span="step:fragile:1"' in page
    assert "order-7" in page and 'data-action="replay"' in page
    assert session.get("/runs/nope").status_code == 404
    events = session.get("/events", params={"name": "boom"}).text
    assert "order-7" in events and failed["id"] in events
    workers = session.get("/workers").text
    assert "shop" in workers and "alive" in workers
    bulk = session.get("/bulk", params={"function_id": "flaky", "action": "replay-failed"}).text
    assert 'data-count="1"' in bulk and "Replay 1 run(s)" in bulk


def test_the_database_page_shows_rows_bytes_and_the_oldest_ended_run(
    shop: Shop, session: httpx.Client
) -> None:
    assert re.search(r"Oldest ended run:\s+none", session.get("/database").text)
    first = shop.wait(shop.run_of(shop.send("hello", {"name": "ada"}))["id"])
    shop.wait(shop.run_of(shop.send("hello", {"name": "bo"}))["id"])
    page = session.get("/database").text
    assert f'href="/runs/{first["id"]}"' in page and "completed" in page
    runs = re.search(
        r'<tr data-table="runs">.*?data-stat="rows">([\d,]+)<.*?data-stat="bytes">([^<]+)<', page
    )
    assert runs is not None and runs.group(1) == "2" and runs.group(2).endswith("KiB")
    assert '<tr data-table="steps">' in page and "the database takes" in page
    assert 'aria-current="page"' in page.split("Database</a>")[0].rsplit("<a", 1)[-1]


def test_the_runs_list_pages_with_a_cursor(shop: Shop, session: httpx.Client) -> None:
    shop.http.post("/api/v1/events", json=[{"name": "park", "data": {"i": i}} for i in range(55)])
    poll(
        lambda: (
            len(shop.http.get("/api/v1/runs", params={"function_id": "parked", "limit": 60}).json()["runs"])
            == 55
        ),
        what="55 runs",
    )
    first = session.get("/", params={"function_id": "parked"}).text
    assert first.count("data-run=") == 50
    older = re.search(r'href="(/\?[^"]*cursor=[^"]+)" rel="next"', first)
    assert older is not None
    second = session.get(older.group(1).replace("&amp;", "&")).text
    assert second.count("data-run=") == 5
    assert not set(re.findall(r'data-run="(\w+)"', first)) & set(re.findall(r'data-run="(\w+)"', second))


def test_the_waterfall_shows_retries_with_their_errors_and_sleeps(
    make_app: Callable[..., ss.App], serve: Callable[..., Live]
) -> None:
    app = make_app("retrying")
    attempts = {"n": 0}

    def shaky() -> str:
        attempts["n"] += 1
        if attempts["n"] == 1:
            raise RuntimeError("first attempt breaks")
        return "steady"

    @app.function(id="shaky", trigger=ss.on_event("shake"), retries=2, backoff=FAST)
    async def handler(ctx: ss.Context) -> str:
        await ctx.step.sleep("nap", "10ms")
        return str(await ctx.step.run("wobble", shaky))

    live = serve(app, workers=True)
    [event_id] = app.send(ss.Event("shake", {}))
    run = app.runs.wait(app.runs.list(event_id=event_id)[0].id, timeout="10s")
    assert run.status == "completed"
    client = sign_in(live.url)
    page = client.get(f"/runs/{run.id}").text
    client.close()
    assert 'data-span="sleep:nap:0"' in page
    failed_attempt = page.index('data-span="step:wobble:1"')
    assert 'class="t-retrying"' in page[failed_attempt : failed_attempt + 900]
    assert "first attempt breaks" in page[failed_attempt:]
    assert 'data-span="step:wobble:2"' in page and "wobble (attempt 2)" in page
    assert page.count('data-span="queued:') == 1


def test_the_functions_page_marks_retired_functions(
    make_app: Callable[..., ss.App], serve: Callable[..., Live]
) -> None:
    """A function the latest deploy of its app dropped is marked retired, beside
    the count of runs it still has queued."""
    for function_id in ("welcome-email", "welcome-email-v2"):  # two deploys of "mail"
        deploy: ss.App = make_app("mail")
        deploy.function(id=function_id, trigger=ss.on_event("user.created"))(lambda ctx: None)
        deploy.worker()
        deploy.send(ss.Event("user.created"))
    live = serve(make_app("server"))
    client = sign_in(live.url)
    try:
        page = client.get("/functions").text
    finally:
        client.close()
    cards = {card.split('"', 1)[0]: card for card in page.split('data-function="')[1:]}
    assert ">retired</span>" in cards["welcome-email"] and ">retired</span>" not in cards["welcome-email-v2"]
    assert 'data-stat="queued">1<' in cards["welcome-email"]
