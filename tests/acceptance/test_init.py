"""``stepstone init`` (issue 20): one command gives a new project a working
module, and never overwrites a file. The real CLI writes it; the module is then
imported and its function run, on a virtual clock and by a real worker."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

import stepstone as ss
from stepstone.testing import TestEnv
from tests.acceptance.test_dev import STEPSTONE
from tests.polling import wait_for

pytestmark = pytest.mark.slow


def init(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [STEPSTONE, "init", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )


def load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_init_writes_a_module_whose_function_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STEPSTONE_DATABASE_URL", f"sqlite:///{tmp_path}/unused.db")  # TestEnv replaces it
    result = init(tmp_path)
    assert result.returncode == 0, result.stderr
    assert "stepstone dev stepstone_app:app" in result.stdout
    module = load(tmp_path / "stepstone_app.py")
    app: ss.App = module.app
    with TestEnv(app) as env:
        [run] = env.send(ss.Event("signup.completed", {"email": "ada@example.com"}))
        assert env.get(run.id).status == "sleeping"
        env.advance("1d")
        done = env.wait(run.id)
    assert done.status == "completed"
    assert done.output == {
        "welcome": {"sent_to": "ada@example.com"},
        "follow_up": "follow-up for ada@example.com",
    }


def test_the_written_module_runs_on_a_real_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert init(tmp_path, "shop.py").returncode == 0
    monkeypatch.setenv(
        "STEPSTONE_DATABASE_URL", f"sqlite:///{tmp_path}/shop.db"
    )  # the module's documented override
    app: ss.App = load(tmp_path / "shop.py").app
    assert app.name == "shop"
    app.start()
    try:
        [event_id] = app.send(ss.Event("signup.completed", {"email": "bob@example.com"}))
        [run] = app.runs.list(event_id=event_id)
        wait_for(lambda: app.runs.get(run.id).status == "sleeping", timeout=20, what="the first step")
        assert app.runs.get(run.id).steps[0].output == {"sent_to": "bob@example.com"}
    finally:
        app.stop()
        app.close()


def test_init_never_overwrites(tmp_path: Path) -> None:
    existing = tmp_path / "stepstone_app.py"
    existing.write_text("mine = True\n")
    result = init(tmp_path)
    assert result.returncode != 0 and "already exists" in result.stderr
    assert existing.read_text() == "mine = True\n"
    bad = init(tmp_path, "not-a-module.py")
    assert bad.returncode != 0 and "named like a module" in bad.stderr
    assert not (tmp_path / "not-a-module.py").exists()
