"""A run paused on a divergence, across real `stepstone worker` processes
(issue 13, points 4-5): left waiting by a v1 worker that is then killed, paused
by a v2 worker, untouched by a restarted v2 worker, resumed from the CLI under
v3. The ledger proves which step functions ran."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Callable

import stepstone as ss

from ..acceptance.test_cli import cli
from .procs import client, ledger, wait_for

Spawn = Callable[..., subprocess.Popen[bytes]]


def _deploy(env: dict[str, str], spawn: Spawn, version: str) -> subprocess.Popen[bytes]:
    env["APP_VERSION"] = version
    worker = spawn("--concurrency", "2", "--lease-ttl", "1")
    url = env["STEPSTONE_DATABASE_URL"]
    wait_for(
        lambda: version in {w["app_version"] for w in json.loads(cli(url, "workers", "--json").stdout)},
        30,
        f"a {version} worker to register",
    )
    return worker


def _kill(worker: subprocess.Popen[bytes]) -> None:
    worker.send_signal(signal.SIGKILL)
    worker.wait()


def _steps(env: dict[str, str], run_id: str) -> list[str]:
    return [step for (run, step, phase, _pid) in ledger(env) if run == run_id and phase == "start"]


def test_a_paused_run_outlives_killed_workers_and_resumes_under_fixed_code(
    env: dict[str, str], spawn: Spawn
) -> None:
    app, url = client(env), env["STEPSTONE_DATABASE_URL"]
    v1 = _deploy(env, spawn, "v1")
    [event_id] = app.send(ss.Event("versioned"))
    [run] = app.runs.list(event_id=event_id)
    wait_for(lambda: app.runs.get(run.id).status == "waiting", 30, "the v1 run to wait")
    _kill(v1)

    v2 = _deploy(env, spawn, "v2")
    app.send(ss.Event("versioned.go-on"))
    wait_for(lambda: app.runs.get(run.id).status == "paused", 30, "the run to pause under v2")
    _kill(v2)
    restarted = _deploy(env, spawn, "v2")  # a restart of the same deploy
    [later] = app.send(ss.Event("versioned"))
    [fresh] = app.runs.list(event_id=later)
    wait_for(lambda: app.runs.get(fresh.id).status == "waiting", 30, "a v2 run to wait")
    paused = app.runs.get(run.id)
    assert paused.status == "paused" and paused.app_version == "v2"
    assert [s.name for s in app.runs.trace(run.id) if s.kind == "warning"] == ["nondeterminism", "paused"]
    assert _steps(env, run.id) == ["charge"]  # v2's inserted step never ran
    listed = json.loads(cli(url, "runs", "list", "--status", "paused", "--json").stdout)
    assert [r["id"] for r in listed] == [run.id]

    _deploy(env, spawn, "v3")  # a rolling deploy, watched with `stepstone workers`
    versions = [w["app_version"] for w in json.loads(cli(url, "workers", "--json").stdout)]
    assert "v2" in versions and "v3" in versions
    _kill(restarted)  # the last v2 worker goes
    cli(url, "runs", "resume", run.id)
    app.runs.wait(run.id, timeout="30s")
    done = app.runs.get(run.id)
    assert done.app_version == "v3" and done.output == "ship"
    assert _steps(env, run.id) == ["charge", "audit", "ship"]  # no completed step ran again
    app.close()
