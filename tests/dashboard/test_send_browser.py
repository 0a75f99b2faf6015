"""Sending a test event from the dashboard (issue 20), in headless Chromium
against a live server with workers: the form checks the JSON before sending and
shows the server's own refusal; a recent event can be re-sent; the send is the
JSON API called with the session's CSRF token, which a request without it does
not get past."""

from __future__ import annotations

import re

import httpx
from playwright.sync_api import Page, expect

from tests.dashboard.conftest import screenshot
from tests.dashboard.conftest import sign_in as session_client
from tests.dashboard.test_browser import assert_accessible_forms, sign_in
from tests.server.conftest import Shop, poll


def events_named(shop: Shop, name: str) -> list[dict[str, object]]:
    events: list[dict[str, object]] = shop.http.get("/api/v1/events", params={"name": name}).json()["events"]
    return events


def test_send_an_event_from_the_dashboard_and_resend_it(page: Page, shop: Shop) -> None:
    sign_in(page, shop, "/events")
    assert_accessible_forms(page)
    name, data, status = (
        page.get_by_label("Name", exact=True),
        page.get_by_label("Data (a JSON object)"),
        page.locator("#send-status"),
    )
    send = page.get_by_role("button", name="Send event")

    name.fill("hello")
    data.fill('{"name": ')  # not JSON: refused before anything is sent
    send.click()
    expect(status).to_contain_text("not valid JSON")
    expect(data).to_have_attribute("aria-invalid", "true")
    data.fill("[1, 2]")
    send.click()
    expect(status).to_contain_text("must be a JSON object")
    assert events_named(shop, "hello") == []

    name.fill("stepstone/function.failed")  # valid JSON, refused by the server
    data.fill("{}")
    send.click()
    expect(status).to_contain_text("reserved")
    assert events_named(shop, "stepstone/function.failed") == []

    name.fill("hello")
    data.fill('{"name": "zed"}')
    send.click()
    expect(status).to_contain_text("Sent hello: event ")
    [sent] = events_named(shop, "hello")
    run = shop.wait(shop.run_of(str(sent["id"]))["id"])
    assert run["output"] == "hi zed"
    screenshot(page, "send-event")

    page.reload()
    page.locator(f"tr[data-event='{sent['id']}']").get_by_role("button", name="Re-send").click()
    expect(name).to_have_value("hello")
    assert '"name": "zed"' in data.input_value()
    send.click()
    expect(status).to_contain_text("Sent hello: event ")
    again = poll(lambda: (e := events_named(shop, "hello")) and len(e) == 2 and e, what="the second event")
    assert again[0]["id"] != sent["id"] and again[0]["data"] == {"name": "zed"}


def test_sending_with_the_session_needs_the_csrf_token(shop: Shop) -> None:
    client = session_client(shop.live.url)
    refused = client.post("/api/v1/events", json={"name": "hello"})
    assert refused.status_code == 403 and "CSRF" in refused.text
    assert events_named(shop, "hello") == []
    page = client.get("/events").text
    assert 'id="send-event"' in page
    client.close()
    assert httpx.post(f"{shop.live.url}/api/v1/events", json={"name": "hello"}).status_code == 401


def test_invoke_a_function_from_its_page(page: Page, shop: Shop) -> None:
    sign_in(page, shop, "/functions")
    card = page.locator("section[data-function='greet']")
    card.get_by_text("Invoke…").click()
    assert_accessible_forms(page)
    data = card.get_by_label("Data for a run of greet (a JSON object)")
    invoke = card.get_by_role("button", name="Invoke greet")
    data.fill("not json")
    invoke.click()
    expect(card.locator("[role=status]")).to_contain_text("not valid JSON")
    data.fill('{"name": "ivy"}')
    invoke.click()
    expect(page).to_have_url(re.compile(r"/runs/\w+$"))
    run_id = page.url.rsplit("/", 1)[1]
    expect(page.locator(".run-head .badge").first).to_have_text("completed")
    run = shop.http.get(f"/api/v1/runs/{run_id}").json()
    assert run["function_id"] == "greet" and run["output"] == "hi ivy"
    screenshot(page, "invoked-run")
