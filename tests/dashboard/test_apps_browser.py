"""The dashboard's Apps page in headless Chromium, against a live server with a
signing key and a real uvicorn endpoint serving ``ss.serve(app)``: a URL added
in the form is synced (its functions and last sync appear), a bad URL is
refused beside the field, and a Sync of an endpoint that went away shows the
failure on the app's row; Unregister (after a confirmation) retires its
functions. The page's actions are the JSON API under the
session's CSRF token: without the token, nothing is registered."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from playwright.sync_api import Page, expect

import stepstone as ss
from stepstone.signing import SigningKeys
from tests.dashboard.conftest import screenshot
from tests.dashboard.conftest import sign_in as session_client
from tests.dashboard.test_browser import assert_accessible_forms, confirm
from tests.server.conftest import API_KEY, Live
from tests.server.endpoints import KEY, Asgi, Endpoint, serving

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


@pytest.fixture
def server(serve: Callable[..., Live], make_app: Callable[..., ss.App]) -> Live:
    return serve(make_app("server"), signing=SigningKeys.of(KEY))


def open_apps_page(page: Page, live: Live) -> None:
    page.goto(live.url + "/apps")
    expect(page).to_have_url(re.compile(r"/login\?next="))
    page.get_by_label("API key").fill(API_KEY)
    page.get_by_role("button", name="Sign in").click()
    expect(page).to_have_url(live.url + "/apps")


def test_add_an_app_by_url_and_see_its_functions_and_sync_failures(
    page: Page, server: Live, endpoint: Callable[[Asgi], Endpoint]
) -> None:
    served_at = endpoint(serving("charge", "ship"))
    open_apps_page(page, server)
    assert_accessible_forms(page)
    expect(page.get_by_role("link", name="Apps")).to_have_attribute("aria-current", "page")
    expect(page.locator("table.apps")).to_contain_text("No app is registered")
    field, status = page.get_by_label("Endpoint URL"), page.locator("#app-status")
    add = page.get_by_role("button", name="Add and sync")

    field.fill("ftp://nowhere/x")
    add.click()
    expect(status).to_contain_text("url")
    expect(field).to_have_attribute("aria-invalid", "true")

    field.fill(served_at.url)
    add.click()
    row = page.locator(f'tr[data-app="{served_at.url}"]')
    expect(row).to_contain_text("store-front")
    expect(row.locator("td.functions")).to_have_text("charge, ship")
    expect(row.locator("td.synced")).to_contain_text(re.compile(r"\d\d:\d\d"))
    expect(row.locator("td.error")).to_have_text("—")
    assert [a["url"] for a in server.http.get("/api/v1/apps").json()["apps"]] == [served_at.url]
    screenshot(page, "apps-synced")

    served_at.stop()
    row.get_by_role("button", name="Sync").click()
    expect(page.locator(f'tr[data-app="{served_at.url}"] td.error')).to_contain_text("cannot reach")
    expect(page.locator(f'tr[data-app="{served_at.url}"] td.functions')).to_have_text("charge, ship")
    screenshot(page, "apps-sync-failed")

    page.locator(f'tr[data-app="{served_at.url}"]').get_by_role("button", name="Unregister").click()
    confirm(page)
    expect(page.locator("table.apps")).to_contain_text("No app is registered")
    assert server.http.get("/api/v1/apps").json()["apps"] == []
    assert {f["retired"] for f in server.http.get("/api/v1/functions").json()["functions"]} == {True}


def test_adding_an_app_without_the_csrf_token_registers_nothing(
    server: Live, endpoint: Callable[[Asgi], Endpoint]
) -> None:
    client = session_client(server.url)
    try:
        response = client.post("/api/v1/apps", json={"url": endpoint(serving("charge")).url})
        assert response.status_code == 403
        assert server.http.get("/api/v1/apps").json()["apps"] == []
        assert server.http.get("/api/v1/functions").json()["functions"] == []
    finally:
        client.close()
