"""A hung sync step on a real `stepstone worker --concurrency 1` (issue 14,
point 1): the timed-out attempt frees the only slot, so another run completes
while the hung thread still runs; at the bound of abandoned threads the worker
stops leasing and its `/readyz` says why."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import stepstone as ss

from .conftest import STEPSTONE
from .procs import client, wait_for
from .test_worker_process import free_port, get


@pytest.fixture
def worker(env: dict[str, str], tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    port = free_port()
    log_path = tmp_path / "worker.log"
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            [
                *(STEPSTONE, "--log-level", "WARNING", "worker", "timeouts_app:app"),
                *("--concurrency", "1", "--max-abandoned-threads", "2", "--metrics-port", str(port)),
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    yield proc, f"http://127.0.0.1:{port}"
    proc.kill()
    proc.wait()
    sys.stdout.write(log_path.read_text())  # shown by pytest on failure


def readyz(base: str) -> tuple[int, dict[str, object]]:
    status, body = get(f"{base}/readyz")
    return status, json.loads(body)


def _answers(base: str) -> bool:
    try:
        return readyz(base)[0] == 200
    except OSError:
        return False  # not listening yet


def test_a_hung_sync_step_frees_the_only_slot_and_bounds_abandoned_threads(
    env: dict[str, str], worker: tuple[subprocess.Popen[bytes], str]
) -> None:
    _proc, base = worker
    app = client(env)
    wait_for(lambda: _answers(base), 30, "the worker to be ready")
    [hang] = app.send(ss.Event("hang"))
    [quick] = app.send(ss.Event("quick"))
    [hung_run] = app.runs.list(event_id=hang)
    [quick_run] = app.runs.list(event_id=quick)
    assert app.runs.wait(quick_run.id, timeout="30s").output == "done"  # the slot came back
    failed = app.runs.wait(hung_run.id, timeout="30s")
    assert failed.status == "failed" and failed.error is not None
    assert failed.error.type == "StepTimeoutError"
    status, state = readyz(base)
    assert (status, state["abandoned_threads"]) == (200, 1)  # still running, still counted
    metrics = get(f"{base}/metrics")[1]
    assert "stepstone_abandoned_step_threads 1.0" in metrics

    [second] = app.send(ss.Event("hang"))
    [second_run] = app.runs.list(event_id=second)
    assert app.runs.wait(second_run.id, timeout="30s").status == "failed"
    wait_for(lambda: readyz(base)[0] == 503, 10, "readiness to drop at the bound")
    status, state = readyz(base)
    assert state["abandoned_threads"] == 2 and "abandoned" in str(state["reason"])
    [late] = app.send(ss.Event("quick"))
    [late_run] = app.runs.list(event_id=late)
    with pytest.raises(ss.RunTimeoutError):
        app.runs.wait(late_run.id, timeout="1s")
    assert app.runs.get(late_run.id).status == "queued"  # no lease at the bound
    app.close()
