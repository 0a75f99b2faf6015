"""A short SIGKILL storm in the suite (the full chaos suite is bench/chaos.py):
three worker processes drain chaos runs while one of them is killed and
replaced every ~0.4 s. No run may be lost, and no completed step may run again:
only a step in flight in a killed worker may execute twice."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

import stepstone as ss

from .chaos import Config, run_scenario
from .procs import client, ledger, wait_for

Spawn = Callable[..., subprocess.Popen[bytes]]

pytestmark = pytest.mark.slow

STORM = Config(runs=40, lease_ttl=1.5, kill_every=0.4, fault_seconds=20, deadline=60, step_seconds=0.05)


def test_a_sigkill_storm_loses_no_run_and_reruns_no_completed_step(db_url: str, tmp_path: Path) -> None:
    backend = "sqlite" if db_url.startswith("sqlite") else "postgres"
    outcome = run_scenario("storm", backend, db_url, tmp_path, STORM)
    verdict, figures = outcome.verdict, outcome.figures()
    assert figures["kills"] >= 2, figures  # the storm happened while runs were in flight
    assert verdict.stuck == [] and verdict.missing == 0, outcome.log[-3000:]
    assert sum(verdict.statuses.values()) == STORM.runs
    assert verdict.statuses["completed"] + verdict.statuses["failed"] == STORM.runs
    assert verdict.reruns == [], figures  # a committed step never ran again
    # the steps executed again were in flight at a kill (or, on a loaded machine, in a
    # worker whose heartbeat came later than its lease): their checkpoints never committed.
    # Every execution is accounted for: a committed step (3 per completed run, `charge`
    # in a failed one), an injected failure, or a superseded execution.
    committed = 3 * verdict.statuses["completed"] + verdict.statuses["failed"]
    assert verdict.executions == committed + verdict.retried + sum(verdict.superseded.values()), figures
    assert verdict.violations() == []


def test_a_worker_resumed_past_its_lease_starts_no_step_another_worker_completed(
    env: dict[str, str], spawn: Spawn, worker_log: Path
) -> None:
    """A worker leases a run and is paused (SIGSTOP) in the handler's code before
    its first step, past its lease; another worker takes the run over and
    completes it. Resumed, the first worker must not execute that step again."""
    env.update(PRELUDE_SECONDS="1.0", STEP_SECONDS="0.1")
    app = client(env)
    stale = spawn("--concurrency", "1", "--lease-ttl", "1.5", "--instance-id", "stale")
    wait_for(lambda: bool(app.workers.list()), 30, "the first worker to register")
    [event_id] = app.send(ss.Event("prelude"))
    [run] = app.runs.list(event_id=event_id)
    wait_for(lambda: (run.id, "prelude", "start", stale.pid) in ledger(env), 30, "the invocation to begin")
    stale.send_signal(signal.SIGSTOP)
    taker = spawn("--concurrency", "1", "--lease-ttl", "1.5", "--instance-id", "taker")
    wait_for(lambda: app.runs.get(run.id).status == "completed", 60, "the other worker to complete the run")
    stale.send_signal(signal.SIGCONT)
    # the resumed worker ends its stale invocation: its commit is refused (logged), if it gets that far
    wait_for(
        lambda: (
            f"run {run.id}: lease lost" in worker_log.read_text()
            or (run.id, "charge", "end", stale.pid) in ledger(env)
        ),
        30,
        "the stale invocation to end",
    )
    assert app.runs.get(run.id).output == f"charge@{taker.pid}"
    assert [r for r in ledger(env) if r[1] == "charge"] == [
        (run.id, "charge", "start", taker.pid),
        (run.id, "charge", "end", taker.pid),
    ]
    app.close()
