"""A run with a long history of large outputs, its worker killed mid-run: the
next worker replays the recorded steps from memo pages (lazy loading) and
runs only what never completed; every replayed value is the one recorded."""

from __future__ import annotations

import signal
import subprocess
from collections import Counter
from collections.abc import Callable

import stepstone as ss

from .procs import client, ledger, wait_for

Spawn = Callable[..., subprocess.Popen[bytes]]
STEPS = 150  # ledger_app.LONG_STEPS


def test_a_killed_workers_long_run_resumes_from_pages_without_rerunning_a_step(
    env: dict[str, str], spawn: Spawn
) -> None:
    env["STEP_SECONDS"] = "0.005"
    env["LONG_STEPS"] = str(STEPS)
    app = client(env)
    first = spawn("--concurrency", "1", "--lease-ttl", "1.5")
    wait_for(lambda: bool(app.workers.list()), 30, "the worker to register")
    [event_id] = app.send(ss.Event("long"))
    [run] = app.runs.list(event_id=event_id)
    wait_for(lambda: sum(1 for r in ledger(env) if r[2] == "end") >= 100, 60, "100 steps to finish")
    first.send_signal(signal.SIGKILL)
    first.wait()
    spawn("--concurrency", "1", "--lease-ttl", "1.5")
    done = app.runs.wait(run.id, timeout="90s")

    assert done.status == "completed"
    assert done.output == [[f"s{i}", len(f"s{i}:") + 20_000] for i in range(STEPS)]
    rows = ledger(env)
    starts = Counter(r[1] for r in rows if r[2] == "start")
    assert set(starts) == {f"s{i}" for i in range(STEPS)}
    killed = [int(r[1][1:]) for r in rows if r[3] == first.pid and r[2] == "start"]
    assert len(killed) >= 100
    resumed = [int(r[1][1:]) for r in rows if r[3] != first.pid and r[2] == "start"]
    # The new worker replayed every completed step from its memo and started
    # at most the one the killed worker had in flight (its checkpoint may not
    # have committed), then the steps never reached.
    assert resumed == list(range(max(killed), STEPS)) or resumed == list(range(max(killed) + 1, STEPS))
    assert max(starts.values()) <= 2
    app.close()
