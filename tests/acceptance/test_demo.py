"""The first run (issue 20): the demo keeps its database and ends with the one
command that serves those same runs; that command, run as printed (twice, as
``stepstone dev``'s reloads re-import the module), shows the demo's runs with
the failed attempts and the replay. Real processes over a real SQLite file."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.acceptance.test_dev import STEPSTONE
from tests.server.conftest import free_port, poll

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
COMMAND = r"STEPSTONE_API_KEY=(\S+) \.venv/bin/stepstone dev (\S+) --port \d+"


def demo_runs(target: str, key: str, env: dict[str, str]) -> list[dict[str, Any]]:
    """Serve ``target`` as the demo's command does, and list its runs with traces."""
    port = free_port()
    process = subprocess.Popen(
        [STEPSTONE, "dev", target, "--port", str(port), "--no-reload"],
        cwd=ROOT,
        env={**env, "STEPSTONE_API_KEY": key},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        http = httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {key}"})

        def listed() -> list[dict[str, Any]] | None:
            try:
                runs: list[dict[str, Any]] = http.get("/api/v1/runs").json()["runs"]
            except httpx.TransportError:
                return None
            return runs

        runs: list[dict[str, Any]] = poll(listed, timeout=30, what="the dev server")
        for run in runs:
            run["trace"] = http.get(f"/api/v1/runs/{run['id']}/trace").json()["spans"]
        http.close()
        return runs
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=30)


def test_the_demo_ends_with_the_command_that_shows_its_runs(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "DEMO_DIR": str(tmp_path / "demo")}
    demo = subprocess.run(
        [sys.executable, "examples/charge_and_provision.py"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert demo.returncode == 0, demo.stdout + demo.stderr
    match = re.search(COMMAND, demo.stdout)
    assert match, demo.stdout
    key, target = match.groups()
    assert f"sign in with the key {key}" in demo.stdout and "http://127.0.0.1:8288/" in demo.stdout

    for _ in range(2):  # a reload is a new process importing the module again
        runs = demo_runs(target, key, env)
        assert sorted(r["event_ids"][0] for r in runs) == ["order-1", "order-2"]
        assert all(r["status"] == "completed" for r in runs)
        [replayed] = [r for r in runs if r["event_ids"] == ["order-2"]]
        kinds = [(s["kind"], s["status"]) for s in replayed["trace"]]
        assert ("replay", "ok") in kinds and ("step", "failed") in kinds
