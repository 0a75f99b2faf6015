"""Real `stepstone worker` processes on each backend: SIGKILL mid-load, SIGTERM
drain, two workers racing for one queue, a worker paused past its lease."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import stepstone as ss

from .procs import client, completed, leased_count, ledger, wait_for

Spawn = Callable[..., subprocess.Popen[bytes]]


def test_sigkill_mid_run_resumes_from_last_checkpoint(env: dict[str, str], spawn: Spawn) -> None:
    app = client(env)
    first = spawn("--concurrency", "4", "--lease-ttl", "1.5")
    wait_for(lambda: bool(app.workers.list()), 30, "the worker to register")
    app.send([ss.Event("work", id=f"order-{i}") for i in range(12)])  # a client without the code
    wait_for(lambda: sum(1 for r in ledger(env) if r[2] == "end") >= 8, 60, "some steps to finish")
    first.send_signal(signal.SIGKILL)
    first.wait()
    killed_pid = first.pid
    spawn("--concurrency", "4", "--lease-ttl", "1.5")
    wait_for(lambda: completed(app, 100) == 12, 90, "all runs to complete")

    rows = ledger(env)
    starts = Counter((r[0], r[1]) for r in rows if r[2] == "start")
    assert {
        (run.id, s) for run in app.runs.list(limit=100) for s in ("charge", "record", "provision")
    } == set(starts)
    twice = [key for key, n in starts.items() if n > 1]
    # Only steps in flight at the kill may run again (at-least-once at the boundary):
    assert len(twice) <= 4
    order = ["charge", "record", "provision"]
    for run_id, step in twice:
        runners = [r[3] for r in rows if (r[0], r[1]) == (run_id, step) and r[2] == "start"]
        assert runners[0] == killed_pid and killed_pid not in runners[1:]
        # ...and it was the last thing the killed worker did for that run: a step starts only
        # after the previous one's checkpoint committed, so had the killed worker gone on to a
        # later step, this one would never have run again. (Its side effect may have finished:
        # the kill can land between the step's end and its commit.)
        later = order[order.index(step) + 1 :]
        assert not any(
            r[3] == killed_pid and r[2] == "start" and r[0] == run_id and r[1] in later for r in rows
        )
    for run in app.runs.list(limit=100):
        assert run.output == ["charge", "record", "provision"]
    app.close()


def test_sigterm_drains_in_flight_steps_and_releases_leases(env: dict[str, str], spawn: Spawn) -> None:
    env["STEP_SECONDS"] = "0.5"
    app = client(env)
    worker = spawn("--concurrency", "3", "--lease-ttl", "30")
    wait_for(lambda: bool(app.workers.list()), 30, "the worker to register")
    app.send([ss.Event("work", id=f"order-{i}") for i in range(6)])
    wait_for(lambda: sum(1 for r in ledger(env) if r[2] == "start") >= 3, 60, "steps to start")
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0
    rows = ledger(env)
    started = Counter((r[0], r[1]) for r in rows if r[2] == "start")
    ended = Counter((r[0], r[1]) for r in rows if r[2] == "end")
    assert started == ended  # every in-flight step finished before exit
    assert leased_count(env["STEPSTONE_DATABASE_URL"]) == 0
    assert app.workers.list() == []  # it left the registry
    # a new worker picks up at once (leases were released, not left to expire)
    spawn("--concurrency", "3", "--lease-ttl", "30")
    wait_for(lambda: completed(app) == 6, 60, "all runs to complete")
    starts = Counter((r[0], r[1]) for r in ledger(env) if r[2] == "start")
    assert max(starts.values()) == 1  # a graceful stop re-runs nothing
    app.close()


def test_two_workers_race_for_one_queue(env: dict[str, str], spawn: Spawn) -> None:
    """Both workers idle, then one transaction makes 150 runs due at once (on
    PostgreSQL its NOTIFY wakes both together): no step may run twice."""
    env["STEP_SECONDS"] = "0"
    app = client(env)
    a = spawn("--concurrency", "8", "--instance-id", "a")
    b = spawn("--concurrency", "8", "--instance-id", "b")
    wait_for(lambda: len(app.workers.list()) == 2, 30, "both workers to register")
    app.send([ss.Event("work", id=f"order-{i}") for i in range(150)])
    wait_for(lambda: completed(app) == 150, 90, "all runs to complete")
    rows = ledger(env)
    starts = Counter((r[0], r[1]) for r in rows if r[2] == "start")
    assert len(starts) == 450 and max(starts.values()) == 1  # no step leased twice
    assert {r[3] for r in rows} == {a.pid, b.pid}  # both took work
    app.close()


def test_a_paused_worker_is_fenced_out_when_it_resumes(
    env: dict[str, str], spawn: Spawn, worker_log: Path
) -> None:
    """SIGSTOP a worker mid-step for longer than its lease: another worker takes
    the run over. After SIGCONT the paused worker finishes its step's side
    effect, but its checkpoint is refused (owner + epoch fence): the run
    completes once, with the results of the worker that owned it."""
    env["STEP_SECONDS"] = "0.8"
    app = client(env)
    paused = spawn("--concurrency", "1", "--lease-ttl", "1.5", "--instance-id", "paused")
    wait_for(lambda: bool(app.workers.list()), 30, "the first worker to register")
    [event_id] = app.send(ss.Event("tagged"))
    [run] = app.runs.list(event_id=event_id)
    wait_for(lambda: any(r[2] == "start" for r in ledger(env)), 30, "the first step to start")
    paused.send_signal(signal.SIGSTOP)
    [(_, step_in_flight, _, _)] = [r for r in ledger(env) if r[3] == paused.pid]
    taker = spawn("--concurrency", "1", "--lease-ttl", "1.5", "--instance-id", "taker")

    def taken_over() -> bool:
        steps = {s.id: s for s in app.runs.get(run.id).steps}
        done = steps.get(step_in_flight)
        return done is not None and done.output == f"{step_in_flight}@{taker.pid}"

    wait_for(taken_over, 60, "the other worker to commit the paused worker's step")
    paused.send_signal(signal.SIGCONT)
    wait_for(lambda: app.runs.get(run.id).status == "completed", 60, "the run to complete")
    wait_for(
        lambda: (run.id, step_in_flight, "end", paused.pid) in ledger(env),
        30,
        "the resumed worker to finish its step",
    )
    refused = f"stepstone.executor run {run.id}: lease lost"  # logged when the fence refuses a commit
    wait_for(lambda: refused in worker_log.read_text(), 30, "the refused commit")

    final = app.runs.get(run.id)
    assert final.output == [f"{s}@{taker.pid}" for s in ("charge", "record", "provision")]
    assert [s.output for s in final.steps] == final.output  # the late commit did not overwrite
    # the paused worker did nothing after its refused commit: no next step started
    assert [r for r in ledger(env) if r[3] == paused.pid] == [
        (run.id, step_in_flight, "start", paused.pid),
        (run.id, step_in_flight, "end", paused.pid),
    ]
    assert paused.poll() is None  # it lives on, serving other runs
    app.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def get(url: str) -> tuple[int, str]:
    """Status and body of a GET, error statuses included."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_worker_probes_say_ready_then_draining(env: dict[str, str], spawn: Spawn) -> None:
    """``/readyz`` answers 200 once the worker registered and 503 while a SIGTERM
    drains it; ``/healthz`` answers while the process runs."""
    env["STEP_SECONDS"] = "2"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    app = client(env)
    worker = spawn("--concurrency", "2", "--metrics-port", str(port), "--instance-id", "probe-me")

    def ready() -> bool:
        try:
            return get(f"{base}/readyz")[0] == 200
        except OSError:
            return False  # not listening yet

    wait_for(ready, 30, "the worker to be ready")
    status, body = get(f"{base}/readyz")
    state = json.loads(body)
    assert (status, state["ready"], state["worker"], state["draining"], state["concurrency"]) == (
        200,
        True,
        "probe-me",
        False,
        2,
    )
    assert get(f"{base}/healthz") == (200, '{"status": "ok"}')
    assert get(f"{base}/nope")[0] == 404
    app.send(ss.Event("work"))
    wait_for(lambda: any(r[2] == "start" for r in ledger(env)), 30, "a step to start")
    worker.send_signal(signal.SIGTERM)
    wait_for(lambda: get(f"{base}/readyz")[0] == 503, 10, "readiness to drop while draining")
    state = json.loads(get(f"{base}/readyz")[1])
    assert (state["ready"], state["draining"]) == (False, True)
    assert worker.wait(timeout=30) == 0
    app.close()


def test_worker_exposes_its_metrics(
    env: dict[str, str], spawn: Callable[..., subprocess.Popen[bytes]]
) -> None:
    port = free_port()
    env["STEP_SECONDS"] = "0.001"
    app = client(env)
    spawn("--concurrency", "2", "--metrics-port", str(port))
    wait_for(lambda: bool(app.workers.list()), 30, "the worker to register")
    app.send([ss.Event("work") for _ in range(3)])
    wait_for(lambda: len(app.runs.list(status="completed")) == 3, 60, "runs to complete")

    def scrape() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            return str(response.read().decode())

    wait_for(
        lambda: 'stepstone_runs_finished_total{function="three-steps",status="completed"} 3.0' in scrape(),
        10,
        "the finished counter",
    )
    text = scrape()
    assert 'stepstone_step_duration_seconds_count{function="three-steps"} 9.0' in text
    assert 'stepstone_queue_delay_seconds_count{function="three-steps"} 3.0' in text
    app.close()
