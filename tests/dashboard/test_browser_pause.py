"""Paused runs in the dashboard, in headless Chromium (issue 13, points 4-5): an
operator filters the runs page by status and app version, reads why a run
paused on its page, resumes it (still broken code: it pauses again), then
bulk-resumes every paused run once the fix is deployed."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from playwright.sync_api import expect

import stepstone as ss
from tests.dashboard.conftest import screenshot
from tests.integration.test_pause_resume import Ledger, _waiting_runs, v2_new_step, v3_fixed
from tests.server.conftest import API_KEY, Live
from tests.server.test_pause_api import _paused


def _sign_in(page: Any, live: Live, path: str) -> None:
    page.goto(live.url + path)
    page.get_by_label("API key").fill(API_KEY)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("button", name="Sign out")).to_be_visible()


def _confirm(page: Any) -> None:
    dialog = page.locator("dialog#confirm")
    expect(dialog).to_be_visible()
    dialog.locator("#confirm-ok").click()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_resume_a_paused_run_and_bulk_resume(
    page: Any, make_app: Callable[..., ss.App], serve: Callable[..., Live]
) -> None:
    ledger: Ledger = []
    first, second = _waiting_runs(make_app, ledger, count=2)
    deployed = {"fixed": False}
    app = make_app("shop", app_version="v2", on_nondeterminism="pause")

    @app.function(id="order", trigger=ss.on_event("order"), retries=0)
    def order(ctx: ss.Context) -> str:
        return (v3_fixed if deployed["fixed"] else v2_new_step)(ctx, ledger)

    live = serve(app, workers=True)
    live.http.post("/api/v1/events", json={"name": "go-on"})
    for run_id in (first, second):
        _paused(live, run_id, 1)

    _sign_in(page, live, "/functions")
    expect(page.locator("[data-function='order'] [data-stat='paused']")).to_have_text("2")
    page.locator("[data-function='order'] [data-stat='paused'] a").click()
    expect(page).to_have_url(re.compile(r"status=paused"))
    rows = page.locator("tr[data-run]")
    expect(rows).to_have_count(2)
    expect(rows.first).to_contain_text("v2")
    page.get_by_label("App version").fill("v1")
    page.get_by_role("button", name="Apply").click()
    expect(page).to_have_url(re.compile(r"app_version=v1"))
    expect(page.locator("tr[data-run]")).to_have_count(0)

    page.goto(f"{live.url}/runs/{first}")
    divergence = page.locator("#divergence")
    expect(divergence).to_contain_text("new-step")
    expect(divergence).to_contain_text("audit")
    expect(divergence).to_contain_text("hold")
    screenshot(page, "run-paused")
    page.get_by_role("button", name="Resume").click()
    _confirm(page)
    expect(page.locator("details[data-span^='resume:']")).to_have_count(1)  # the page reloaded
    _paused(live, first, 2)  # the deployed code still diverges
    expect(page.locator(".run-head .badge").first).to_have_text("paused")

    deployed["fixed"] = True
    page.goto(f"{live.url}/bulk?action=resume&function_id=order&range=all")
    expect(page.locator("#preview-count")).to_have_text("2")
    page.get_by_role("button", name="Resume 2 run(s)").click()
    _confirm(page)
    expect(page.locator("#job-progress")).to_have_attribute("data-finished", "completed")
    for run_id in (first, second):
        assert app.runs.wait(run_id, timeout="15s").status == "completed"
    assert sorted(ledger) == sorted(["charge", "audit", "ship"] * 2)
