"""The dashboard in a real browser (headless Chromium through Playwright) against a
live server with workers: an operator signs in, finds a failed run, reads its
trace, fixes the bug and replays it; bulk-replays; cancels; sees new runs
appear without reloading. Screenshots of the main pages go to
artifacts/dashboard/."""

from __future__ import annotations

import json
import re

from playwright.sync_api import Page, expect

from stepstone.store.rows import SignalRow
from tests.dashboard.conftest import screenshot
from tests.dashboard.conftest import sign_in as sign_in_http
from tests.server.conftest import API_KEY, Shop, poll


def sign_in(page: Page, shop: Shop, path: str = "/") -> None:
    page.goto(shop.live.url + path)
    expect(page).to_have_url(re.compile(r"/login\?next="))
    page.get_by_label("API key").fill(API_KEY)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("button", name="Sign out")).to_be_visible()
    expect(page).to_have_url(shop.live.url + path)


def assert_accessible_forms(page: Page) -> None:
    """Every visible form control has a label; every image-like chart has a name."""
    unlabelled = page.evaluate("""() => [...document.querySelectorAll(
        'input:not([type=hidden]), select, textarea')].filter(e => e.labels.length === 0).map(e => e.outerHTML)""")
    assert unlabelled == []
    nameless = page.evaluate("""() => [...document.querySelectorAll('svg[role=img]')]
        .filter(e => !e.getAttribute('aria-label')).length""")
    assert nameless == 0


def confirm(page: Page) -> None:
    dialog = page.locator("dialog#confirm")
    expect(dialog).to_be_visible()
    dialog.locator("#confirm-ok").click()


def test_a_wrong_key_is_rejected(page: Page, shop: Shop) -> None:
    page.goto(shop.live.url + "/functions")
    page.get_by_label("API key").fill("not-the-key")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_contain_text("That key is not valid")
    assert page.context.cookies() == []
    screenshot(page, "login-rejected")
    page.get_by_label("API key").fill(API_KEY)
    page.get_by_role("button", name="Sign in").click()
    expect(page).to_have_url(shop.live.url + "/functions")  # back where the operator was going
    [cookie] = page.context.cookies()
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and API_KEY not in cookie["value"]


def test_find_a_failed_run_read_its_trace_fix_and_replay(page: Page, shop: Shop) -> None:
    shop.wait(shop.run_of(shop.send("hello", {"name": "ada"}))["id"])
    failed = shop.wait(shop.run_of(shop.send("boom", {"order": "o-42"}, id="order-42"))["id"])
    sign_in(page, shop)
    page.locator(".counts a.s-failed").click()
    expect(page.locator(".counts a.s-failed")).to_have_attribute("aria-current", "true")
    rows = page.locator("tr[data-run]")
    expect(rows).to_have_count(1)
    assert_accessible_forms(page)
    screenshot(page, "runs")
    rows.first.get_by_role("link").click()
    expect(page.get_by_role("heading", level=1)).to_contain_text(failed["id"])
    bar = page.locator("details[data-span='step:fragile:1']")
    bar.locator("summary").focus()
    page.keyboard.press("Enter")  # bars open from the keyboard too
    expect(bar).to_have_attribute("open", "")
    expect(bar.locator(".span-body")).to_contain_text("NonRetriableError")
    expect(bar.locator("pre.tb")).to_contain_text('raise ss.NonRetriableError("kaboom")')
    page.locator("details[data-span^='run:'] > summary").click()
    expect(page.locator("details[data-span^='run:'] .span-body")).to_contain_text('"order": "o-42"')
    expect(page.get_by_text("The event that started the run")).to_be_visible()
    screenshot(page, "run-failed")

    shop.switches["broken"] = False  # the bug is fixed and deployed
    page.get_by_role("button", name="Replay").click()
    confirm(page)
    expect(page.locator(".run-head .badge").first).to_have_text("completed")
    expect(page.locator("details[data-span^='replay:']")).to_have_count(1)
    expect(page.get_by_role("heading", name="Output")).to_be_visible()
    screenshot(page, "run-replayed")
    assert shop.http.get(f"/api/v1/runs/{failed['id']}").json()["output"] == "fixed"


def test_bulk_replay_previews_then_follows_the_job(page: Page, shop: Shop) -> None:
    shop.http.post("/api/v1/events", json=[{"name": "boom", "data": {"n": i}} for i in range(4)])
    poll(
        lambda: (
            shop.http.get("/api/v1/stats/runs", params={"function_id": "flaky"}).json()["counts"]["failed"]
            == 4
        ),
        what="four failed runs",
    )
    sign_in(page, shop, "/bulk")
    page.get_by_label("Function").select_option("flaky")
    page.get_by_role("button", name="Preview").click()
    expect(page.locator("#preview-count")).to_have_text("4")
    assert_accessible_forms(page)
    shop.switches["broken"] = False
    page.get_by_role("button", name="Replay 4 run(s)").click()
    confirm(page)
    expect(page.locator("#job-progress")).to_have_attribute("data-finished", "completed")
    expect(page.locator("#job-status")).to_contain_text("4 done of 4 examined")
    screenshot(page, "bulk")
    counts = poll(
        lambda: (
            (c := shop.http.get("/api/v1/stats/runs", params={"function_id": "flaky"}).json()["counts"])[
                "completed"
            ]
            == 4
            and c
        ),
        what="the replays to complete",
    )
    assert counts["failed"] == 0


def test_cancel_a_run_and_see_new_runs_appear_live(page: Page, shop: Shop) -> None:
    parked = shop.run_of(shop.send("park"))["id"]
    sign_in(page, shop)
    expect(page.locator(f"tr[data-run='{parked}']")).to_be_visible()
    newcomer = shop.run_of(shop.send("park", {"late": True}))["id"]
    expect(page.locator(f"tr[data-run='{newcomer}']")).to_be_visible()  # polled in, no reload
    page.locator(f"tr[data-run='{parked}'] a").click()
    page.get_by_role("button", name="Cancel run").click()
    expect(page.locator("dialog#confirm")).to_contain_text(parked)
    page.get_by_role("button", name="Go back").click()
    assert shop.http.get(f"/api/v1/runs/{parked}").json()["status"] == "queued"  # nothing happened
    page.get_by_role("button", name="Cancel run").click()
    confirm(page)
    expect(page.locator(".run-head .badge").first).to_have_text("cancelled")
    assert shop.http.get(f"/api/v1/runs/{parked}").json()["status"] == "cancelled"


def test_rerun_from_a_step_opens_the_new_run(page: Page, shop: Shop) -> None:
    done = shop.wait(shop.run_of(shop.send("hello", {"name": "bo"}))["id"])
    sign_in(page, shop, f"/runs/{done['id']}")
    page.get_by_label("Rerun from step").select_option("second")
    page.get_by_role("button", name="Rerun", exact=True).click()
    confirm(page)
    expect(page.get_by_text("Rerun of")).to_be_visible()
    new_id = page.url.rsplit("/", 1)[-1]
    assert new_id != done["id"]
    assert shop.wait(new_id)["output"] == "hi bo"


def test_send_a_signal_from_a_run_page(page: Page, shop: Shop) -> None:
    parked = shop.run_of(shop.send("park"))["id"]  # queued: the signal waits in its mailbox

    def signals() -> list[SignalRow]:
        return shop.app.store.read_sync(lambda tx: tx.run_signals(parked))

    # Without the session's CSRF token the same request is refused.
    cookie_only = sign_in_http(shop.live.url)
    try:
        refused = cookie_only.post(f"/api/v1/runs/{parked}/signals", json={"name": "approved"})
        assert refused.status_code == 403
    finally:
        cookie_only.close()
    sign_in(page, shop, f"/runs/{parked}")
    assert_accessible_forms(page)
    page.get_by_label("Signal name").fill("approved")
    page.get_by_label("Data (JSON)").fill("{nope")
    page.get_by_role("button", name="Send signal").click()
    expect(page.locator("#signal-status")).to_contain_text("not JSON")
    assert signals() == []
    page.get_by_label("Data (JSON)").fill('{"by": "ops"}')
    page.get_by_role("button", name="Send signal").click()
    expect(page.locator("#signal-status")).to_contain_text("Signal approved sent")
    [sent] = signals()
    assert (sent.name, json.loads(sent.data), sent.consumed_by) == ("approved", {"by": "ops"}, None)
    trace = shop.http.get(f"/api/v1/runs/{parked}/trace").json()["spans"]
    assert any(s["kind"] == "signal" and s["status"] == "sent" for s in trace)


def test_rerun_with_edited_event_data(page: Page, shop: Shop) -> None:
    done = shop.wait(shop.run_of(shop.send("hello", {"name": "bo"}))["id"])
    sign_in(page, shop, f"/runs/{done['id']}")
    page.get_by_label("Rerun from step").select_option("second")
    page.get_by_label("with event data").fill('{"name": ')
    page.get_by_role("button", name="Rerun", exact=True).click()
    confirm(page)
    expect(page.locator("#action-status")).to_contain_text("not JSON")
    assert len(shop.http.get("/api/v1/runs", params={"function_id": "greet"}).json()["runs"]) == 1
    page.get_by_label("with event data").fill('{"name": "al"}')
    page.get_by_role("button", name="Rerun", exact=True).click()
    confirm(page)
    expect(page.get_by_text("Rerun of")).to_be_visible()
    new_id = page.url.rsplit("/", 1)[-1]
    assert new_id != done["id"]
    assert shop.wait(new_id)["output"] == "hi al"


def test_functions_events_and_workers_pages(page: Page, shop: Shop) -> None:
    shop.wait(shop.run_of(shop.send("boom"))["id"])
    shop.send("park")
    sign_in(page, shop, "/functions")
    parked = page.locator("[data-function='parked']")
    expect(parked.locator("[data-stat='queued']")).to_have_text("1")
    expect(parked.locator("table.keys")).to_contain_text("fn:parked")
    expect(page.locator("[data-function='flaky'] [data-stat='failed']")).to_have_text("1")
    screenshot(page, "functions")
    page.get_by_role("link", name="Events").click()
    expect(page.locator("tr[data-event]").first).to_be_visible()
    expect(page.locator("table.events")).to_contain_text("stepstone/function.failed")
    screenshot(page, "events")
    page.get_by_role("link", name="Workers").click()
    expect(page.locator("tr[data-worker]")).to_have_count(1)
    expect(page.locator("tr[data-worker]")).to_contain_text("alive")
    screenshot(page, "workers")
    page.get_by_role("button", name="Sign out").click()
    expect(page.get_by_label("API key")).to_be_visible()
    page.goto(shop.live.url + "/")
    expect(page).to_have_url(re.compile(r"/login"))
