"""`stepstone server` as a process serves the dashboard from the installed
package: the login form, the static files, and the pages after signing in."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.acceptance.test_http_cli import STEPSTONE, env
from tests.server.conftest import free_port, poll

pytestmark = pytest.mark.slow


def test_stepstone_server_serves_the_dashboard(tmp_path: Path) -> None:
    port = free_port()
    process = subprocess.Popen(
        [
            STEPSTONE,
            "server",
            "--database-url",
            f"sqlite:///{tmp_path}/d.db",
            "--port",
            str(port),
            "--no-access-log",
        ],
        env=env(STEPSTONE_API_KEY="served-key"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:

        def up() -> bool:
            assert process.poll() is None, process.communicate()
            try:
                return httpx.get(f"{base}/healthz").status_code == 200
            except httpx.TransportError:
                return False

        poll(up, timeout=30, what="stepstone server")
        with httpx.Client(base_url=base) as client:
            assert client.get("/").status_code == 303
            form = client.get("/login")
            assert form.status_code == 200 and 'name="api_key"' in form.text
            script = client.get("/static/app.js")
            assert script.status_code == 200 and "X-CSRF-Token" in script.text
            assert "--fg" in client.get("/static/app.css").text
            assert client.post("/login", data={"api_key": "served-key"}).status_code == 303
            assert "No function is registered" in client.get("/functions").text
    finally:
        process.send_signal(signal.SIGTERM)
        out, _err = process.communicate(timeout=30)
    assert "dashboard on http://127.0.0.1" in out
