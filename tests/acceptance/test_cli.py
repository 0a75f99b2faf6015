"""The CLI as a user runs it: migrate, send, runs list/show/cancel/replay."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import stepstone as ss

STEPSTONE = str(Path(sys.executable).parent / "stepstone")


def cli(url: str, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [STEPSTONE, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"STEPSTONE_DATABASE_URL": url, "PATH": "/usr/bin:/bin"},
    )
    assert (result.returncode == 0) == ok, result.stdout + result.stderr
    return result


def test_migrate_send_and_inspect(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/cli.db"
    assert "0001_init" in cli(url, "migrate").stdout
    assert "up to date" in cli(url, "migrate").stdout
    app = ss.App("cli-test", database_url=url)
    app.function(id="greet", trigger=ss.on_event("hello"))(lambda ctx: "hi")
    app.send(ss.Event("warm-up"))  # registers the function
    ids = json.loads(cli(url, "send", "hello", "--data", '{"name": "ada"}', "--id", "e1").stdout)
    assert ids == ["e1"]
    runs = json.loads(cli(url, "runs", "list", "--json").stdout)
    assert [(r["function_id"], r["status"], r["event_ids"]) for r in runs] == [("greet", "queued", ["e1"])]
    run_id = runs[0]["id"]
    shown = json.loads(cli(url, "runs", "show", run_id, "--json").stdout)
    assert shown["id"] == run_id
    assert "cancelled" in cli(url, "runs", "cancel", run_id).stdout
    assert app.runs.get(run_id).status == "cancelled"
    cli(url, "runs", "replay", run_id)
    assert app.runs.get(run_id).status == "queued"
    table = cli(url, "runs", "list").stdout
    assert run_id in table and "greet" in table
    assert "no run" in cli(url, "runs", "show", "missing", ok=False).stderr
    assert "not JSON" in cli(url, "send", "hello", "--data", "{oops", ok=False).stderr
    app.close()
