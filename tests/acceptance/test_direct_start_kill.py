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
    steps = [(s.id, s.status, s.attempts) for s in app.runs.get(run_id).steps]
    assert steps == [
        (step, "completed", 1) for step in ("charge", "record", "provision")
    ]  # a crash is no attempt
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
    steps = [(s.id, s.status, s.attempts) for s in app.runs.get(run_id).steps]
    assert steps == [(step, "completed", 1) for step in ("charge", "record", "provision")]
    app.close()


@pytest.mark.slow
def test_a_process_paused_in_the_first_step_of_its_direct_start_is_fenced_out_when_resumed(
    env: dict[str, str], spawn: Spawn, tmp_path: Path
) -> None:
    """SIGSTOP, not SIGKILL: the sending process is paused inside the first
    step of the run its send started; its lease lapses, a worker of another
    process runs the run whole; resumed, the paused step returns and its
    checkpoint is refused (the lease moved): it executes no further step,
    and every step's result and attempt count are the other worker's."""
    log = tmp_path / "sender.log"
    env.update(GATE_STEP="charge", GATE_PATH=str(tmp_path / "gate"), STEP_SECONDS="0.01")
    with log.open("wb") as out:
        sender = subprocess.Popen(
            [sys.executable, str(SENDER), "1", "tagged"], env=env, stdout=out, stderr=out
        )
    try:

        def said(word: str) -> list[str]:
            return [line.split()[1] for line in log.read_text().splitlines() if line.startswith(word + " ")]

        wait_for(lambda: said("sent"), 30, "the send")
        [run_id] = said("sent")
        assert said("handed") == [run_id]  # started in the send's transaction
        wait_for(lambda: (run_id, "charge", "start", sender.pid) in ledger(env), 30, "step 1 to start")
        sender.send_signal(signal.SIGSTOP)
        app = client(env)
        taker = spawn("--concurrency", "1", "--lease-ttl", "1", "--instance-id", "taker")
        assert app.runs.wait(run_id, timeout="60s").status == "completed"
        (tmp_path / "gate").touch()
        sender.send_signal(signal.SIGCONT)
        refused = f"run {run_id}: lease lost"
        wait_for(lambda: refused in log.read_text(), 30, "the paused invocation's refused checkpoint")
        assert sender.poll() is None
    finally:
        sender.kill()
        sender.wait(timeout=30)
    starts = [(step, pid) for rid, step, phase, pid in ledger(env) if rid == run_id and phase == "start"]
    assert starts == [
        ("charge", sender.pid),
        ("charge", taker.pid),
        ("record", taker.pid),
        ("provision", taker.pid),
    ]
    run = app.runs.get(run_id)
    assert run.output == [f"{step}@{taker.pid}" for step in ("charge", "record", "provision")]
    assert [(s.id, s.status, s.attempts) for s in run.steps] == [
        (step, "completed", 1) for step in ("charge", "record", "provision")
    ]
    app.close()
