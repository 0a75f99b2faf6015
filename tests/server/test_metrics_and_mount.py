"""/metrics in Prometheus text, workers and functions listings, and ss.asgi mounted
inside another application."""

from __future__ import annotations

import threading
from collections.abc import Callable

import httpx
import uvicorn
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families

import stepstone as ss
from tests.server.conftest import API_KEY, Live, Shop, free_port, poll


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_metrics_count_runs_and_steps_and_report_the_backlog(shop: Shop) -> None:
    def scrape() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        response = shop.http.get("/metrics")
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
        return samples(response.text)

    before = scrape()
    finished_key = ("stepstone_runs_finished_total", (("function", "greet"), ("status", "completed")))
    shop.wait(shop.run_of(shop.send("hello"))["id"])
    shop.http.post("/api/v1/events", json=[{"name": "park"}] * 3)
    after = scrape()
    assert after[finished_key] == before.get(finished_key, 0) + 1
    started_key = ("stepstone_runs_started_total", (("function", "greet"),))
    assert after[started_key] == before.get(started_key, 0) + 1
    steps_key = ("stepstone_step_duration_seconds_count", (("function", "greet"),))
    assert after[steps_key] == before.get(steps_key, 0) + 2
    assert after[("stepstone_queue_delay_seconds_count", (("function", "greet"),))] >= 1
    assert after[("stepstone_backlog", (("function", "parked"),))] == 3
    assert after[("stepstone_runs_active", (("function", "parked"), ("status", "queued")))] == 3
    assert after[("stepstone_backlog_oldest_seconds", (("function", "parked"),))] >= 0


def test_functions_and_workers_listings(shop: Shop) -> None:
    functions = {f["id"]: f for f in shop.http.get("/api/v1/functions").json()["functions"]}
    assert set(functions) == {"greet", "flaky", "parked"}
    assert functions["greet"]["triggers"] == [{"event": "hello", "if": None, "cron": None, "jitter": None}]
    assert functions["flaky"]["retries"] == 0 and functions["flaky"]["app"] == "shop"
    assert functions["parked"]["app"] == "elsewhere"
    assert functions["parked"]["config"]["concurrency"] == {"limit": 2, "key": None, "scope": "fn"}
    [worker] = shop.http.get("/api/v1/workers").json()["workers"]
    assert worker["app"] == "shop" and sorted(worker["functions"]) == ["flaky", "greet"]
    assert worker["concurrency"] == 4


def test_asgi_mounts_in_an_existing_application(make_app: Callable[..., ss.App]) -> None:
    app: ss.App = make_app("mounted")
    app.function(id="noop", trigger=ss.on_event("tick"))(lambda ctx: "ok")
    host = FastAPI()

    @host.get("/own")
    def own() -> dict[str, str]:
        return {"owner": "host"}

    host.mount("/stepstone", ss.asgi(app, api_key="mount-key"))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(host, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        poll(lambda: server.started, what="the host app")
        base = f"http://127.0.0.1:{port}"
        auth = {"Authorization": "Bearer mount-key"}
        assert httpx.get(f"{base}/own").json() == {"owner": "host"}
        [event_id] = httpx.post(
            f"{base}/stepstone/api/v1/events", json={"name": "tick"}, headers=auth
        ).json()["ids"]
        [run] = httpx.get(
            f"{base}/stepstone/api/v1/runs", params={"event_id": event_id}, headers=auth
        ).json()["runs"]
        assert run["function_id"] == "noop"
        assert (
            httpx.get(f"{base}/stepstone/api/v1/runs", headers={"Authorization": "Bearer x"}).status_code
            == 401
        )
        # bulk jobs work without the mounted app's lifespan
        job = httpx.post(
            f"{base}/stepstone/api/v1/runs/cancel-many", json={"function_id": "noop"}, headers=auth
        ).json()
        done = poll(
            lambda: (
                (j := httpx.get(f"{base}/stepstone/api/v1/jobs/{job['id']}", headers=auth).json())["status"]
                == "completed"
                and j
            ),
            what="the job",
        )
        assert done["done"] == 1
    finally:
        server.should_exit = True
        thread.join(timeout=30)
    assert not thread.is_alive()


def test_retired_functions_are_listed_as_retired(
    make_app: Callable[..., ss.App], serve: Callable[..., Live]
) -> None:
    """Issue 12 defect 8: operators see which functions a deploy dropped, over
    HTTP and through ``ss.Client`` (the CLI's ``stepstone functions --url``)."""
    for function_id in ("welcome-email", "welcome-email-v2"):  # two deploys of "mail"
        deploy: ss.App = make_app("mail")
        deploy.function(id=function_id, trigger=ss.on_event("user.created"))(lambda ctx: None)
        deploy.worker()
    live = serve(make_app("server"))
    listed = {f["id"]: f for f in live.http.get("/api/v1/functions").json()["functions"]}
    assert listed["welcome-email"]["retired"] is True and listed["welcome-email"]["retired_at"]
    assert listed["welcome-email-v2"]["retired"] is False and listed["welcome-email-v2"]["retired_at"] is None
    with ss.Client(live.url, api_key=API_KEY) as client:
        remote = {f.id: f.retired_at for f in client.functions.list()}
    assert remote["welcome-email"] is not None and remote["welcome-email-v2"] is None
