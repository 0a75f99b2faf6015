"""Who a PostgreSQL commit wakes in other processes (``NOTIFY stepstone_work``):
an operation that made work available notifies, unless it took that work
itself (a send's direct start: ``Tx.taken_here``), since another process's
worker woken for it would only lease in vain (and this process's listener
would read the echo: ~0.15 ms of CPU per sequential run). In a group commit
the other operations still notify for their own work, in either order.

A notification's absence is observed without waiting: after the write, the
test sends its own marker notification; notifications arrive in commit
order, so whatever arrives before the marker came from the write."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

import stepstone as ss
from stepstone.ids import new_id
from stepstone.store.postgres import CHANNEL, PostgresStore
from stepstone.store.rows import LeaseTerms, NewRun
from tests.conftest import run_of
from tests.polling import wait_for

MARKER = "marker"


@pytest.fixture
def heard(pg_url: str) -> Iterator[Callable[[], list[str]]]:
    """``heard()``: the notifications on the channel since the last call (up to a marker it sends)."""
    with (
        psycopg.connect(pg_url, autocommit=True) as listener,
        psycopg.connect(pg_url, autocommit=True) as other,
    ):
        listener.execute(f"LISTEN {CHANNEL}")

        def drain() -> list[str]:
            other.execute(f"NOTIFY {CHANNEL}, '{MARKER}'")
            got: list[str] = []
            for note in listener.notifies(timeout=10):
                if note.payload == MARKER:
                    return got
                got.append(note.payload)
            raise AssertionError("the marker never came")

        drain()
        yield drain


def _wakes(tx: Any) -> None:
    tx.wake_run("nobody", 1.0)  # a statement of WAKE_QUERIES (it changes no row here)


def _queues(taken: bool) -> Callable[[Any], None]:
    """A send's direct start of one run, its take reading nothing before the
    ``COMMIT``: taken, or left queued (as when a due item waits before it)."""

    def op(tx: Any) -> None:
        run = NewRun(
            id=new_id(1.0), function_id="f", event_seqs=[], event_ids=[], available_at=1.0, created_at=1.0
        )
        tx.create_run(run)
        if taken:
            tx.take_many(LeaseTerms(owner="w", now=1.0, until=61.0), [run.id], accumulators=False, new=True)
        tx.taken_here([run.id])

    return op


_wakes_and_takes = _queues(True)


@pytest.mark.parametrize(
    ("ops", "notified"),
    [
        ([_wakes], True),
        ([_wakes_and_takes], False),
        ([_queues(False)], True),
        ([_wakes_and_takes, _queues(True)], False),
        ([_wakes_and_takes, _wakes], True),
        ([_wakes, _wakes_and_takes], True),
        ([_queues(False), _wakes_and_takes], True),
    ],
)
def test_a_commit_notifies_for_the_work_it_made_available_and_did_not_take(
    pg_url: str, heard: Callable[[], list[str]], ops: list[Callable[[Any], None]], notified: bool
) -> None:
    store = PostgresStore.from_url(pg_url)
    conn = store._connect_writer()
    woken: list[bool] = []
    store._listener.wake_local = lambda: woken.append(True)  # type: ignore[method-assign]
    try:
        assert all(ok for ok, _ in store._write(conn, list(ops)))
        assert heard() == ([""] if notified else [])
        assert woken == ([True] if notified else [])  # this process's workers, the same
    finally:
        conn.close()
        store.close()


def test_a_send_that_starts_its_run_here_notifies_no_one_and_one_that_queues_it_does(
    pg_url: str, heard: Callable[[], list[str]]
) -> None:
    app = ss.App("notify", database_url=pg_url)
    gate = threading.Event()  # the runs end (and notify) only once the test has heard
    try:

        @app.function(id="one", trigger=ss.on_event("go"))
        async def one(ctx: ss.Context) -> int:
            done: int = await ctx.step.run("a", lambda: int(gate.wait(10)))
            return done

        [queued] = app.send(ss.Event("go", id="q"))  # no worker yet: queued for any process's
        assert heard() == [""]
        app.send(ss.Event("go", id="q"))  # a duplicate: nothing queued, no one woken
        assert heard() == []
        app.start(concurrency=2)
        wait_for(lambda: app.runs.get(run_of(app, queued).id).status == "running", 10, "its lease")
        heard()
        [direct] = app.send(ss.Event("go"))
        assert heard() == []
        gate.set()
        for event_id in (queued, direct):
            assert app.runs.wait(run_of(app, event_id).id, timeout="10s").status == "completed"
    finally:
        app.close()
