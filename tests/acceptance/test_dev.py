"""`stepstone dev MODULE:app`: one process with workers and the HTTP API, a
generated key, and a restart with the new code when the module changes."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterable
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import free_port, poll

STEPSTONE = str(Path(sys.executable).parent / "stepstone")
pytestmark = pytest.mark.slow

MODULE = """
import os
import stepstone as ss

app = ss.App("devapp", database_url=os.environ["STEPSTONE_DATABASE_URL"])
VERSION = "{version}"


@app.function(id="which", trigger=ss.on_event("which"))
def which(ctx: ss.Context) -> str:
    return ctx.step.run("answer", lambda: VERSION)
"""


class Output:
    """Collects a process's stdout lines on a thread."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        assert process.stdout is not None
        self.thread = threading.Thread(target=self._read, args=(process.stdout,), daemon=True)
        self.thread.start()

    def _read(self, stream: Iterable[str]) -> None:
        for line in stream:
            self.lines.append(line)

    def find(self, pattern: str) -> str | None:
        for line in self.lines:
            match = re.search(pattern, line)
            if match:
                return match.group(1)
        return None


def test_dev_serves_runs_and_reloads_on_change(tmp_path: Path) -> None:
    module = tmp_path / "devmod.py"
    module.write_text(MODULE.format(version="v1"))
    port = free_port()
    process = subprocess.Popen(
        [STEPSTONE, "dev", "devmod:app", "--port", str(port)],
        cwd=tmp_path,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={"PATH": "/usr/bin:/bin", "STEPSTONE_DATABASE_URL": f"sqlite:///{tmp_path}/dev.db"},
    )
    output = Output(process)
    try:
        key = poll(lambda: output.find(r"API key \(generated\): (\S+)"), timeout=30, what="the key")
        http = httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {key}"})

        def answer() -> str | None:
            """Send an event and return what its run answered (None while restarting)."""
            try:
                [event_id] = http.post("/api/v1/events", json={"name": "which"}).json()["ids"]
                run_id = poll(
                    lambda: http.get("/api/v1/runs", params={"event_id": event_id}).json()["runs"],
                    what="the run",
                )[0]["id"]
                run = poll(
                    lambda: (r := http.get(f"/api/v1/runs/{run_id}").json())["status"] == "completed" and r,
                    timeout=30,
                    what="the run to complete",
                )
            except httpx.TransportError:
                return None
            return str(run["output"])

        assert poll(answer, timeout=30, what="the dev server") == "v1"
        assert httpx.get(f"http://127.0.0.1:{port}/api/v1/runs").status_code == 401  # keys apply in dev too
        module.write_text(MODULE.format(version="v2"))
        assert poll(lambda: answer() == "v2", timeout=60, what="the reloaded code")
        http.close()
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=30)
        output.thread.join(timeout=10)
        assert process.stdout is not None
        process.stdout.close()
    assert process.returncode == 0

    def port_closed() -> bool:
        try:
            httpx.get(f"http://127.0.0.1:{port}/healthz")
        except httpx.TransportError:
            return True
        return False

    assert poll(port_closed, what="the child process to go away")
