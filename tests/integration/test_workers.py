"""Worker identity: the registry of live workers and the code version on each run."""

from __future__ import annotations

from collections.abc import Callable

import stepstone as ss

from ..conftest import send_and_wait


def test_runs_record_the_app_version_that_ran_them(make_app: Callable[..., ss.App]) -> None:
    app = make_app("versioned", app_version="2026.11.3")

    @app.function(id="f", trigger=ss.on_event("go"))
    def f(ctx: ss.Context) -> int:
        return ctx.step.run("one", lambda: 1)

    app.start(instance_id="box-1", concurrency=3)
    run = send_and_wait(app, ss.Event("go"))
    assert run.status == "completed"
    row = app.store.read_sync(lambda tx: tx.get_run(run.id))
    assert row is not None and row.app_version == "2026.11.3"
    [worker] = app.workers.list()
    assert (worker.id, worker.app, worker.app_version, worker.concurrency, worker.functions) == (
        "box-1", "versioned", "2026.11.3", 3, ["f"])
    app.stop()
    assert app.workers.list() == []  # a stopped worker leaves the registry
