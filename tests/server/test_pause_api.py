"""Paused runs over real HTTP, ``ss.Client`` and the CLI (issue 13, points 4-5):
listed and filtered by status and app version, their divergence in the trace,
resumed one by one and in bulk; resuming a run that is not paused is a 409."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import stepstone as ss
from tests.acceptance.test_cli import cli
from tests.integration.test_pause_resume import Ledger, _waiting_runs, v2_new_step
from tests.server.conftest import API_KEY, Live, poll
from tests.server.test_metrics_and_mount import samples


def _pauses(live: Live, run_id: str) -> int:
    spans = live.http.get(f"/api/v1/runs/{run_id}/trace").json()["spans"]
    return sum(1 for s in spans if s["kind"] == "warning" and s["name"] == "paused")


def _paused(live: Live, run_id: str, times: int) -> None:
    def done() -> bool:
        status = live.http.get(f"/api/v1/runs/{run_id}").json()["status"]
        return status == "paused" and _pauses(live, run_id) == times

    poll(done, what=f"run {run_id} paused {times} time(s)")


def _ids(response: Any) -> set[str]:
    assert response.status_code == 200, response.text
    return {r["id"] for r in response.json()["runs"]}


def test_paused_runs_over_http_the_client_and_the_cli(
    make_app: Callable[..., ss.App], db_url: str, serve: Callable[..., Live]
) -> None:
    ledger: Ledger = []
    first, second = _waiting_runs(make_app, ledger, count=2)
    broken = make_app("shop", app_version="v2", on_nondeterminism="pause")

    @broken.function(id="order", trigger=ss.on_event("order"), retries=0)
    def order(ctx: ss.Context) -> str:
        return v2_new_step(ctx, ledger)

    live = serve(broken, workers=True)
    assert live.http.post("/api/v1/events", json={"name": "go-on"}).status_code == 200
    for run_id in (first, second):
        _paused(live, run_id, 1)
    get = live.http.get
    assert _ids(get("/api/v1/runs", params={"status": "paused"})) == {first, second}
    assert _ids(get("/api/v1/runs", params={"app_version": "v2"})) == {first, second}
    assert _ids(get("/api/v1/runs", params={"app_version": "v1"})) == set()
    assert get("/api/v1/stats/runs", params={"function_id": "order"}).json()["counts"]["paused"] == 2
    gauge = ("stepstone_runs_active", (("function", "order"), ("status", "paused")))
    assert samples(get("/metrics").text)[gauge] == 2
    shown = get(f"/api/v1/runs/{first}").json()
    assert shown["app_version"] == "v2" and shown["ended_at"] is None
    [detail] = [
        s["detail"] for s in get(f"/api/v1/runs/{first}/trace").json()["spans"] if s["name"] == "paused"
    ]
    assert detail == {"reason": "new-step", "step_id": "audit", "missing": ["hold"]}

    assert live.http.post(f"/api/v1/runs/{second}/cancel").json()["status"] == "cancelled"
    refused = live.http.post(f"/api/v1/runs/{second}/resume")
    assert refused.status_code == 409 and "only paused runs resume" in refused.text
    assert live.http.post(f"/api/v1/runs/{first}/resume").status_code == 200
    _paused(live, first, 2)  # the served code still diverges

    with ss.Client(live.url, api_key=API_KEY) as client:
        assert [r.id for r in client.runs.list(status="paused", app_version="v2")] == [first]
        assert client.runs.get(first).app_version == "v2"
        assert client.runs.resume_many(function_id="order") == 1
        _paused(live, first, 3)
        client.runs.resume(first)
        _paused(live, first, 4)

    listed = json.loads(
        cli(db_url, "runs", "list", "--status", "paused", "--app-version", "v2", "--json").stdout
    )
    assert [(r["id"], r["app_version"]) for r in listed] == [(first, "v2")]
    assert "resuming" in cli(db_url, "runs", "resume", first).stdout
    _paused(live, first, 5)
    assert "resume: 1 run(s)" in cli(db_url, "runs", "resume-many", "--function", "order").stdout
    _paused(live, first, 6)
    assert "only paused runs resume" in cli(db_url, "runs", "resume", second, ok=False).stderr
    assert ledger == ["charge", "charge"]  # the inserted step never ran, however often resumed
