"""Bulk cancel / replay as background jobs with progress; interrupted jobs are visible."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest

import stepstone as ss
from stepstone.server.jobs import CANCEL_MANY, BulkRequest, JobRunner
from stepstone.store.base import Tx
from stepstone.store.viewrows import JobRow, JobStatus
from tests.server.conftest import Live, Shop, poll


def finished_job(shop: Shop, job_id: str) -> dict[str, Any]:
    def done() -> Any:
        job = shop.http.get(f"/api/v1/jobs/{job_id}").json()
        return job if job["status"] not in ("queued", "running") else None

    return dict(poll(done, what=f"job {job_id}"))


def test_cancel_many_runs_as_a_job_and_reports_counts(shop: Shop) -> None:
    shop.http.post(
        "/api/v1/events", json=[{"name": "park", "data": {"tenant": t}} for t in ["a", "b", "a", "a", "b"]]
    )
    started = shop.http.post(
        "/api/v1/runs/cancel-many", json={"function_id": "parked", "if": "event.data.tenant == 'a'"}
    )
    assert started.status_code == 202, started.text
    job = started.json()
    assert job["kind"] == "cancel_many" and job["params"]["function_id"] == "parked"
    assert job["params"]["if"] == "event.data.tenant == 'a'"
    done = finished_job(shop, job["id"])
    assert (done["status"], done["done"], done["examined"]) == ("completed", 3, 5)
    assert done["finished_at"] is not None and done["error"] is None
    statuses = [
        r["status"] for r in shop.http.get("/api/v1/runs", params={"function_id": "parked"}).json()["runs"]
    ]
    assert sorted(statuses) == ["cancelled"] * 3 + ["queued"] * 2
    listed = shop.http.get("/api/v1/jobs").json()["jobs"]
    assert listed[0]["id"] == job["id"]


def test_replay_many_replays_failed_runs_in_range(shop: Shop) -> None:
    failed = [shop.wait(shop.run_of(shop.send("boom"))["id"]) for _ in range(3)]
    assert {r["status"] for r in failed} == {"failed"}
    shop.switches["broken"] = False
    started = shop.http.post(
        "/api/v1/runs/replay-many",
        json={"function_id": "flaky", "status": ["failed"], "since": failed[1]["created_at"]},
    )
    assert started.status_code == 202, started.text
    done = finished_job(shop, started.json()["id"])
    assert (done["status"], done["done"]) == ("completed", 2)
    assert shop.wait(failed[2]["id"], ("completed",))["output"] == "fixed"
    assert shop.wait(failed[1]["id"], ("completed",))["output"] == "fixed"
    assert shop.http.get(f"/api/v1/runs/{failed[0]['id']}").json()["status"] == "failed"


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/api/v1/runs/cancel-many", {"function_id": "parked", "if": "event.data.x =="}, "if"),
        ("/api/v1/runs/cancel-many", {"function_id": "parked", "if": "nothing.here == 1"}, "if"),
        ("/api/v1/runs/cancel-many", {"function_id": "ghost"}, "function_id"),
        ("/api/v1/runs/cancel-many", {}, "function_id"),
        ("/api/v1/runs/cancel-many", {"function_id": "parked", "since": "soon"}, "since"),
        ("/api/v1/runs/cancel-many", {"function_id": "parked", "since": 20, "until": 10}, "since"),
        ("/api/v1/runs/replay-many", {"function_id": "flaky", "status": ["completed"]}, "status[0]"),
        ("/api/v1/runs/replay-many", {"function_id": "flaky", "status": []}, "status"),
    ],
)
def test_bad_bulk_requests_are_422_and_start_no_job(
    shop: Shop, path: str, body: dict[str, Any], field: str
) -> None:
    shop.send("park")
    response = shop.http.post(path, json=body)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == field
    assert shop.http.get("/api/v1/jobs").json()["jobs"] == []
    assert [
        r["status"] for r in shop.http.get("/api/v1/runs", params={"function_id": "parked"}).json()["runs"]
    ] == ["queued"]


def test_unknown_job_is_404(shop: Shop) -> None:
    response = shop.http.get("/api/v1/jobs/nope")
    assert response.status_code == 404 and response.json()["error"]["type"] == "NotFoundError"


def test_a_job_whose_server_died_shows_as_interrupted(serve: Callable[..., Live], db_url: str) -> None:
    app = ss.App("jobs", database_url=db_url)
    long_ago = app.clock.now() - 3600
    orphan = JobRow(
        id="01ORPHAN",
        kind="cancel_many",
        status=JobStatus.RUNNING,
        params=json.dumps({}),
        created_at=long_ago,
        updated_at=long_ago,
        done=40,
        examined=50,
        owner="dead-host-1",
    )

    def insert(tx: Tx) -> None:
        tx.create_job(orphan)

    app.store.transact_sync(insert)
    live: Live = serve(app)  # a fresh server (a restart, as far as the job is concerned)
    job = live.http.get("/api/v1/jobs/01ORPHAN").json()
    assert job["status"] == "interrupted" and "its server stopped" in job["error"]
    assert (job["done"], job["examined"]) == (40, 50) and job["finished_at"] is not None
    app.close()


def test_a_server_shutting_down_marks_its_jobs_interrupted(make_app: Callable[..., ss.App]) -> None:
    app: ss.App = make_app("shutdown")
    app.function(id="f", trigger=ss.on_event("go"))(lambda ctx: None)
    app.send([ss.Event("go") for _ in range(5)])

    async def scenario() -> str:
        runner = JobRunner(app)
        job = await runner.start(BulkRequest(CANCEL_MANY, "f"))
        await runner.shutdown()  # before the job's task ran a single page
        row = await app.store.read(lambda tx: tx.get_job(job.id))
        assert row is not None
        return row.status

    assert asyncio.run(scenario()) == "interrupted"
    assert {r.status for r in app.runs.list(function_id="f")} == {"queued"}
