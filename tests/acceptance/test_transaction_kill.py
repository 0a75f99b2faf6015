"""Transactional steps against a real SIGKILL (issue 15), on both stores.

A `stepstone worker` kills itself inside the commit of the step that writes
the user's row: after the step's work, before its COMMIT (a fault point,
``store/faults.py``: no timing involved). Another worker takes the run over
once the lease lapses. With ``step.transaction`` the row was part of the
killed transaction: none is left, and the run ends with exactly one. With a
plain ``step.run`` the row was committed by its own connection before the
checkpoint: the step runs again and there are two (at-least-once at the
boundary, which is what ``transaction`` closes).
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable

import pytest

import stepstone as ss

from ..usertables import create_table, rows
from .procs import client, wait_for

Spawn = Callable[..., subprocess.Popen[bytes]]

CASES = [
    # (function, the commit the first worker dies in, rows after the kill, rows in the end)
    ("txn-record", "journal(checkpoint+transaction)", 0, 1),
    ("run-record", "journal(checkpoint)", 1, 2),
]


@pytest.mark.slow
@pytest.mark.parametrize(("function", "site", "after_kill", "in_the_end"), CASES)
def test_a_worker_killed_before_the_commit(
    env: dict[str, str], spawn: Spawn, function: str, site: str, after_kill: int, in_the_end: int
) -> None:
    url = env["STEPSTONE_DATABASE_URL"]
    create_table(url)
    app = client(env)
    env["KILL_INSIDE"] = site
    doomed = spawn("--concurrency", "1", "--lease-ttl", "1", "--instance-id", "doomed")
    del env["KILL_INSIDE"]
    wait_for(lambda: bool(app.workers.list()), 30, "the worker to register")
    [event_id] = app.send(ss.Event(function, {"user": "u1"}))
    assert doomed.wait(timeout=60) == -signal.SIGKILL
    assert [r[0] for r in rows(url)] == ["u1"] * after_kill
    [run] = app.runs.list(event_id=event_id)
    assert app.runs.get(run.id).steps == []  # the step's memo died with the worker

    spawn("--concurrency", "1", "--lease-ttl", "1", "--instance-id", "taker")
    assert app.runs.wait(run.id, timeout="60s").status == "completed"
    assert [r[0] for r in rows(url)] == ["u1"] * in_the_end
    app.close()
