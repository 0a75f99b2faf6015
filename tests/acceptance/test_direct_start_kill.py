"""A run started directly (taken in its send's transaction by a worker of the
sending process) survives that process's death like any leased run: killed
mid-run, its lease lapses and a worker of another process resumes it from its
last checkpoint; the completed step does not run again. Real processes, both
stores."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from .procs import client, leased_count, ledger, wait_for

Spawn = Callable[..., subprocess.Popen[bytes]]
SENDER = Path(__file__).with_name("direct_sender.py")


def _sent_and_handed(sender: subprocess.Popen[bytes]) -> str:
    """The run the sender's send started on its own worker (read from its output)."""
    assert sender.stdout is not None
    lines = [sender.stdout.readline().decode().split()]
    while lines[-1][:1] != ["sent"]:  # a hand-over is said before the send returns
        lines.append(sender.stdout.readline().decode().split())
    run_id = lines[-1][1]
    assert ["handed", run_id] in lines  # started in the send's transaction, not by a lease pass
    return run_id


def _killed(sender: subprocess.Popen[bytes]) -> None:
    sender.kill()
    assert sender.wait(timeout=30) == -signal.SIGKILL
    if sender.stdout is not None:
        sender.stdout.close()


@pytest.mark.slow
def test_a_process_killed_right_after_a_send_written_taken_leaves_a_run_another_worker_resumes(
    env: dict[str, str], spawn: Spawn, tmp_path: Path
) -> None:
    """The send wrote its run already taken (issue 18, session 10: no take
    after the insert) and the process dies before the run's first step
    completes: the run is leased to a dead worker, in the store as a take
    leaves it, until the lease lapses; then another worker runs it whole."""
    env.update(GATE_STEP="charge", GATE_PATH=str(tmp_path / "gate"), STEP_SECONDS="0.01")
    sender = subprocess.Popen(
        [sys.executable, str(SENDER), "1"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        run_id = _sent_and_handed(sender)
    finally:
        _killed(sender)
    (tmp_path / "gate").touch()

    app = client(env)
    run = app.runs.get(run_id)
    assert (run.status, run.started_at is not None) == ("running", True)  # leased to a dead worker
    assert leased_count(env["STEPSTONE_DATABASE_URL"]) == 1
    spawn("--concurrency", "1", "--lease-ttl", "1", "--instance-id", "taker")
    assert app.runs.wait(run_id, timeout="60s").status == "completed"
    phases = [(step, phase) for rid, step, phase, _pid in ledger(env) if rid == run_id]
    assert phases.count(("charge", "end")) == 1 and phases.count(("provision", "end")) == 1
    assert {pid for rid, _step, phase, pid in ledger(env) if rid == run_id and phase == "end"} != {sender.pid}
    app.close()


@pytest.mark.slow
def test_a_process_killed_after_a_direct_start_leaves_a_run_another_worker_resumes(
    env: dict[str, str], spawn: Spawn, tmp_path: Path
) -> None:
    env.update(GATE_STEP="record", GATE_PATH=str(tmp_path / "gate"), STEP_SECONDS="0.01")
    sender = subprocess.Popen(
        [sys.executable, str(SENDER), "1"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        run_id = _sent_and_handed(sender)
        wait_for(lambda: (run_id, "record", "start", sender.pid) in ledger(env), 30, "step 2 to start")
    finally:
        _killed(sender)
    (tmp_path / "gate").touch()

    app = client(env)
    assert app.runs.get(run_id).status == "running"  # leased to a dead worker
    spawn("--concurrency", "1", "--lease-ttl", "1", "--instance-id", "taker")
    assert app.runs.wait(run_id, timeout="60s").status == "completed"
    phases = [(step, phase) for rid, step, phase, _pid in ledger(env) if rid == run_id]
    assert phases.count(("charge", "start")) == 1  # completed before the kill: never again
    assert phases.count(("record", "start")) == 2 and phases.count(("provision", "end")) == 1
    app.close()
