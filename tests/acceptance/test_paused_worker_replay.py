"""Issue 12, defect 1, end to end: a worker paused mid-step past its lease; an
operator cancels the run and replays it; the same worker process, resumed,
leases the replayed run again. The paused invocation must stay fenced out:
an epoch never repeats for a run, so no step after the one in flight runs twice."""

from __future__ import annotations

import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import stepstone as ss

from ..conftest import query
from .procs import client, ledger, wait_for

Spawn = Callable[..., subprocess.Popen[bytes]]


def test_a_paused_worker_stays_fenced_out_after_cancel_and_replay(
    env: dict[str, str], spawn: Spawn, worker_log: Path, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    env.update(STEP_SECONDS="0.3", GATE_STEP="charge", GATE_PATH=str(gate), GATE_SECONDS="0.3")
    app = client(env)
    url = env["STEPSTONE_DATABASE_URL"]
    worker = spawn("--concurrency", "2", "--lease-ttl", "1", "--instance-id", "only")
    wait_for(lambda: bool(app.workers.list()), 30, "the worker to register")
    [event_id] = app.send(ss.Event("tagged"))
    [run] = app.runs.list(event_id=event_id)
    wait_for(lambda: (run.id, "charge", "start", worker.pid) in ledger(env), 30, "the slow step to start")
    worker.send_signal(signal.SIGSTOP)

    def lapsed() -> bool:
        rows = query(url, f"SELECT available_at FROM queue WHERE run_id = '{run.id}'")
        return bool(rows) and rows[0][0] is not None and rows[0][0] < time.time()

    wait_for(lapsed, 30, "the paused worker's lease to lapse")
    assert app.runs.cancel(run.id) == "cancelled"  # nobody holds it: cancelled at once
    app.runs.replay(run.id)
    worker.send_signal(signal.SIGCONT)  # its lease loop takes the replayed run again...
    wait_for(
        lambda: [r[1:3] for r in ledger(env)].count(("charge", "start")) == 2,
        30,
        "the replayed run to start its first step",
    )
    gate.touch()  # ...and the paused invocation's step ends about when the new one's does
    wait_for(lambda: app.runs.get(run.id).status == "completed", 60, "the replayed run to complete")
    refused = f"stepstone.executor run {run.id}: lease lost"  # the paused invocation's commit
    wait_for(lambda: refused in worker_log.read_text(), 30, "the refused commit")

    starts = Counter(r[1] for r in ledger(env) if r[0] == run.id and r[2] == "start")
    assert starts == {"charge": 2, "record": 1, "provision": 1}  # only the step in flight ran twice
    final = app.runs.get(run.id)
    assert final.output == [f"{s}@{worker.pid}" for s in ("charge", "record", "provision")]
    assert worker.poll() is None
    app.close()
