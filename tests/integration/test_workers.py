"""Worker identity: the registry of live workers and the code version on each run."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

import pytest

import stepstone as ss

from ..conftest import send_and_wait


def test_runs_record_the_app_version_that_ran_them(make_app: Callable[..., ss.App]) -> None:
    app = make_app("versioned", app_version="2026.11.3")

    @app.function(id="f", trigger=ss.on_event("go"))
    def f(ctx: ss.Context) -> int:
        one: int = ctx.step.run("one", lambda: 1)
        return one

    app.start(instance_id="box-1", concurrency=3)
    run = send_and_wait(app, ss.Event("go"))
    assert run.status == "completed"
    row = app.store.read_sync(lambda tx: tx.get_run(run.id))
    assert row is not None and row.app_version == "2026.11.3"
    [worker] = app.workers.list()
    assert (worker.id, worker.app, worker.app_version, worker.concurrency, worker.functions) == (
        "box-1",
        "versioned",
        "2026.11.3",
        3,
        ["f"],
    )
    app.stop()
    assert app.workers.list() == []  # a stopped worker leaves the registry


def test_workers_sharing_an_instance_id_keep_their_own_leases(
    make_app: Callable[..., ss.App], caplog: pytest.LogCaptureFixture
) -> None:
    """Two workers started with the same --instance-id (a copy-pasted name):
    the one that stops cleanly gives back only its own leases, so the run the
    other is in the middle of is neither dropped nor run again."""
    app = make_app("twins")
    started, finish = threading.Event(), threading.Event()
    charges: list[int] = []

    @app.function(id="slow", trigger=ss.on_event("go"))
    def slow(ctx: ss.Context) -> str:
        def charge() -> None:
            charges.append(1)
            started.set()
            assert finish.wait(10)

        ctx.step.run("charge", charge)
        return "ok"

    async def scenario() -> ss.Run:
        first = await app.start_async(concurrency=1, instance_id="same")
        with caplog.at_level(logging.WARNING, logger="stepstone"):
            second = await app.start_async(concurrency=1, instance_id="same")
        [event_id] = await app.send_async(ss.Event("go"))
        assert await asyncio.to_thread(started.wait, 10)
        holder, idle = (first, second) if first.inflight else (second, first)
        await idle.stop(5)  # it releases its leases: none of them is the holder's
        finish.set()
        [run] = await app.runs.list_async(event_id=event_id)
        done = await app.runs.wait_async(run.id, timeout="10s")
        await holder.stop(5)
        return done

    run = asyncio.run(scenario())
    assert (run.status, run.output, len(charges)) == ("completed", "ok", 1)
    assert "another live worker has this instance id" in caplog.text
