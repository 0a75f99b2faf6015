"""A short SIGKILL storm in the suite (the full chaos suite is bench/chaos.py):
three worker processes drain chaos runs while one of them is killed and
replaced every ~0.4 s. No run may be lost, and no completed step may run again:
only a step in flight in a killed worker may execute twice."""

from __future__ import annotations

from pathlib import Path

import pytest

from .chaos import Config, run_scenario

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
    # every step of every run executed at least once, the extra executions are all
    # retries of the flaky step or steps in flight at a kill
    assert verdict.superseded["unexplained"] == verdict.superseded["pause"] == 0, figures
    assert verdict.violations() == []
