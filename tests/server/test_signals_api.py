"""Signals over real HTTP (both stores): `POST /api/v1/runs/{run_id}/signals`,
`ss.Client.runs.signal`, and the `stepstone runs signal` command (a real
process) against the server and against the database."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import stepstone as ss
from stepstone import limits

from .conftest import API_KEY, Live, poll

STEPSTONE = str(Path(sys.executable).parent / "stepstone")


def collector(make_app: Callable[..., ss.App]) -> ss.App:
    app = make_app("mailroom")

    @app.function(id="collect", trigger=ss.on_event("collect"))
    async def collect(ctx: ss.Context) -> Any:
        return [await ctx.step.wait_for_signal(f"take:{i}", "parcel", timeout="30s") for i in range(3)]

    return app


def started(live: Live) -> str:
    response = live.http.post("/api/v1/events", json={"name": "collect"})
    [event_id] = response.json()["ids"]
    runs = poll(lambda: live.http.get("/api/v1/runs", params={"event_id": event_id}).json()["runs"])
    return str(runs[0]["id"])


def cli(*args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [STEPSTONE, *args], capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"}
    )
    assert (result.returncode == 0) == ok, result.stdout + result.stderr
    return result


def test_signals_over_http_the_client_and_the_cli_reach_the_run_in_order(
    make_app: Callable[..., ss.App], serve: Callable[..., Live], db_url: str
) -> None:
    app = collector(make_app)
    live = serve(app)
    run_id = started(live)
    sent = live.http.post(f"/api/v1/runs/{run_id}/signals", json={"name": "parcel", "data": {"n": 1}})
    assert sent.status_code == 200, sent.text
    assert sent.json()["run_id"] == run_id and sent.json()["name"] == "parcel" and sent.json()["id"]
    with ss.Client(live.url, api_key=API_KEY) as remote:
        assert remote.runs.signal(run_id, "parcel", [2])
    signal_id = cli(
        "runs", "signal", run_id, "parcel", "--data", '"three"', "--url", live.url, "--api-key", API_KEY
    )
    assert signal_id.stdout.strip()
    app.start()
    run = app.runs.wait(run_id)
    assert run.output == [{"n": 1}, [2], "three"]
    # Ended: 409 over HTTP, InvalidStateError from the client, an error from the CLI.
    late = live.http.post(f"/api/v1/runs/{run_id}/signals", json={"name": "parcel"})
    assert late.status_code == 409 and late.json()["error"]["type"] == "InvalidStateError"
    with ss.Client(live.url, api_key=API_KEY) as remote, pytest.raises(ss.InvalidStateError):
        remote.runs.signal(run_id, "parcel")
    refused = cli("runs", "signal", run_id, "parcel", "--database-url", db_url, ok=False)
    assert "InvalidStateError" in refused.stderr


def test_bad_signal_requests_get_clear_4xx_and_store_nothing(
    make_app: Callable[..., ss.App], serve: Callable[..., Live]
) -> None:
    app = collector(make_app)
    live = serve(app)
    run_id = started(live)
    path = f"/api/v1/runs/{run_id}/signals"
    for body, field in (({}, "name"), ({"name": ""}, "name"), ({"name": 7}, "name")):
        response = live.http.post(path, json=body)
        assert response.status_code == 422, response.text
        assert response.json()["error"]["field"] == field, response.text
    assert live.http.post("/api/v1/runs/nope/signals", json={"name": "parcel"}).status_code == 404
    deep: Any = 1
    for _ in range(70):
        deep = [deep]
    assert live.http.post(path, json={"name": "parcel", "data": deep}).status_code == 422
    big = {"name": "parcel", "data": "x" * (limits.MAX_EVENT_BYTES + 1)}
    assert live.http.post(path, json=big).status_code == 413
    unkeyed = live.http.post(path, json={"name": "parcel"}, headers={"Authorization": "Bearer wrong"})
    assert unkeyed.status_code == 401
    assert app.store.read_sync(lambda tx: tx.run_signals(run_id)) == []
    bad_json = cli("runs", "signal", run_id, "parcel", "--data", "{nope", "--url", live.url, ok=False)
    assert "--data is not JSON" in bad_json.stderr
