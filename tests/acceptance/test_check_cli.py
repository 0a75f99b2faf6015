"""``stepstone check`` as a deploy gate and ``stepstone runs export``, run as a
user runs them: a real subprocess, its exit code and its output."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import stepstone as ss

from ..polling import wait_for

STEPSTONE = str(Path(sys.executable).parent / "stepstone")
MODULE = textwrap.dedent(
    """
    import os
    import stepstone as ss

    app = ss.App("gate")

    def charge():
        return {"id": "ch_1"}

    def audit():
        return "audited"

    @app.function(id="order", trigger=ss.on_event("order"))
    async def order(ctx):
        if os.environ.get("SHOP_VERSION") == "2":
            await ctx.step.run("audit", audit)
        await ctx.step.run("charge", charge)
        await ctx.step.sleep("cool-off", "1h")
    """
)


def stepstone(cwd: Path, *args: str, version: str = "1") -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "SHOP_VERSION": version, "STEPSTONE_DATABASE_URL": "sqlite:///unused.db"}
    return subprocess.run([STEPSTONE, *args], capture_output=True, text=True, timeout=60, cwd=cwd, env=env)


def test_check_gates_a_deploy_by_its_exit_code(tmp_path: Path) -> None:
    (tmp_path / "shopmod.py").write_text(MODULE)
    url = f"sqlite:///{tmp_path}/gate.db"
    sys.path.insert(0, str(tmp_path))
    try:
        shopmod = importlib.import_module("shopmod")  # the same code, version 1, in this process
    finally:
        sys.path.remove(str(tmp_path))
    app: ss.App = shopmod.app
    app.database_url = url
    app.start()
    [event_id] = app.send(ss.Event("order"))
    [run] = app.runs.list(event_id=event_id)
    wait_for(lambda: app.runs.get(run.id).status == "sleeping", 10, "the run to sleep")
    app.close()

    same = stepstone(tmp_path, "check", "shopmod:app", "--database-url", url)
    assert same.returncode == 0, same.stdout + same.stderr
    assert "1 run(s) checked" in same.stdout

    changed = stepstone(tmp_path, "check", "shopmod:app", "--database-url", url, "--json", version="2")
    assert changed.returncode == 1, changed.stdout + changed.stderr
    report = json.loads(changed.stdout)
    assert (report["ok"], report["runs_checked"]) == (False, 1)
    [found] = report["incompatible"]
    assert (found["run_id"], found["reason"], found["step_id"], found["missing"]) == (
        run.id,
        "new-step",
        "audit",
        ["charge", "cool-off"],
    )
    table = stepstone(tmp_path, "check", "shopmod:app", "--database-url", url, version="2")
    assert table.returncode == 1 and run.id in table.stdout and "new-step" in table.stdout

    exported = stepstone(tmp_path, "runs", "export", run.id, "--database-url", url)
    assert exported.returncode == 0, exported.stderr
    history = tmp_path / "history.json"
    history.write_text(exported.stdout)
    assert json.loads(exported.stdout)["run_id"] == run.id
    offline = ["check", "shopmod:app", "--history", str(history), "--database-url", "sqlite:///absent.db"]
    assert stepstone(tmp_path, *offline).returncode == 0
    assert stepstone(tmp_path, *offline, version="2").returncode == 1
    assert not (tmp_path / "absent.db").exists()

    usage = [
        ["check", "shopmod:app", "--function", "missing", "--database-url", url],
        ["check", "shopmod:app", "--history", str(tmp_path / "none.json")],
        ["check", "nosuchmodule:app"],
    ]
    for args in usage:
        result = stepstone(tmp_path, *args)
        assert result.returncode == 2, (args, result.stdout + result.stderr)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert stepstone(tmp_path, "check", "shopmod:app", "--history", str(bad)).returncode == 2
    assert stepstone(tmp_path, "runs", "export", "missing", "--database-url", url).returncode == 1
