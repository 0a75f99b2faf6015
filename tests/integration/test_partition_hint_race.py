"""A send never hides a concurrent send's due run behind its partition's hint
(PostgreSQL; SQLite has one writer at a time).

A send that starts its run directly used to settle its partition's hint
(``next_at``) to the earliest item its statement's snapshot saw, its own lease's
expiry at the latest. A run another process queued in the same partition and
committed while that statement waited for the partition's row lock is not in
that snapshot: the hint was raised over it, and every lease pass skipped the
partition until the hint came due, a lease TTL (15 s) later. A send now only
ever lowers the hint; the next lease pass over the partition (which reads its
items after locking it) raises it."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest

import stepstone as ss
from tests.polling import wait_for


@pytest.mark.parametrize(
    "options",
    [{}, {"idempotency": "event.id"}],
    ids=["written-taken", "taken-after"],  # (record_event_started; ingest then take_direct, settle_taken)
)
def test_a_direct_start_does_not_raise_its_partitions_hint_over_a_run_queued_meanwhile(
    pg_url: str, options: dict[str, Any]
) -> None:
    """Both ways a send starts its run directly: written taken (a function
    without flow rules: one statement, its snapshot taken before it waits
    for the row), or taken after its usual writes (a rule admission applies,
    here an idempotency key: its item's hint lowered first, which waits for
    the row, so the take's own snapshot already holds the run queued
    meanwhile and leaves the send's run queued behind it)."""
    app = ss.App("race", database_url=pg_url)

    @app.function(id="f", trigger=ss.on_event("go"), **options)
    def f(ctx: ss.Context) -> str:
        return "done"

    app.start(concurrency=4)
    sent: list[str] = []
    try:
        [warm] = app.send(ss.Event("go"))  # the partition's row exists
        assert app.runs.wait(app.runs.list(event_id=warm)[0].id, timeout="10s").status == "completed"
        with psycopg.connect(pg_url) as other, psycopg.connect(pg_url, autocommit=True) as watch:
            # Another process queues a run in the same partition and lowers its
            # hint, as a send without a local worker does; not committed yet.
            now = time.time()
            other.execute("SELECT key FROM partitions WHERE key = 'f' FOR UPDATE")
            [(event_ids, seq)] = other.execute(
                "SELECT r.event_ids, e.seq FROM runs r JOIN events e ON e.id = %s WHERE r.function_id = 'f'",
                (warm,),
            ).fetchall()
            other.execute(
                "INSERT INTO runs (id, function_id, status, event_ids, created_at)"
                " VALUES ('queued-elsewhere', 'f', 'queued', %s, %s)",
                (event_ids, now),
            )
            other.execute(
                "INSERT INTO run_events (run_id, position, event_seq) VALUES ('queued-elsewhere', 0, %s)",
                (seq,),
            )
            other.execute(
                "INSERT INTO queue (run_id, function_id, partition_key, available_at, sort_at)"
                " VALUES ('queued-elsewhere', 'f', 'f', %s, %s)",
                (now, now),
            )
            other.execute("UPDATE partitions SET next_at = %s WHERE key = 'f'", (now,))
            # This app's send starts its run directly; its statement waits for the row.
            sender = threading.Thread(target=lambda: sent.extend(app.send(ss.Event("go"))))
            sender.start()
            wait_for(
                lambda: bool(
                    watch.execute(
                        "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
                    ).fetchall()
                ),
                10,
                "the send waiting for the partition's row",
            )
            other.commit()
            sender.join(10)
            assert sent and not sender.is_alive()
            [(hint,)] = watch.execute("SELECT next_at FROM partitions WHERE key = 'f'").fetchall()
        assert hint is not None and hint <= now, (hint, now)  # not the send's lease expiry, 15 s on
        assert app.runs.wait(app.runs.list(event_id=sent[0])[0].id, timeout="10s").status == "completed"
        # Leased by the next pass over the partition (the idle net: within a second).
        done = app.runs.wait("queued-elsewhere", timeout="5s")
        assert (done.status, done.output) == ("completed", "done")
    finally:
        app.stop()
        app.close()
