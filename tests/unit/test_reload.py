"""`stepstone dev` watches the app's Python files, not virtualenvs or caches."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stepstone.cli.reload import snapshot, watch_root


def test_snapshot_sees_source_files_and_skips_environments(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text("x = 1\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text("y = 1\n")
    for skipped in (".git", "__pycache__", "myenv"):
        (tmp_path / skipped).mkdir()
        (tmp_path / skipped / "noise.py").write_text("")
    (tmp_path / "myenv" / "pyvenv.cfg").write_text("home = /usr\n")
    (tmp_path / "notes.txt").write_text("not python")
    before = snapshot(tmp_path)
    assert sorted(Path(p).relative_to(tmp_path).as_posix() for p in before) == ["app.py", "pkg/mod.py"]
    (tmp_path / "pkg" / "mod.py").write_text("y = 22\n")
    assert snapshot(tmp_path) != before


def test_watch_root_finds_the_module_without_importing_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "shop").mkdir()
    (tmp_path / "shop" / "__init__.py").write_text("raise RuntimeError('imported!')\n")
    (tmp_path / "shop" / "jobs.py").write_text("")
    monkeypatch.chdir(tmp_path)
    assert watch_root("shop.jobs:app") == tmp_path / "shop"
    assert watch_root("missing_module:app") == Path(os.getcwd())


def test_the_reload_loop_ends_when_its_child_finds_the_port_taken(tmp_path: Path) -> None:
    """A child that exits with ``PORT_IN_USE`` (the port was taken after the
    parent checked it) ends the loop at once instead of waiting for a change."""
    import sys
    import time

    from stepstone.cli.ports import PORT_IN_USE
    from stepstone.cli.reload import Supervisor

    child = [sys.executable, "-c", f"raise SystemExit({PORT_IN_USE})"]
    started = time.monotonic()
    assert Supervisor(child, {}, tmp_path, interval=0.05).run() == PORT_IN_USE
    assert time.monotonic() - started < 10
