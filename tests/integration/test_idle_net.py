"""An idle worker's net: it looks for due work at least every
``max_idle_sleep`` (one second) even when nothing wakes it, as the README
promises. On PostgreSQL the wake-up of another process's commit is its
``NOTIFY``; a write that notifies no one (as a lost notification would
leave it) must still be found by the net, not only at the next due time the
worker knew of. (On SQLite the worker polls the file's change token, so the
same write is seen sooner: the test holds there too.)"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import stepstone as ss
from tests.conftest import query, run_of
from tests.polling import wait_for


def test_work_made_due_without_a_wake_up_is_leased_within_the_idle_net(
    make_app: Callable[..., ss.App], db_url: str
) -> None:
    app = make_app("net")
    attempts: list[float] = []
    failed_once, retried = threading.Event(), threading.Event()

    def flaky() -> str:
        attempts.append(time.monotonic())
        if len(attempts) == 1:
            failed_once.set()
            raise RuntimeError("first attempt fails; the retry is due in an hour")
        retried.set()
        return "ok"

    @app.function(id="f", trigger=ss.on_event("go"), retries=1, backoff=ss.Backoff(initial="1h", jitter=0))
    def f(ctx: ss.Context) -> str:
        return str(ctx.step.run("flaky", flaky))

    app.start(concurrency=2)
    [worker] = app._local_workers
    idle: list[float] = []  # when the worker's idle wait began, with no run in flight
    worker.on_idle = lambda: idle.append(time.monotonic())
    try:
        [event_id] = app.send(ss.Event("go"))
        run_id = run_of(app, event_id).id
        assert failed_once.wait(10), "the first attempt never ran"
        # Parked for its retry an hour from now: the worker's next due time.
        wait_for(
            lambda: query(db_url, f"SELECT owner FROM queue WHERE run_id = '{run_id}'") == [(None,)],
            10,
            "the run parked for its retry",
        )
        parked = time.monotonic()
        wait_for(lambda: bool(idle) and idle[-1] > parked, 5, "the worker idle after the park")
        made_due = time.monotonic()
        now = time.time()
        # What the engine writes when it makes a run due (the retry's time, its
        # queue item, its partition's hint), without the wake-up it would send.
        assert query(
            db_url, f"UPDATE steps SET wake_at = {now} WHERE run_id = '{run_id}' RETURNING run_id"
        ) == [(run_id,)]
        due = f"available_at = {now}, sort_at = {now} WHERE run_id = '{run_id}'"
        assert query(db_url, f"UPDATE queue SET {due} RETURNING run_id") == [(run_id,)]
        hint = f"next_at = {now} WHERE key = (SELECT partition_key FROM queue WHERE run_id = '{run_id}')"
        assert len(query(db_url, f"UPDATE partitions SET {hint} RETURNING key")) == 1
        # Nothing else may wake the worker meanwhile (a runs.wait would): wait
        # on the step itself, well past the net (1 s) and far short of the
        # partition's next recheck the worker knew of (its lease TTL, 15 s).
        assert retried.wait(4.0), "the due retry was not leased within the idle net"
        assert attempts[1] - made_due < 4.0
        done = app.runs.wait(run_id, timeout="10s")
        assert (done.status, done.output) == ("completed", "ok")
    finally:
        app.stop()
