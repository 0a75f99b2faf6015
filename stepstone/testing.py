"""Test your workflows on a virtual clock.

``TestEnv`` points an app at a fresh temporary SQLite file and a virtual clock,
and executes runs in the foreground: a 7-day sleep or a long back-off
completes as soon as the test moves the clock (``advance``) or waits for the
run (``wait`` jumps the clock to each next due time). Events a run waits for
are sent with ``send``. Nothing runs in the background between calls::

    from stepstone.testing import TestEnv

    def test_trial_reminder():
        with TestEnv(app) as env:
            [run] = env.send(ss.Event("trial.started", {"user": "u1"}))
            assert env.get(run.id).status == "sleeping"        # sleeps 7 days
            run = env.wait(run.id)                             # ...done at once
            assert run.output == {"reminded": "u1"}
            assert [s.id for s in run.steps] == ["sleep-7d", "send-reminder"]
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from stepstone.app import App
from stepstone.bridge import Portal
from stepstone.durations import Duration, parse_duration
from stepstone.errors import RunTimeoutError
from stepstone.events import Event
from stepstone.runs import Run, Runs
from stepstone.store.base import Tx
from stepstone.store.rows import StepStatus
from stepstone.worker import Worker

__all__ = ["TestEnv", "VirtualClock"]


class VirtualClock:
    """A clock that moves only when told to."""

    def __init__(self, start: float | None = None) -> None:
        self.t = time.time() if start is None else start
        self._lock = threading.Lock()

    def now(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.t += seconds

    def move_to(self, moment: float) -> None:
        with self._lock:
            self.t = max(self.t, moment)


class TestEnv:
    """Run an app's functions on a temporary database and a virtual clock."""

    __test__ = False  # not a pytest test class

    def __init__(self, app: App, *, start: datetime | None = None, concurrency: int = 10) -> None:
        self.app = app
        self.clock = VirtualClock(None if start is None else start.timestamp())
        self._concurrency = concurrency
        self._folder = tempfile.mkdtemp(prefix="stepstone-test-")
        self._saved: tuple[Any, ...] | None = None
        self._portal: Portal | None = None
        self._worker: Worker | None = None

    # -- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> TestEnv:
        self._saved = self.app._rebind(self.database_url, self.clock)
        self._portal = Portal("stepstone-testenv")
        self._worker = self.app.worker(concurrency=self._concurrency, instance_id="testenv")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._portal is not None:
            self._portal.close()
        if self._worker is not None:
            self._worker.threads.shutdown(wait=False)
        if self._saved is not None:
            self.app._rebind(*self._saved)
        shutil.rmtree(self._folder, ignore_errors=True)

    @property
    def database_url(self) -> str:
        """The temporary database: create the tables your ``step.transaction``
        functions write in it (``sqlite3.connect(url.removeprefix("sqlite:///"))``)."""
        return f"sqlite:///{self._folder}/test.db"

    # -- time --------------------------------------------------------------------------------
    @property
    def now(self) -> datetime:
        return datetime.fromtimestamp(self.clock.now(), UTC)

    def advance(self, duration: Duration) -> None:
        """Move the clock forward, running everything that comes due on the way
        (in order: each sleep, back-off, cron tick and timeout at its own time)."""
        target = self.clock.now() + parse_duration(duration, field="duration")
        self.run_until_idle()
        while True:
            due = self._next_due()
            if due is None or due > target:
                break
            self.clock.move_to(due)
            self.run_until_idle()
        self.clock.move_to(target)
        self.run_until_idle()

    # -- running -------------------------------------------------------------------------------
    def run_until_idle(self) -> None:
        """Execute every run and duty due at the current virtual time."""
        assert self._worker is not None and self._portal is not None, "use TestEnv as a context manager"
        self._portal.call(self._worker.drain())

    def send(self, events: Event | Sequence[Event]) -> list[Run]:
        """Send events, run what is due now, and return the runs the events started."""
        ids = self.app.send(events)
        self.run_until_idle()
        runs: list[Run] = []
        for event_id in ids:
            runs.extend(reversed(self.app.runs.list(event_id=event_id)))
        return runs

    def get(self, run_id: str) -> Run:
        return self.app.runs.get(run_id)

    def wait(self, run_id: str, timeout: Duration = "400d") -> Run:
        """Move the clock from due time to due time until the run ends.

        Raises ``RunTimeoutError`` if it would take longer than ``timeout`` of
        virtual time, or if nothing is scheduled while the run still waits (it
        needs an event: ``send`` it)."""
        limit = self.clock.now() + parse_duration(timeout, field="timeout")
        while True:
            self.run_until_idle()
            run = self.app.runs.get(run_id)
            if run.ended:
                return run
            due = self._next_due()
            if due is None:
                waiting = [s.id for s in run.steps if s.status == StepStatus.WAITING]
                raise RunTimeoutError(
                    f"run {run_id} is {run.status} and nothing is scheduled"
                    + (f"; steps {waiting} wait for an event: send it" if waiting else "")
                )
            if due > limit:
                raise RunTimeoutError(f"run {run_id} still {run.status} after {timeout} of virtual time")
            self.clock.move_to(due)

    def _next_due(self) -> float | None:
        assert self._worker is not None
        ids, crons = self.app.registry.ids(), self._worker._schedules()

        def op(tx: Tx) -> float | None:
            times = [t for t in (tx.next_due(ids), tx.next_cron(crons), tx.next_deadline()) if t is not None]
            return min(times) if times else None

        return self.app.store.read_sync(op)

    @property
    def runs(self) -> Runs:
        return self.app.runs
