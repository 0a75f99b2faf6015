"""`stepstone server` as a process, and the CLI against it (--url) and against the
database directly: send, runs list/show/cancel/replay/cancel-many/replay-many,
functions, workers."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TypedDict

import httpx
import pytest

import stepstone as ss
from tests.server.conftest import free_port, poll

STEPSTONE = str(Path(sys.executable).parent / "stepstone")
pytestmark = pytest.mark.slow


def env(**extra: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", **extra}


class Remote(TypedDict):
    """The environment of a CLI talking to a server (``**remote``: no key can be ``ok``)."""

    STEPSTONE_URL: str
    STEPSTONE_API_KEY: str


class Direct(TypedDict):
    STEPSTONE_DATABASE_URL: str


def cli(*args: str, ok: bool = True, **extra: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([STEPSTONE, *args], capture_output=True, text=True, timeout=60, env=env(**extra))
    assert (result.returncode == 0) == ok, result.stdout + result.stderr
    return result


@pytest.fixture
def database(tmp_path: Path) -> Iterator[tuple[str, ss.App]]:
    """The database, with an app whose functions are registered and served by
    in-process workers (`greet`) and one nobody works on (`parked`)."""
    url = f"sqlite:///{tmp_path}/server.db"
    app = ss.App("shop", database_url=url)
    app.function(id="greet", trigger=ss.on_event("hello"))(
        lambda ctx: f"hi {ctx.step.run('name', lambda: ctx.event.data['name'])}"
    )
    other = ss.App("elsewhere", database_url=url)
    other.function(id="parked", trigger=ss.on_event("park"))(lambda ctx: None)
    other.store  # noqa: B018 - registers "parked"
    app.start(concurrency=2)
    yield url, app
    app.close()
    other.close()


@pytest.fixture
def server(database: tuple[str, ss.App]) -> Iterator[str]:
    url, _app = database
    port = free_port()
    process = subprocess.Popen(
        [STEPSTONE, "server", "--database-url", url, "--port", str(port)],
        env=env(STEPSTONE_API_KEY="cli-key", STEPSTONE_EVENT_KEY="cli-event-key"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        assert process.poll() is None, process.communicate()
        try:
            return httpx.get(f"{base}/healthz").status_code == 200
        except httpx.TransportError:
            return False

    poll(healthy, timeout=30, what="stepstone server")
    yield base
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=30)
    # uvicorn shuts down gracefully, then re-raises the signal it caught
    assert process.returncode in (0, -signal.SIGTERM), out + err
    assert "Application shutdown complete" in err


def test_server_refuses_to_start_without_keys(tmp_path: Path) -> None:
    result = cli(
        "server", "--database-url", f"sqlite:///{tmp_path}/x.db", "--port", str(free_port()), ok=False
    )
    assert (
        result.returncode == 2
        and "refusing to start" in result.stderr
        and "--insecure-no-auth" in result.stderr
    )


def test_the_cli_drives_a_server(server: str, database: tuple[str, ss.App]) -> None:
    remote: Remote = {"STEPSTONE_URL": server, "STEPSTONE_API_KEY": "cli-key"}
    [event_id] = json.loads(cli("send", "hello", "--data", '{"name": "ada"}', **remote).stdout)
    [run] = json.loads(cli("runs", "list", "--json", "--function", "greet", **remote).stdout)
    assert run["event_ids"] == [event_id]
    database[1].runs.wait(run["id"])
    shown = json.loads(cli("runs", "show", run["id"], "--json", "--trace", **remote).stdout)
    assert shown["status"] == "completed" and shown["output"] == "hi ada"
    assert [s["kind"] for s in shown["trace"]][:2] == ["run", "queued"]
    table = cli("runs", "show", run["id"], "--trace", **remote).stdout
    assert "completed" in table and "queue" in table

    sent = cli("send", "park", "--id", "p-1", STEPSTONE_URL=server, STEPSTONE_EVENT_KEY="cli-event-key")
    assert json.loads(sent.stdout) == ["p-1"]
    [parked] = json.loads(cli("runs", "list", "--json", "--function", "parked", **remote).stdout)
    assert cli("runs", "cancel", parked["id"], **remote).stdout.strip() == "cancelled"
    assert "replaying" in cli("runs", "replay", parked["id"], **remote).stdout
    for _ in range(3):
        cli("send", "park", **remote)
    bulk = cli("runs", "cancel-many", "--function", "parked", "--json", **remote)
    assert json.loads(bulk.stdout) == {"action": "cancel", "function_id": "parked", "count": 4}
    replayed = cli("runs", "replay-many", "--function", "parked", "--status", "cancelled", **remote)
    assert "replay: 4 run(s)" in replayed.stdout and "done" in replayed.stderr  # the progress bar

    functions = json.loads(cli("functions", "--json", **remote).stdout)
    assert {f["id"]: f["app"] for f in functions} == {"greet": "shop", "parked": "elsewhere"}
    [worker] = json.loads(cli("workers", "--json", **remote).stdout)
    assert worker["app"] == "shop" and worker["functions"] == ["greet"]
    assert "greet" in cli("functions", **remote).stdout

    denied = cli("runs", "list", ok=False, STEPSTONE_URL=server, STEPSTONE_API_KEY="wrong")
    assert "AuthenticationError" in denied.stderr
    unknown = cli("runs", "cancel-many", "--function", "ghost", ok=False, **remote)
    assert "unknown function 'ghost'" in unknown.stderr
    bad_cel = cli("runs", "cancel-many", "--function", "parked", "--if", "event.data ==", ok=False, **remote)
    assert "ConfigError" in bad_cel.stderr and "if" in bad_cel.stderr


def test_the_new_commands_work_on_the_database_directly(database: tuple[str, ss.App]) -> None:
    url, app = database
    direct: Direct = {"STEPSTONE_DATABASE_URL": url}
    functions = json.loads(cli("functions", "--json", **direct).stdout)
    assert sorted(f["id"] for f in functions) == ["greet", "parked"]
    workers = json.loads(cli("workers", "--json", **direct).stdout)
    assert [w["app"] for w in workers] == ["shop"]
    app.send([ss.Event("park", {"tenant": t}) for t in "aab"])
    result = cli("runs", "cancel-many", "--function", "parked", "--if", "event.data.tenant == 'a'", **direct)
    assert "cancel: 2 run(s)" in result.stdout
    statuses = sorted(r.status for r in app.runs.list(function_id="parked"))
    assert statuses == ["cancelled", "cancelled", "queued"]
    listed = json.loads(cli("runs", "list", "--json", "--status", "cancelled", **direct).stdout)
    assert len(listed) == 2
    assert "unknown function" in cli("runs", "replay-many", "--function", "nope", ok=False, **direct).stderr
    assert "RFC 3339" in cli("runs", "list", "--since", "whenever", ok=False, **direct).stderr


def test_rerun_with_edited_event_data_from_the_cli(server: str, database: tuple[str, ss.App]) -> None:
    url, app = database
    [event_id] = app.send(ss.Event("hello", {"name": "ada"}))
    [run] = app.runs.list(event_id=event_id)
    assert app.runs.wait(run.id).output == "hi ada"
    remote: Remote = {"STEPSTONE_URL": server, "STEPSTONE_API_KEY": "cli-key"}
    for target, name in (({"STEPSTONE_DATABASE_URL": url}, "bob"), (remote, "cy")):
        data = json.dumps({"name": name})
        fork = cli("runs", "rerun", run.id, "name", "--event-data", data, **target).stdout.strip()
        assert app.runs.wait(fork).output == f"hi {name}"
    bad = cli("runs", "rerun", run.id, "name", "--event-data", "{name", ok=False, STEPSTONE_DATABASE_URL=url)
    assert bad.returncode == 2 and "--event-data" in bad.stderr and "not JSON" in bad.stderr
    array = cli("runs", "rerun", run.id, "name", "--event-data", "[1]", ok=False, **remote)
    assert "must be a JSON object" in array.stderr
    assert len(app.runs.list(function_id="greet")) == 3


def test_stats_through_a_server_match_the_database(server: str, database: tuple[str, ss.App]) -> None:
    url, app = database
    [event_id] = app.send(ss.Event("hello", {"name": "ada"}))
    run = app.runs.wait(app.runs.list(event_id=event_id)[0].id)
    remote: Remote = {"STEPSTONE_URL": server, "STEPSTONE_API_KEY": "cli-key"}
    over_http = json.loads(cli("stats", "--json", **remote).stdout)
    direct = json.loads(cli("stats", "--json", STEPSTONE_DATABASE_URL=url).stdout)
    assert over_http["oldest_ended"]["id"] == direct["oldest_ended"]["id"] == run.id
    assert (
        abs(over_http["oldest_ended"]["ended_at"] - direct["oldest_ended"]["ended_at"]) < 1e-5
    )  # (JSON: µs)
    rows = {t["name"]: t["rows"] for t in direct["tables"]}
    assert {t["name"]: t["rows"] for t in over_http["tables"]}["runs"] == rows["runs"] == 1
    assert f"oldest ended run: {run.id}" in cli("stats", **remote).stdout
    refused = cli("stats", STEPSTONE_URL=server, STEPSTONE_API_KEY="wrong", ok=False)
    assert refused.returncode != 0 and "key" in (refused.stderr + refused.stdout).lower()
