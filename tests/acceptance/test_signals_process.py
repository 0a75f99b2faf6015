"""Signals meeting a killed worker process (issue 14), on each backend: runs
signalled while queued, mid-step or parked, their worker SIGKILLed at once,
a new worker finishing them: every signal received once, by its own run."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable

import stepstone as ss
from stepstone.store.rows import SignalRow

from .procs import client, completed, ledger, wait_for

Spawn = Callable[..., subprocess.Popen[bytes]]
RUNS = 8


def test_signals_survive_a_sigkilled_worker(env: dict[str, str], spawn: Spawn) -> None:
    app = client(env)
    first = spawn("--concurrency", "4", "--lease-ttl", "1.5")
    wait_for(lambda: bool(app.workers.list()), 30, "the worker to register")
    app.send([ss.Event("approval", id=f"approval-{i}") for i in range(RUNS)])
    runs = {app.runs.list(event_id=f"approval-{i}")[0].id: i for i in range(RUNS)}

    def ended() -> int:
        return sum(1 for r in ledger(env) if r[1] == "charge" and r[2] == "end")

    wait_for(lambda: ended() >= 3, 60, "some runs to reach their wait")
    for run_id, i in runs.items():  # queued, mid-step or parked
        app.runs.signal(run_id, "approved", {"n": i})
    first.send_signal(signal.SIGKILL)
    first.wait()
    spawn("--concurrency", "4", "--lease-ttl", "1.5")
    wait_for(lambda: completed(app, 100) == RUNS, 90, "all runs to complete")
    for run_id, i in runs.items():
        assert app.runs.get(run_id).output == ["charge", {"n": i}, "provision"]
        received = signals_of(app, run_id)
        assert [s.consumed_by for s in received] == ["approval"]
    app.close()


def signals_of(app: ss.App, run_id: str) -> list[SignalRow]:
    return app.store.read_sync(lambda tx: tx.run_signals(run_id))
