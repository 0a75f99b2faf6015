"""A real `stepstone server` process with a signing key, and real uvicorn
processes serving ``ss.serve(app)`` with no database: `stepstone apps sync URL`
registers the endpoint's functions (an event then starts a run of one, queued
until the push executor takes it); an endpoint holding another key is refused
with the signature named and nothing registered; `apps list` shows the
failure of a re-sync once the endpoint is gone; `apps unregister` retires its
functions."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.acceptance.test_http_cli import STEPSTONE, Remote, cli, env
from tests.server.conftest import free_port, poll

pytestmark = pytest.mark.slow
KEY = "process-signing-key-00001"
ENDPOINT_MODULE = """
    import stepstone as ss

    app = ss.App("store-front", app_version="v1")  # no database: the endpoint never opens one


    @app.function(id="charge", trigger=ss.on_event("order/placed"), retries=2)
    def charge(ctx: ss.Context) -> str:
        return "charged"


    @app.function(id="ship", trigger=ss.on_event("order/paid"))
    def ship(ctx: ss.Context) -> None:
        return None


    endpoint = ss.serve(app, signing_key=__import__("os").environ["ENDPOINT_KEY"])
"""


def _wait_until_serving(process: subprocess.Popen[str], url: str) -> None:
    def up() -> bool:
        assert process.poll() is None, process.communicate()
        try:
            httpx.get(url, timeout=2)
            return True
        except httpx.TransportError:
            return False

    poll(up, timeout=30, what=url)


def _stop(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=30)


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            _stop(process)


@pytest.fixture
def endpoint(
    tmp_path: Path, processes: list[subprocess.Popen[str]]
) -> Callable[[str], tuple[str, subprocess.Popen[str]]]:
    """Start a uvicorn process serving the module above under ``key``: its URL."""
    (tmp_path / "served.py").write_text(textwrap.dedent(ENDPOINT_MODULE))

    def start(key: str) -> tuple[str, subprocess.Popen[str]]:
        port = free_port()
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "served:endpoint",
                "--port",
                str(port),
                "--log-level",
                "warning",
            ],
            cwd=tmp_path,
            env=env(ENDPOINT_KEY=key, PYTHONPATH=str(tmp_path)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        processes.append(process)
        url = f"http://127.0.0.1:{port}/stepstone"
        _wait_until_serving(process, url)
        return url, process

    return start


@pytest.fixture
def server(tmp_path: Path, processes: list[subprocess.Popen[str]]) -> str:
    port = free_port()
    process = subprocess.Popen(
        [STEPSTONE, "server", "--database-url", f"sqlite:///{tmp_path}/server.db", "--port", str(port)],
        env=env(STEPSTONE_API_KEY="cli-key", STEPSTONE_SIGNING_KEY=KEY),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    processes.append(process)
    base = f"http://127.0.0.1:{port}"
    _wait_until_serving(process, f"{base}/healthz")
    return base


def test_apps_sync_registers_a_served_app_and_its_events_start_runs(
    server: str, endpoint: Callable[[str], tuple[str, subprocess.Popen[str]]]
) -> None:
    remote: Remote = {"STEPSTONE_URL": server, "STEPSTONE_API_KEY": "cli-key"}
    wrong_url, _ = endpoint("a-key-the-server-lacks-0001")
    refused = cli("apps", "sync", wrong_url, ok=False, **remote)
    assert "EndpointError" in refused.stderr and "refused this server's signature" in refused.stderr
    assert json.loads(cli("apps", "list", "--json", **remote).stdout) == []
    assert json.loads(cli("functions", "--json", **remote).stdout) == []

    url, process = endpoint(KEY)
    synced = json.loads(cli("apps", "sync", url, "--json", **remote).stdout)
    assert (synced["app"], synced["function_ids"], synced["error"]) == (
        "store-front",
        ["charge", "ship"],
        None,
    )
    registered = {f["id"]: f for f in json.loads(cli("functions", "--json", **remote).stdout)}
    assert registered["charge"]["config"]["serve_url"] == url and registered["charge"]["retries"] == 2

    with httpx.Client(base_url=server, headers={"Authorization": "Bearer cli-key"}) as http:
        [event_id] = http.post("/api/v1/events", json={"name": "order/placed"}).json()["ids"]
        [run] = http.get("/api/v1/runs", params={"event_id": event_id}).json()["runs"]
    # queued, running or already completed: the server's push worker for the
    # URL may take the run in the send's own transaction (a direct start) and
    # finish it before the listing reads it
    assert run["function_id"] == "charge" and run["status"] in ("queued", "running", "completed")

    _stop(process)
    failed = cli("apps", "sync", url, ok=False, **remote)
    assert "cannot reach" in failed.stderr
    [listed] = json.loads(cli("apps", "list", "--json", **remote).stdout)
    assert "cannot reach" in listed["error"] and listed["function_ids"] == ["charge", "ship"]
    assert "cannot reach" in cli("apps", "list", COLUMNS="400", **remote).stdout
    gone = cli("apps", "unregister", url, **remote).stdout
    assert "unregistered store-front" in gone and "2 function(s) retired" in gone
    assert json.loads(cli("apps", "list", "--json", **remote).stdout) == []
    assert {f["retired_at"] is not None for f in json.loads(cli("functions", "--json", **remote).stdout)} == {
        True
    }
    assert "NotFoundError" in cli("apps", "unregister", url, ok=False, **remote).stderr
