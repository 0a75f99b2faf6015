"""Dashboard fixtures: the live ``shop`` server (see tests/server/conftest.py), an
httpx client signed in through the login form, and headless Chromium driven by
Playwright (Debian's /usr/bin/chromium; never a downloaded browser)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

from tests.server.conftest import API_KEY, Shop, endpoint, serve, shop  # noqa: F401 - fixtures

if TYPE_CHECKING:  # Playwright is imported only where a browser test runs
    from playwright.sync_api import Browser, Page

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts" / "dashboard"


def sign_in(url: str, key: str = API_KEY) -> httpx.Client:
    """A client holding a dashboard session (the cookie), without a bearer header."""
    client = httpx.Client(base_url=url, follow_redirects=False, timeout=30)
    response = client.post("/login", data={"api_key": key, "next": "/"})
    assert response.status_code == 303, response.text
    return client


def csrf_of(client: httpx.Client, path: str = "/") -> str:
    page = client.get(path).text
    marker = '<meta name="csrf-token" content="'
    start = page.index(marker) + len(marker)
    return page[start : page.index('"', start)]


@pytest.fixture
def session(shop: Shop) -> Iterator[httpx.Client]:  # noqa: F811
    client = sign_in(shop.live.url)
    yield client
    client.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """One browser per module: Playwright's sync API holds an event loop on the main
    thread while it runs, which later tests that run their own loop must not meet."""
    if not os.path.exists(CHROMIUM):
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing (scripts/_services.sh installs it)")
        pytest.skip(f"{CHROMIUM} is missing; run ./scripts/test.sh to install it")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1366, "height": 900})
    context.set_default_timeout(10_000)
    tab = context.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    yield tab
    context.close()
    assert not errors, f"JavaScript errors: {errors}"


def screenshot(page: Page, name: str) -> None:
    """Keep a picture of the page as a test artifact (artifacts/ is git-ignored)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
